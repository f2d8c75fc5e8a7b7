"""vLLM-CPU colocate: after a GRPO step with a large learning rate, vLLM and the trainer agree on log-probs.

One real TRL GRPO step runs with ``use_vllm=True, vllm_mode="colocate"`` on the CPU (so the fix is on the
training path), then the trainer's and vLLM's log-probabilities of one fixed completion are compared:
stale before the sync, stale when the tied ``lm_head`` is not re-packed, close with the fix, and TRL's own
sync fails as the guide says. Starts a vLLM engine (~40 s on two cores).

Which of vLLM-CPU's two weight layouts the engine takes depends on the host (``cpu_weights_repacked``):
these tests assert the host's; ``tests/test_weight_sync_layouts.py`` forces each layout on any host.
"""

import gc

import pytest

from grpo_lab.upstream.vllm import cpu_weights_repacked, logprob_gap, reload_weights, vllm_runs_on_cpu

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_runs_on_cpu(), reason="needs the vllm-cpu build (CPU stack)"),
]

SYNCED_GAP = 0.1  # bf16 (vLLM-CPU) against fp32 (trainer): ~0.03 per token when in sync
STALE_GAP = 0.5  # no sync at all: measured ~10 after one step at lr 1e-2
HEAD_GAP = 0.2  # everything reloaded but the tied lm_head's packed copy: measured ~0.4
SCALED_SYNCED_GAP = 0.2  # in sync after every weight x1.5 (sharper logits, larger bf16 rounding): 0.101 on an AVX2 host


GROUP = 4
SAMPLED: list[list[str]] = []
"""The step's completions, as its reward saw them (the fixture checks that they could move the policy)."""


def alternating_reward(prompts, completions, **kwargs):
    """0, 1, 0, 1, ... whatever was sampled: every group has a spread, so no advantage is zero. That alone does not
    move the policy: a group whose completions are all the same text has a zero gradient (its advantages sum to zero),
    and a tiny model that answers alike gives such groups on some host's sampling kernels (an AMD EPYC AVX-512 host:
    stale gap 0.006, nothing had moved). The step therefore samples hot (``STEP_TEMPERATURE``) and the fixture checks
    that a group's completions differ."""
    SAMPLED.extend([str(c) for c in completions[i:i + GROUP]] for i in range(0, len(completions), GROUP))
    return [float(i % 2) for i in range(len(completions))]


STEP_TEMPERATURE = 2.0
"""Sampling temperature of the one step: hot enough that a group's completions differ on any host's kernels."""


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    from grpo_lab import evaluation
    from grpo_lab.data import load_split
    from grpo_lab.train import TrainConfig, prepare

    config = TrainConfig(profile="tiny", output_dir=str(tmp_path_factory.mktemp("run") / "colocate"), max_steps=1,
                         per_device_train_batch_size=4 * GROUP, num_generations=GROUP, learning_rate=1e-2,
                         temperature=STEP_TEMPERATURE, use_vllm=True,
                         vllm_gpu_memory_utilization=0.3, save_steps=100, live_plot=False, train_size=16)
    training = prepare(config, reward_funcs=[alternating_reward])
    start = {n: p.detach().clone() for n, p in training.trainer.model.named_parameters()}
    engine = training.rollout_engine()  # the trainer's engine, lent before training (notebook 03's base evaluation)
    before = evaluation.evaluate(training.config.model, load_split("eval")[:2], num_samples=2, max_tokens=8,
                                 engine=engine)
    SAMPLED.clear()
    result = training.train()
    trainer = result.trainer
    print("the step's groups:", [len(set(group)) for group in SAMPLED], "distinct completions;", SAMPLED[0])
    assert any(len(set(group)) > 1 for group in SAMPLED), (
        f"every group of the step sampled one text {SAMPLED}: no gradient, nothing for the sync to carry")
    moved = max((p.detach() - start[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 1e-3, f"the step at lr 1e-2 left the weights where they were (largest change {moved:g})"
    tokenizer = trainer.processing_class
    row = load_split("eval")[0]
    prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(row["completion"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    yield result, prompt_ids, completion_ids, before
    del trainer, result
    gc.collect()


def loss_and_gradients(trainer, inputs):
    """The trainer's loss on ``inputs`` (dropout seeded) and every parameter's gradient from it."""
    import torch

    trainer.model.zero_grad()
    torch.manual_seed(0)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def gap(result, prompt_ids, completion_ids):
    trainer = result.trainer
    return logprob_gap(trainer.model, trainer.vllm_generation.engine, prompt_ids, completion_ids)


def test_colocate_step_runs_with_the_fix_installed(one_step):
    result, _, _, before = one_step
    assert result.global_step == 1
    # before training, the trainer's own engine evaluated the base model: no second engine, and training went on
    assert before.backend == "vllm" and before.engine_start_seconds < 1 and [len(s) for s in before.sampled_texts] == [2, 2]
    assert result.trainer.weight_sync_installed
    assert "vLLM colocate" in result.backend


def test_vllm_matches_the_trainer_only_with_the_fix(one_step):
    result, prompt_ids, completion_ids, _ = one_step
    generation = result.trainer.vllm_generation
    stale = gap(result, prompt_ids, completion_ids)  # vLLM still holds the weights from before the step
    reload_weights(generation.engine.llm, generation._named_weights(), repack_lm_head=False)
    head_not_repacked = gap(result, prompt_ids, completion_ids)
    generation.sync_weights()  # what TRL calls before the next rollout: the installed fix
    synced = gap(result, prompt_ids, completion_ids)
    print(f"max |logp gap|: stale {stale:.3f}, reload without lm_head repack {head_not_repacked:.3f}, "
          f"fixed {synced:.3f}")
    assert stale > STALE_GAP, "the large-lr step should have moved the policy far from vLLM's copy"
    assert synced < SYNCED_GAP
    if cpu_weights_repacked(generation.engine):  # an AVX-512 host: the head keeps its own packed copy
        assert head_not_repacked > max(HEAD_GAP, 5 * synced), "without re-packing the tied lm_head the logits stay stale"
    else:  # AVX2 alone: vLLM-CPU computes the head from the reloaded embedding itself, nothing to re-pack
        assert head_not_repacked < SYNCED_GAP


def test_the_trainers_engine_evaluates_with_the_trainers_weights(one_step):
    """TrainResult.rollout_engine(): evaluation after training borrows the colocated engine (no second engine, no
    second share of the device), synced to the trainer's weights first; stopping it leaves the trainer's engine."""
    import torch

    from grpo_lab import data, evaluation

    result, prompt_ids, completion_ids, _ = one_step
    with torch.no_grad():  # the trainer moves on: vLLM's copy is stale
        for parameter in result.trainer.model.parameters():
            parameter.mul_(1.5)
    assert gap(result, prompt_ids, completion_ids) > STALE_GAP
    engine = result.rollout_engine()
    assert gap(result, prompt_ids, completion_ids) < SCALED_SYNCED_GAP
    rows = data.load_split("eval")[:2]
    evaluated = evaluation.evaluate(result.final_model_dir, rows, num_samples=2, max_tokens=8, engine=engine)
    assert evaluated.backend == "vllm" and [len(s) for s in evaluated.sampled_texts] == [2, 2] and engine.stopped
    assert gap(result, prompt_ids, completion_ids) < SCALED_SYNCED_GAP  # the trainer's engine still runs


def test_without_the_correction_vllm_samples_no_log_probs_and_the_loss_never_read_them(one_step, monkeypatch):
    """grpo_lab.upstream.trainer.reads_sampling_logprobs: with vLLM's importance-sampling correction off, TRL still
    asks the engine for every sampled token's log-prob and throws it away. grpo_lab's trainer asks for none: the
    engine samples without, the batch has no ``sampling_per_token_logps`` (as with HF generate), and the loss and
    every gradient of a batch that has them equal those of the same batch without them."""
    import torch

    from grpo_lab.upstream.trainer import reads_sampling_logprobs

    result, _, _, _ = one_step
    trainer = result.trainer
    monkeypatch.setattr(trainer.args, "vllm_importance_sampling_correction", False)
    monkeypatch.setattr(trainer, "vllm_importance_sampling_correction", False)
    assert trainer.sampling_logprobs and not reads_sampling_logprobs(trainer.args)
    llm, asked = trainer.vllm_generation.engine.llm, []
    generate = llm.generate
    monkeypatch.setattr(llm, "generate", lambda prompts, params, **kwargs: asked.append(params.logprobs)
                        or generate(prompts, params, **kwargs))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [trainer.train_dataset[i] for i in range(2) for _ in range(4)]
    with_logprobs = trainer._generate_and_score_completions(rows)
    monkeypatch.setattr(trainer, "sampling_logprobs", False)
    without = trainer._generate_and_score_completions(rows)
    assert asked == [0, None]
    assert trainer.vllm_generation.logprobs == 0  # TRL's own request is unchanged
    assert "sampling_per_token_logps" in with_logprobs and "sampling_per_token_logps" not in without
    assert without["completion_ids"].shape[0] == 8 and without["completion_mask"].sum() > 0

    try:
        loss, gradients = loss_and_gradients(trainer, with_logprobs)
        stripped = {k: v for k, v in with_logprobs.items() if k != "sampling_per_token_logps"}
        same_loss, same_gradients = loss_and_gradients(trainer, stripped)
        loss_and_gradients(trainer, without)  # a batch sampled without them trains
    finally:
        trainer.model.zero_grad()
    torch.testing.assert_close(same_loss, loss, rtol=0, atol=0)
    assert gradients.keys() == same_gradients.keys() and gradients
    for name, gradient in gradients.items():
        torch.testing.assert_close(same_gradients[name], gradient, rtol=0, atol=0, msg=name)


def test_trl_stock_sync_fails_on_vllm_cpu(one_step):
    """Why the layer exists (runs last: the failed load leaves the engine half-updated)."""
    from trl.generation.vllm_generation import VLLMGeneration

    result, prompt_ids, completion_ids, _ = one_step
    generation = result.trainer.vllm_generation
    if not cpu_weights_repacked(generation.engine):
        pytest.skip("this host's vLLM-CPU keeps the loaded Linear weights (AVX2 alone): TRL's own sync works here")
    with pytest.raises(AttributeError, match="weight_loader"):
        VLLMGeneration.sync_weights(generation._generation)


def test_release_shuts_the_colocated_engine_down_and_drops_the_models(one_step):
    """Notebook 03 hands the device back before its next seed trains in another process (runs last)."""
    result, _, _, _ = one_step
    trainer = result.trainer
    engine = trainer.vllm_generation.engine
    weight = next(trainer.model.parameters())
    result.release()
    assert engine.llm is None and trainer.vllm_generation._generation.llm is None
    assert trainer.vllm_generation._generation.model is None and weight.numel() == 0
    assert trainer.model is None and trainer.optimizer is None and result.trainer is None
    assert result.rollout_engine() is None
