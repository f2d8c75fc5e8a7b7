"""grpo_lab.train: configuration, input checks, checkpoints and resume, and that GRPO raises the reward.

Training runs use the shipped tiny model with HF generate on the CPU (the vLLM colocate path is in
tests/test_weight_sync.py).
"""

import json
import math

import pytest

from grpo_lab import experiment, runs
from grpo_lab import train as T
from grpo_lab.data import load_split, write_jsonl
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, TrainingDivergedError
from grpo_lab.rewards import prepare

CPU = Machine("cpu", bf16=True, memory_gib=24)
SMALL = dict(profile="tiny", per_device_train_batch_size=8, num_generations=4, live_plot=False, save_steps=100)


# --------------------------------------------------------------------------------------------------
# Configuration and CLI
# --------------------------------------------------------------------------------------------------
def test_resolved_config_takes_sizes_from_the_profile_and_keeps_overrides(tmp_path):
    config = T.TrainConfig(profile="tiny", output_dir=str(tmp_path / "run"), learning_rate=1e-4).resolve(CPU)
    assert config.num_generations == 8 and config.per_device_train_batch_size == 32
    assert config.learning_rate == 1e-4
    assert config.beta == 0.0 and config.use_vllm is False and config.bf16 is False
    assert config.num_prompts_per_step == 4
    args = experiment.plan(config, CPU).grpo_config(use_vllm=False)
    assert (args.num_generations, args.max_completion_length, args.loss_type) == (8, 32, config.loss_type)
    assert args.output_dir.endswith("checkpoints")


def test_colocated_engine_settings_are_those_trl_starts_its_engine_with():
    import inspect

    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    llm_call = inspect.getsource(VLLMGeneration._init_vllm)
    assert f"max_num_batched_tokens={T.TRL_COLOCATED_ENGINE['max_num_batched_tokens']}," in llm_call
    assert "model_impl=self.model_impl" in llm_call and "max_model_len=self.max_model_length" in llm_call
    assert "model_impl=args.vllm_model_impl" in inspect.getsource(GRPOTrainer.__init__)
    assert GRPOConfig(output_dir="unused", use_cpu=True).vllm_model_impl == T.TRL_COLOCATED_ENGINE["model_impl"]
    gpu = T.TrainConfig(profile="gpu", output_dir="unused").resolve(Machine("cuda", bf16=True, memory_gib=24))
    settings = T.colocated_engine_settings(gpu)
    assert {name: value for name, value in settings.items() if name != "reasons"} == {
        "max_model_len": gpu.max_model_len, "max_num_seqs": gpu.generation_batch_size,
        "vllm_options": {"max_num_batched_tokens": 4096, "model_impl": "vllm"}}
    assert set(settings["reasons"]) == {"max_model_len", "max_num_seqs", "vllm_options"}
    assert T.colocated_engine_settings(T.TrainConfig(profile="tiny", output_dir="unused").resolve(CPU)) == {}


def test_an_engine_opened_with_the_colocated_settings_compiles_the_trainers_graph():
    """vLLM's compile-cache key (VllmConfig.compute_hash) of our engine with the settings equals that of TRL's
    colocated call for the same experiment (its arguments as TRL 1.16 writes them), on a GPU's defaults (bf16, compiled graphs: vLLM-CPU's float32 and eager mode are other
    keys, and on the CPU the trainer samples with HF generate anyway); without the settings it differs."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    from grpo_lab import device
    from grpo_lab.paths import TINY_MODEL_DIR
    from grpo_lab.rollout import RolloutConfig
    from grpo_lab.rollout.vllm_backend import engine_arguments

    model = str(TINY_MODEL_DIR)
    config = T.TrainConfig(profile="tiny", model=model, output_dir="unused", use_vllm=True).resolve(CPU)
    settings = T.colocated_engine_settings(config)
    trl_call = dict(model=model, tensor_parallel_size=1, gpu_memory_utilization=0.3, max_model_len=config.max_model_len,
                    max_num_seqs=config.generation_batch_size, enable_sleep_mode=False, model_impl="vllm",
                    distributed_executor_backend="external_launcher", seed=0, max_num_batched_tokens=4096,
                    logprobs_mode="processed_logprobs", quantization=None, trust_remote_code=False)

    def key(arguments):
        return EngineArgs(**arguments).create_engine_config().compute_hash()

    def ours(**fields):
        gpu_defaults = dict(dtype="bfloat16", enforce_eager=device.VLLM_EAGER_BY_DEFAULT["cuda"])  # a bf16 GPU's
        rollout = RolloutConfig(n=4, max_tokens=config.max_completion_length, **gpu_defaults, **fields).resolve(
            "cpu", longest_prompt_tokens=config.max_prompt_length)
        arguments = engine_arguments(rollout, model)
        arguments.pop("use_tqdm_on_load")
        return arguments

    assert key(ours(**settings)) == key(trl_call)
    assert key(ours()) != key(trl_call)


def test_gpu_profile_follows_the_recipe_that_learned_on_smollm2():
    config = T.TrainConfig(profile="gpu", output_dir="unused").resolve(Machine("cuda", bf16=True, memory_gib=80))
    assert config.learning_rate == 2e-5 and config.beta > 0 and config.warmup_steps > 0 and config.use_vllm
    assert (config.temperature, config.reward_weights, config.generation_batch_size) == (0.7, (1.0, 0.2), 128)


def test_cli_options_mirror_the_config_fields():
    args = T.build_parser().parse_args(["--max-steps", "3", "--train-types", "average,work_rate",
                                        "--use-vllm", "false", "--learning-rate", "1e-4",
                                        "--resume-from-checkpoint", "true"])
    assert args.max_steps == 3 and args.train_types == ("average", "work_rate")
    assert args.use_vllm is False and args.learning_rate == 1e-4 and args.resume_from_checkpoint is True


def test_the_trainer_is_one_subclass_of_trls():
    from trl import GRPOTrainer

    from grpo_lab.upstream.trainer import GRPOLabTrainer

    assert GRPOLabTrainer.__mro__[1] is GRPOTrainer
    assert T.MetricsLogger.__module__ == "grpo_lab.callbacks" and T.StepClock and T.TimeBudget  # train's, as before


@pytest.mark.parametrize("changes, read", [
    ({}, True),  # TRL's default: the importance-sampling correction reads them
    ({"vllm_importance_sampling_correction": False}, False),
    ({"vllm_importance_sampling_correction": False, "off_policy_mask_threshold": 0.5}, True),
    ({"vllm_importance_sampling_correction": False, "loss_type": "vespo"}, True),
    ({"vllm_importance_sampling_correction": False, "use_vllm": False}, True),  # HF generate: not vLLM's to skip
])
def test_vllm_samples_without_log_probs_only_where_nothing_reads_them(tmp_path, changes, read):
    from trl import GRPOConfig

    from grpo_lab.upstream.trainer import reads_sampling_logprobs

    args = GRPOConfig(**{"output_dir": str(tmp_path), "use_vllm": True, "per_device_train_batch_size": 8,
                         "num_generations": 4, "use_cpu": True, "report_to": "none", **changes})
    assert reads_sampling_logprobs(args) is read
    assert reads_sampling_logprobs(args, tools=True) is True  # TRL's tool loop extends them


def test_the_correction_switch_reaches_trl(tmp_path):
    config = T.TrainConfig(profile="tiny", output_dir=str(tmp_path / "run"),
                           vllm_importance_sampling_correction=False).resolve(CPU)
    assert experiment.plan(config, CPU).grpo_config(use_vllm=True).vllm_importance_sampling_correction is False
    default = T.TrainConfig(profile="tiny", output_dir=str(tmp_path / "r"))
    assert experiment.plan(default, CPU).grpo_config(use_vllm=True).vllm_importance_sampling_correction is True
    assert "vllm_importance_sampling_correction" in config.describe()


# --------------------------------------------------------------------------------------------------
# Bad input: a clear message before anything runs
# --------------------------------------------------------------------------------------------------
def test_trls_colocated_engine_starts_in_the_environment_of_the_courses_other_engines(tmp_path, monkeypatch):
    """TRL builds its colocated engine inside the trainer's constructor: it must compile into the same cache folder
    as the course's own engines and servers, so that a later start finds what an earlier one cached."""
    import os

    import grpo_lab.upstream.trainer
    from grpo_lab.rollout.vllm_backend import engine_environment

    pytest.importorskip("vllm")
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    seen = {}

    class Built(Exception):
        pass

    class RecordingTrainer:  # stands in for GRPOLabTrainer: notes the environment its engine would start in
        def __init__(self, **kwargs):
            seen.update(root=os.environ.get("VLLM_CACHE_ROOT"), use_vllm=kwargs["args"].use_vllm,
                        adapter_sync=kwargs["adapter_sync"])
            raise Built

    monkeypatch.setattr(grpo_lab.upstream.trainer, "GRPOLabTrainer", RecordingTrainer)
    config = T.TrainConfig(**SMALL, use_vllm=True, output_dir=str(tmp_path / "run")).resolve(CPU)
    with pytest.raises(Built):
        T.build_trainer(experiment.plan(config, CPU))
    assert seen == {"root": engine_environment("cpu")["VLLM_CACHE_ROOT"], "use_vllm": True, "adapter_sync": None}
    # on CUDA every engine (ours, TRL's colocated one, a server) starts vLLM's V1 model runner unless the user chose
    assert engine_environment("cuda")["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert "VLLM_CACHE_ROOT" not in os.environ, "the variable is set only while the engine starts"


def test_trls_colocated_engine_starts_quiet_with_grpo_lab_arguments_and_comes_back_wrapped(monkeypatch):
    """While TRL builds the trainer, its colocated LLM(...) call starts without progress bars in a notebook and, for
    adapter sync, with vLLM's LoRA support; TRL gets the engine wrapped, and its LLM comes back after."""
    from trl.generation import vllm_generation

    from grpo_lab import env
    from grpo_lab.upstream.trainer import _colocated_engine
    from grpo_lab.upstream.vllm import Engine

    calls = []
    original = lambda **kwargs: calls.append(kwargs) or "llm"  # noqa: E731  (stands in for vllm.LLM)
    monkeypatch.setattr(vllm_generation, "LLM", original, raising=False)
    monkeypatch.setattr(env, "show_progress", lambda: False)
    with _colocated_engine(None) as started:
        engine = vllm_generation.LLM(model="m", max_num_seqs=128)
    with _colocated_engine(16):
        vllm_generation.LLM(model="m", max_num_seqs=128)
    assert isinstance(engine, Engine) and started == [engine] and engine.llm == "llm"
    assert calls[0] == {"model": "m", "max_num_seqs": 128, "use_tqdm_on_load": False}
    assert calls[1] == {**calls[0], "enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert vllm_generation.LLM is original


def test_num_generations_must_divide_the_batch():
    with pytest.raises(ValueError, match=r"num_generations=3 does not divide.*8"):
        T.TrainConfig(**{**SMALL, "num_generations": 3}, output_dir="unused")


def test_completion_length_beyond_max_model_len():
    config = T.TrainConfig(profile="tiny", output_dir="unused", max_completion_length=600).resolve(CPU)
    with pytest.raises(ValueError, match="exceeds the model's max_model_len"):
        experiment.check_lengths(config, max_model_len=512)


def test_dataset_without_prompt_or_answer(tmp_path):
    rows = load_split("eval")[:3]
    no_answer = [{k: v for k, v in row.items() if k != "answer"} for row in rows]
    rewards = prepare(["correctness"]).funcs
    with pytest.raises(ValueError, match="no 'answer' column"):
        T.check_dataset(no_answer, rewards)
    path = write_jsonl([{k: v for k, v in row.items() if k != "prompt"} for row in rows], tmp_path / "bad.jsonl")
    config = T.TrainConfig(**SMALL, output_dir=str(tmp_path / "run"), dataset=str(path), max_steps=1)
    with pytest.raises(ValueError, match="missing column"):
        T.train(config)


def test_resume_from_missing_or_partial_checkpoint(tmp_path):
    with pytest.raises(runs.CheckpointError, match="holds no checkpoint"):
        runs.resolve_resume(tmp_path, True)
    with pytest.raises(runs.CheckpointError, match="no checkpoint at"):
        runs.resolve_resume(tmp_path, str(tmp_path / "checkpoints" / "checkpoint-7"))
    partial = tmp_path / "checkpoints" / "checkpoint-2"
    partial.mkdir(parents=True)
    (partial / "trainer_state.json").write_text("{}")
    with pytest.raises(runs.CheckpointError, match="incomplete.*optimizer.pt"):
        runs.resolve_resume(tmp_path, True)


def test_nan_loss_stops_with_advice(tmp_path):
    logger = T.MetricsLogger(tmp_path, live_plot=False)

    class State:
        global_step = 5

    with pytest.raises(TrainingDivergedError, match="bf16.*inf"):
        logger.on_log(None, State(), None, logs={"loss": math.nan, "reward": 0.5})
    assert json.loads((tmp_path / runs.METRICS_FILE).read_text().splitlines()[-1])["step"] == 5  # recorded, then stop


def test_infinite_reward_stops_before_the_update(tmp_path):
    def broken_reward(prompts, completions, **kwargs):
        return [math.inf] * len(completions)

    config = T.TrainConfig(**SMALL, output_dir=str(tmp_path / "run"), max_steps=2, train_size=8)
    with pytest.raises(TrainingDivergedError, match="broken_reward.*inf"):
        T.train(config, reward_funcs=[broken_reward])
    assert not runs.list_checkpoints(tmp_path / "run")


# --------------------------------------------------------------------------------------------------
# Checkpoints and resume
# --------------------------------------------------------------------------------------------------
def test_checkpoints_and_resume_reach_the_same_final_step(tmp_path):
    run = tmp_path / "run"
    config = T.TrainConfig(**{**SMALL, "save_steps": 2}, output_dir=str(run), max_steps=4, train_size=32)
    first = T.train(config)
    assert first.global_step == 4
    assert [p.name for p in runs.list_checkpoints(run)] == ["checkpoint-2", "checkpoint-4"]
    assert (run / "checkpoints" / "checkpoint-2" / "model.safetensors").is_file()
    assert (run / runs.FINAL / "model.safetensors").is_file() and (run / runs.CURVES_FILE).is_file()
    with pytest.raises(FileExistsError, match="already holds a run"):
        T.train(config)

    resumed = T.train(T.TrainConfig(**{**SMALL, "save_steps": 2}, output_dir=str(run), max_steps=4, train_size=32,
                                    resume_from_checkpoint=str(run / "checkpoints" / "checkpoint-2")))
    assert resumed.global_step == 4
    assert [r["step"] for r in runs.read_metrics(run)] == [1, 2, 3, 4]
    assert json.loads((run / runs.CONFIG_FILE).read_text())["resumed_from"].endswith("checkpoint-2")


def test_what_runs_between_prepare_and_train_does_not_change_the_run(tmp_path):
    """Notebook 03 evaluates the base model between prepare() and train() (on the trainer's engine, or its own HF
    copy on the CPU), and sampling draws random numbers: train() starts from the generators' state at prepare(), so
    the run is the one train(config) gives — the same rewards, losses and final weights."""
    from grpo_lab import evaluation
    from grpo_lab.models import weights_digest

    def run(name, evaluate_first):
        config = T.TrainConfig(**SMALL, output_dir=str(tmp_path / name), max_steps=2, train_size=16)
        if not evaluate_first:
            return T.train(config)
        training = T.prepare(config)
        evaluation.evaluate(training.config.model, load_split("eval")[:4], num_samples=2, max_tokens=16,
                            backend="hf", engine=training.rollout_engine())
        return training.train()

    plain, evaluated_first = run("plain", False), run("evaluated-first", True)
    keys = ("reward", "loss", "completions/mean_length")
    assert [[m[k] for k in keys] for m in plain.metrics] == [[m[k] for k in keys] for m in evaluated_first.metrics]
    assert weights_digest(plain.final_model_dir) == weights_digest(evaluated_first.final_model_dir)


def test_a_run_trains_again_with_another_seed_in_a_process_of_its_own(tmp_path, capsys):
    """Notebook 03's spread: the same experiment, another seed, in a child process (``grpo-lab train --config RUN
    --seed S --evaluate N``), its held-out evaluation saved and read back; the first run's trainer released first."""
    from grpo_lab import evaluation

    first = T.train(T.TrainConfig(**SMALL, output_dir=str(tmp_path / "run"), max_steps=2, train_size=16, seed=0))
    trainer = first.trainer
    weight, optimizer, handler = next(trainer.model.parameters()), trainer.optimizer, trainer.callback_handler
    assert weight.numel() > 0 and len(optimizer.state) > 0
    # the tensors go even where something still holds the module (here this test; on vLLM 0.31, a kept traceback)
    first.release()
    assert weight.numel() == 0 and weight.grad is None and len(optimizer.state) == 0
    assert handler.model is None and handler.optimizer is None and handler.lr_scheduler is None
    assert first.trainer is None and first.rollout_engine() is None
    del trainer, weight, optimizer, handler
    folder = first.train_again(1, evaluate=4)
    assert folder == first.run_dir / runs.SEEDS / "seed-1" and runs.is_run(folder)
    again = json.loads((folder / runs.CONFIG_FILE).read_text())["config"]
    assert again["seed"] == 1 and again["max_steps"] == 2 and again["output_dir"] == str(folder)
    shown = capsys.readouterr().out
    assert "--config" in shown and "done: 2 steps" in shown and "evaluated 4 held-out problems" in shown
    after = evaluation.Evaluation.load(folder)
    assert after.report.count == 4 and len(after.greedy_texts) == 4 and len(after.sampled_texts[0]) == 8
    with pytest.raises(Exception, match="failed"):  # a child that fails says so, with the end of its log
        first.train_again(2, evaluate=-1)


def test_evaluations_and_seed_spreads_say_what_they_hold(tmp_path):
    from grpo_lab import evaluation

    report = evaluation.AccuracyReport(0.5, 0.5, 1.0, 2, 1.0, 2, {"all": {"count": 2, "greedy": 0.5}})
    saved = evaluation.Evaluation("m", report, ["a", "b"], 1.0, "hf", [["a", "c"], ["b", "d"]]).save(tmp_path / "e.json")
    assert evaluation.Evaluation.load(saved).report == report
    with pytest.raises(ConfigError, match="--evaluate"):
        evaluation.Evaluation.load(tmp_path / "missing.json")
    up = evaluation.Gain("accuracy", 0.1, 0.3, 100, 22, 2)
    flat = evaluation.Gain("accuracy", 0.1, 0.12, 100, 4, 2)
    both = evaluation.SeedSpread({0: up, 1: flat})
    assert both.min_standard_errors == flat.standard_errors
    assert "up by two standard errors in 1 of 2" in both.lines()[-1] and "18.0 points apart" in both.lines()[-1]
    assert "not measured" in evaluation.SeedSpread({0: up}).lines()[-1]
    with pytest.raises(ConfigError):
        evaluation.SeedSpread({})


# GRPO learns (the training reward rises on the types with a deliberate slip): notebook 03's last cell asserts it on its
# own run in `make test` (250 tiny steps: the training reward and pass@1 on the trained types rise, checked from 100
# steps on), so no separate 60-step run here.
