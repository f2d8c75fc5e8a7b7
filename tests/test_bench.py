"""The benchmark: roofline arithmetic, alternation and medians, the results schema, and small real runs.

Fast except two end-to-end runs: HF generate plus a one-step GRPO trainer (~20 s), and the only vLLM engine
these tests start (~40 s on two cores), which checks fixed lengths, drawn lengths and prefix isolation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_lab import bench
from grpo_lab.bench import DeviceRates, ModelCost, roofline
from grpo_lab.bench.grpo_step import _step_summary
from grpo_lab.errors import DataError
from grpo_lab.paths import RESULTS_DIR
from grpo_lab.rollout import RolloutConfig, Sampling, load_tokenizer
from grpo_lab.rollout.engine import check_completion_lengths

REPO = Path(__file__).resolve().parent.parent
COMMITTED_CPU = REPO / "benchmarks" / "results" / "cpu" / "bench_tiny.json"
TOY = ModelCost(params=1000, embedding_params=100, tied_embeddings=True, bytes_per_param=2, layers=1,
                attention_width=4, kv_bytes_per_token=8)
SLOW_DEVICE = DeviceRates(kind="cpu", name="toy", dtype="bfloat16", bandwidth_bytes_per_s=1000.0,
                          matmul_flops_per_s=10_000.0)


# ---- roofline -------------------------------------------------------------------------------------------
def test_roofline_adds_prefill_and_decode_steps_by_hand():
    # prompt of 2 tokens, one completion of 3: the prefill makes token 1, two decode steps make tokens 2 and 3
    result = roofline(TOY, SLOW_DEVICE, [2], [[3]])
    prefill_bytes = 1000 * 2 + 8 * 2                       # weights once + KV of the prompt
    prefill_flops = 2 * 900 * 2 + 4 * 1 * 4 * (1 + 2)      # non-embedding weights x tokens + causal attention
    step_bytes = [2000 + 8 * 3, 2000 + 8 * 4]             # weights + KV of the context (3, then 4 tokens)
    step_flops = [2 * 1000 + 16 * 3, 2 * 1000 + 16 * 4]   # tied output layer counts as a matmul
    assert result.decode_steps == 2 and result.new_tokens == 3
    assert result.prefill_s == pytest.approx(max(prefill_bytes / 1000, prefill_flops / 10_000))
    assert result.decode_s == pytest.approx(sum(b / 1000 for b in step_bytes))
    assert result.seconds == pytest.approx(6.072)
    assert result.memory_s == pytest.approx(6.072)
    assert result.compute_s == pytest.approx((prefill_flops + sum(step_flops)) / 10_000)
    assert result.bound == "memory"
    assert result.tokens_per_s == pytest.approx(3 / 6.072)


def test_roofline_is_compute_bound_when_matmuls_are_slow_and_only_live_sequences_cost():
    slow_math = DeviceRates(kind="cpu", name="toy", dtype="bfloat16", bandwidth_bytes_per_s=1e12,
                            matmul_flops_per_s=1e6)
    both = roofline(TOY, slow_math, [2, 2], [[3, 1], [2, 2]])
    assert both.bound == "compute" and both.decode_steps == 2 and both.new_tokens == 8
    # step 0: three sequences still running (lengths 3, 2, 2), step 1: one (length 3)
    expected_decode = ((2 * 1000 * 3 + 16 * (3 + 3 + 3)) + (2 * 1000 * 1 + 16 * 4)) / 1e6
    assert both.decode_s == pytest.approx(expected_decode, rel=1e-6)
    with pytest.raises(ValueError, match="2 prompt lengths but completion lengths for 1"):
        roofline(TOY, slow_math, [2, 2], [[3]])


def test_model_cost_counts_the_real_qwen_shapes_and_the_tiny_model():
    from transformers import Qwen2Config

    from grpo_lab.models import load_model_and_tokenizer, resolve_model
    from grpo_lab.rollout.compare import SHAPES

    half = bench.model_cost(Qwen2Config(**SHAPES["qwen2.5-0.5b"]), "bfloat16")
    assert half.params == 494_032_768 and half.tied_embeddings  # Qwen2.5-0.5B's published count
    assert half.param_bytes == 2 * 494_032_768
    assert half.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2      # K and V x layers x kv heads x head dim x bf16
    one_and_half = bench.model_cost(Qwen2Config(**SHAPES["qwen2.5-1.5b"]), "bfloat16")
    assert one_and_half.params == 1_543_714_304
    tiny = bench.model_cost(resolve_model(), "float32")
    model, _ = load_model_and_tokenizer(resolve_model(), dtype="float32")
    assert tiny.params == sum(p.numel() for p in model.parameters()) and tiny.bytes_per_param == 4


def test_measure_device_reports_positive_rates():
    rates = bench.measure_device("cpu", "float32", copy_bytes=8 * 2**20, gemm_size=128, repeats=2)
    assert rates.bandwidth_bytes_per_s > 1e8 and rates.matmul_flops_per_s > 1e8
    assert "GB/s" in rates.describe()


# ---- timing logic ---------------------------------------------------------------------------------------
def test_median_and_alternating_orders():
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    orders = bench.alternating_orders(("hf", "vllm", "vllm+prefix"), 4)
    assert orders == [["hf", "vllm", "vllm+prefix"], ["vllm", "vllm+prefix", "hf"],
                      ["vllm+prefix", "hf", "vllm"], ["hf", "vllm", "vllm+prefix"]]
    assert {order[0] for order in orders[:3]} == {"hf", "vllm", "vllm+prefix"}  # each config leads once


def test_measurement_takes_the_median_of_tokens_per_second():
    class Result:
        def __init__(self, seconds, tokens):
            self.generate_s, self.new_tokens, self.outputs = seconds, tokens, []

    m = bench.Measurement()
    for seconds, tokens in ((2.0, 100), (1.0, 100), (4.0, 100)):
        m.times_s.append(seconds)
        m.new_tokens.append(tokens)
    assert m.median_s == 2.0 and m.tokens_per_s == 50.0


def test_draw_lengths_are_seeded_and_in_range():
    lengths = bench.draw_lengths(64, 4, 256)
    assert lengths == bench.draw_lengths(64, 4, 256)
    flat = [v for row in lengths for v in row]
    assert min(flat) >= 16 and max(flat) <= 256 and len(set(flat)) > 50


def test_seed_workload_prompts_are_about_the_target_length():
    from grpo_lab.models import resolve_model
    from grpo_lab.rollout import encode_prompts

    tokenizer = load_tokenizer(resolve_model())
    rows = bench.seed_workload(tokenizer, 12, 128)
    lengths = [len(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows])]
    assert all(120 <= n <= 130 for n in lengths), lengths
    assert len({r["prompt"][0]["content"] for r in rows}) == 12 and all(r["answer"] for r in rows)


def test_step_memory_plans_one_trainer_of_the_bench_step_as_it_runs():
    """bench.step_memory: the seed step as the bench trains it (bf16, no checkpointing, a reference model) in the memory
    planner; micro-batches of 128 need a device of an H200's size, 32 fit on 80 GiB."""
    profiles = {mb: bench.get_bench_profile("seed", per_device_train_batch_size=mb) for mb in (32, 128)}
    on_80 = {mb: bench.step_memory(p, "qwen2.5-0.5b", 80, 0.25) for mb, p in profiles.items()}
    on_141 = bench.step_memory(profiles[128], "qwen2.5-0.5b", 141, 0.25)
    assert on_80[32].fits and not on_80[128].fits and on_141.fits
    assert on_80[128].training_peak_bytes > 2.5 * on_80[32].training_peak_bytes
    shape = on_80[32].shape
    assert (shape.per_device_train_batch_size, shape.steps_per_generation, shape.num_generations) == (32, 16, 4)
    assert not shape.gradient_checkpointing and shape.beta > 0 and shape.max_completion_length == 256


def test_committed_low_end_runs_carry_each_runs_settings_and_the_targets_verdict():
    """bench.committed_low_end_runs: one row per run the low-end targets read, with the micro-batch and correction the
    file records and the same verdict as the targets table."""
    rows = bench.committed_low_end_runs()
    assert len(rows) == sum(len(keys) for _, _, keys in bench.LOW_END_TARGETS)
    table = {t["target"]: t["verdict"] for t in bench.committed_grpo_step_targets()}
    for what, threshold, _ in bench.LOW_END_TARGETS:
        for row in (r for r in rows if r["low end needed"] == f"{threshold:.1f}x"):
            assert f"{row['file']}: {row['verdict']}" in table[what]
    by_file = {r["file"].removeprefix("grpo_step_seed_qwen2.5-0.5b_").removesuffix(".json"): r for r in rows}
    assert (by_file["fixed_mb128_4"]["micro-batch"], by_file["fixed_mb128_4"]["correction"]) == (128, "on")
    assert (by_file["ragged_nocorrection"]["micro-batch"], by_file["ragged_nocorrection"]["correction"]) == (32, "off")
    assert by_file["fixed_interleaved_1"]["correction"] == "on"  # predates the setting: TRL's default


def test_bad_profile_and_lengths_and_engine_options_are_refused():
    with pytest.raises(ValueError, match="unknown bench profile"):
        bench.get_bench_profile("huge")
    with pytest.raises(ValueError, match="repeats=0"):
        bench.get_bench_profile("tiny", repeats=0)
    sampling = Sampling(n=2, max_tokens=8)
    assert check_completion_lengths([[1, 8]], 1, sampling) == ((1, 8),)
    with pytest.raises(ValueError, match=r"lengths\[0\]=\[1, 9\]"):
        check_completion_lengths([[1, 9]], 1, sampling)
    with pytest.raises(ValueError, match="one row per prompt"):
        check_completion_lengths([[1, 2]], 2, sampling)
    with pytest.raises(ValueError, match="min_tokens=9"):
        Sampling(max_tokens=8, min_tokens=9)
    with pytest.raises(ValueError, match="vllm_options sets \\['enable_prefix_caching'\\]"):
        RolloutConfig(vllm_options={"enable_prefix_caching": False})
    assert bench.key_value("async_scheduling=true") == ("async_scheduling", True)
    assert bench.key_value("cache_implementation=static") == ("cache_implementation", "static")


def test_step_split_and_bottleneck():
    profile = bench.get_bench_profile("tiny", grpo_warmup_steps=1)
    records = [{"timing/generation_s": 9.0, "timing/reward_s": 0.5, "completions/mean_length": 10.0},
               {"timing/generation_s": 3.0, "timing/reward_s": 0.5, "completions/mean_length": 32.0},
               {"timing/generation_s": 4.0, "timing/reward_s": 0.5, "completions/mean_length": 32.0}]
    step = _step_summary([20.0, 5.0, 6.0], records, profile, "HF generate")
    assert step["step_s"] == [5.0, 6.0] and step["update_s"] == [1.5, 1.5]
    assert step["spread"]["step_s"] == {"min": 5.0, "median": 5.5, "max": 6.0}
    assert step["median"] == {"step_s": 5.5, "generation_s": 3.5, "reward_s": 0.5, "update_s": 1.5,
                              "backward_optimizer_s": 1.5, "mean_completion_tokens": 32.0}  # no old/ref forwards
    verdict = bench.bottleneck({**step, "completions_per_step": 64})
    assert verdict["generation_tokens_per_s"] == pytest.approx(64 * 32 / 3.5)
    assert verdict["training_samples_per_s"] == pytest.approx(64 / 1.5)
    assert verdict["verdict"] == "generation-bound"


# ---- results schema ---------------------------------------------------------------------------------------
def _minimal_results() -> dict:
    return {"schema": bench.SCHEMA, "created": "now", "command": "", "profile": {}, "parts": ["rollout"],
            "model": {"path": "m", "weights": "real", "dtype": "float32", "params": 1}, "environment": {},
            "load_average": {}, "notes": [],
            "rollout": {"workload": {}, "method": "", "configs": {}, "settings": {}, "load_s": {},
                        "variants": {"fixed": {"lengths": "", "sampling": {}, "speedup_vs_hf": {},
                                               "configs": {"hf": {"times_s": [1.0], "median_s": 1.0,
                                                                  "new_tokens": [8], "tokens_per_s": 8.0}}}}},
            "grpo_step": {"skipped": "not in --parts"}}


def test_check_results_names_every_missing_key():
    results = _minimal_results()
    assert bench.check_results(results) is results
    del results["environment"]
    del results["rollout"]["variants"]["fixed"]["configs"]["hf"]["median_s"]
    with pytest.raises(ValueError, match=r"environment, .*rollout\.variants\.fixed\.configs\.hf\.median_s"):
        bench.check_results(results)


@pytest.mark.skipif(not COMMITTED_CPU.is_file(), reason="no committed CPU results yet")
def test_the_committed_cpu_results_follow_the_schema():
    results = bench.load_results(COMMITTED_CPU)
    assert results["model"]["weights"] == "real"
    assert set(results["rollout"]["variants"]) == {"fixed", "ragged"}
    assert "CPU timings are noisy" in " ".join(results["notes"])


# ---- small real runs --------------------------------------------------------------------------------------
def test_hf_end_to_end_with_a_grpo_step_writes_json_and_plot(tmp_path):
    profile = bench.get_bench_profile("tiny", num_prompts=4, num_generations=2, prompt_tokens=48,
                                      max_completion_length=8, warmup=0, repeats=2, grpo_steps=1,
                                      grpo_warmup_steps=0, per_device_train_batch_size=4)
    results = bench.run_bench(profile, configs=("hf",), grpo_backends=("hf",), progress=False)
    variants = results["rollout"]["variants"]
    fixed, ragged = variants["fixed"]["configs"]["hf"], variants["ragged"]["configs"]["hf"]
    assert fixed["new_tokens"] == [8 * 8, 8 * 8] and fixed["mean_completion_tokens"] == 8.0
    drawn = sum(map(sum, bench.draw_lengths(4, 2, 8)))
    assert ragged["new_tokens"] == [drawn, drawn]
    assert fixed["roofline"]["seconds"] > 0 and fixed["x_roofline_time"] > 1
    step = results["grpo_step"]["backends"]["hf"]
    assert len(step["step_s"]) == 1 and step["median"]["generation_s"] > 0
    # which of the trainer's exact speed-ups ran: no correction to defer without vLLM; the step's 8 completions in
    # micro-batches of 4, grouped by length
    assert step["settings"]["deferred_correction"] is False and step["settings"]["length_grouping"] is True
    # the host beside the step: CPU seconds of the process, garbage-collection pauses, no device allocator on a CPU
    assert step["host"]["host_cpu_s"][0] > 0 and step["host"]["gc_pause_s"][0] >= 0
    assert step["host"]["driver_allocations"] == [0]
    assert results["environment"]["device"]["kind"] == "cpu"
    json_path, png_path = bench.save_results(results, tmp_path, "bench_test")
    assert bench.load_results(json_path)["model"]["params"] == results["model"]["params"]
    assert png_path.stat().st_size > 10_000  # save_results drew plot_bench's figure
    text = bench.summary(results)
    assert "fixed" in text and "GRPO step" in text and "min..max" in text
    mfu = next(line for line in text.splitlines() if "MFU" in line)  # the tiny model's FLOPs in GFLOP, not "0 TFLOP"
    assert " 0 TFLOP" not in mfu and "GFLOP/s" in mfu, mfu
    assert "hf host per step (median): CPU" in text
    assert "vLLM colocate not measured" in " ".join(results["notes"])


def test_vllm_fixed_drawn_lengths_and_prefix_isolation_on_one_engine():
    profile = bench.get_bench_profile("tiny", num_prompts=4, num_generations=2, prompt_tokens=80,
                                      max_completion_length=8, warmup=0, repeats=1)
    results = bench.run_bench(profile, configs=("vllm", "vllm+prefix"), parts=("rollout",), progress=False)
    rollout = results["rollout"]
    assert rollout["load_s"]["vllm"] == rollout["load_s"]["vllm+prefix"]  # one engine served both configs
    assert "cache salt" in rollout["prefix_off"]
    drawn = sum(map(sum, bench.draw_lengths(4, 2, 8)))
    for name in ("vllm", "vllm+prefix"):
        assert rollout["variants"]["fixed"]["configs"][name]["new_tokens"] == [4 * 2 * 8]
        assert rollout["variants"]["ragged"]["configs"][name]["new_tokens"] == [drawn]
    assert rollout["settings"]["vllm+prefix"]["vllm_options"] == {"block_size": 32}
    assert json.loads(json.dumps(results, default=str))["schema"] == bench.SCHEMA


def test_ragged_view_of_a_model_ends_completions_at_a_stated_share_of_the_vocabulary(tmp_path):
    from grpo_lab.models import TINY_MODEL_DIR

    folder, info = bench.ragged_model_dir(TINY_MODEL_DIR, tmp_path / "ragged", stop_probability=1 / 160)
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    stops = generation["eos_token_id"]
    assert config["eos_token_id"] in stops and len(stops) == info["stop_token_ids"]
    assert info["stop_probability"] == pytest.approx(round(config["vocab_size"] / 160) / config["vocab_size"])
    assert all(0 <= i < config["vocab_size"] for i in stops)
    assert (folder / "model.safetensors").resolve() == (TINY_MODEL_DIR / "model.safetensors").resolve()  # linked


def test_update_mfu_counts_model_flops_of_forward_backward_and_extra_forwards():
    cost = bench.ModelCost(params=1000, embedding_params=100, tied_embeddings=True, bytes_per_param=2, layers=2,
                           attention_width=4, kv_bytes_per_token=32)
    # backbone 900 weights on all 10 tokens, the head (100) on the 6 completion tokens, attention 2*2*4*10^2
    assert bench.sequence_flops(cost, 4, 6) == 2 * 900 * 10 + 2 * 100 * 6 + 2 * 2 * 4 * 100
    step = {"median": {"update_s": 2.0, "mean_completion_tokens": 6}}
    mfu = bench.update_mfu(step, cost, 4, completions=8, peak_flops=1e6, extra_forwards=bench.extra_forwards("vllm", 0.04))
    flops = 8 * bench.sequence_flops(cost, 4, 6) * 5  # forward + backward (3) + old log-probs + reference
    assert mfu["mfu"] == pytest.approx(flops / 2.0 / 1e6) and mfu["extra_forwards"] == 2
    assert bench.extra_forwards("hf", 0.0) == 0
    # the correction taken from the loss's own forward (grpo_lab.trainer.defers_correction): no old log-prob pass
    assert bench.extra_forwards("vllm", 0.04, deferred_correction=True) == 1
    # the correction off: TRL 1.16 computes no old log-probs when one generation feeds one optimizer step
    assert bench.extra_forwards("vllm", 0.04, importance_sampling_correction=False) == 1


def test_committed_mfu_counts_no_old_forward_where_the_correction_was_off():
    """Session 9's file with the correction off was first reported at 28.1 % with an old-log-prob forward TRL never
    ran; the split counts the forwards from the recorded settings."""
    rows = {(r["file"], r["backend"]): r for r in bench.committed_grpo_split()}
    off = rows[("grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection.json", "vllm")]
    on = rows[("grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_7.json", "vllm")]
    data = json.loads((RESULTS_DIR / "h200" / "grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection.json").read_text())
    block = data["grpo_step"]["backends"]["vllm"]
    assert block["settings"]["vllm_importance_sampling_correction"] is False
    assert off["update MFU"] == pytest.approx(block["mfu"]["mfu"] * 4 / 5, abs=1e-3)  # 3 + reference, not 3 + 2
    assert on["update MFU"] < 0.25 and off["update MFU"] < 0.25


def test_committed_numbers_are_read_from_their_files():
    """Notebooks 03 and 06 quote the committed GPU results through these, never from prose."""
    from grpo_lab.paths import BENCHMARKS_DIR, RESULTS_DIR

    smollm2 = bench.committed_smollm2_steps(BENCHMARKS_DIR / "grpo_smollm2")
    assert smollm2["steps"] == (3, 6) and smollm2["hf_step_s"] == 7.607
    assert 1.8 < smollm2["vllm_step_s"] < 2.0 and smollm2["speedup"] == pytest.approx(7.607 / smollm2["vllm_step_s"])
    headlines = {(r.model, r.variant): r for r in bench.committed_rollout_headlines(RESULTS_DIR / "h200")}
    large = headlines[("qwen2.5-1.5b", "ragged")]
    assert large.best == "vllm" and large.speedup.median == pytest.approx(5.833, abs=0.05)
    assert large.speedup.low <= large.speedup.median <= large.speedup.high and large.speedup.interleaved
    assert large.provenance.device == "NVIDIA H200" and "--shape qwen2.5-1.5b" in large.provenance.command
    targets = bench.committed_targets(RESULTS_DIR / "h200", BENCHMARKS_DIR / "grpo_smollm2")
    assert [t["target"] for t in targets] == [t[0] for t in bench.PERFORMANCE_TARGETS]
    # the 1.5B rollout file has 3 repeats per config and the first step files 2 steps, run one backend after the
    # other: no claim, whatever the medians say; the 0.5B rollout's newest file (5 repeats) gets a verdict
    assert targets[0]["verdict"] == "qwen2.5-0.5b: missed; qwen2.5-1.5b: 3 runs each: no spread, not a claim"
    small = bench.committed_ragged_headlines(RESULTS_DIR / "h200")["qwen2.5-0.5b"]
    assert small.provenance.path.name == "bench_seed_qwen2.5-0.5b_repeats5.json" and small.speedup.is_claim
    assert "2 runs each, not interleaved: no spread, not a claim" in targets[1]["verdict"]
    assert "0.98x" in targets[1]["measured"] and "5.8" in targets[0]["measured"]


def test_the_grpo_step_split_and_its_targets_are_computed_from_the_committed_files(tmp_path):
    """Notebook 06's table of the step and the targets in benchmarks/results/README.md: every number from the files,
    every verdict from the conservative end of a range, and no verdict from files that cannot make a claim."""
    import shutil

    from grpo_lab.paths import RESULTS_DIR

    rows = bench.committed_grpo_split(RESULTS_DIR / "h200")
    fixed = {r["backend"]: r for r in rows if r["file"].endswith("_fixed.json")}
    data = bench.load_results(bench.committed_file("grpo step fixed"))["grpo_step"]
    assert fixed["vllm"]["step"] == round(data["backends"]["vllm"]["median"]["step_s"], 2)
    assert fixed["vllm"]["vs hf"] == round(data["speedup_vs_hf"], 2) and fixed["hf"]["vs hf"] == 1.0
    assert {"vllm_generate", "weight_sync", "old_ref_logps", "backward_optimizer"} <= set(fixed["vllm"])
    assert all(0 < r["update MFU"] < 1 for r in rows)
    targets = bench.committed_grpo_step_targets(RESULTS_DIR / "h200")
    assert [t["target"] for t in targets[:3]] == [t[0] for t in bench.GRPO_STEP_TARGETS]
    assert [t["target"] for t in targets[3:]] == [bench.MFU_TARGET[0], bench.VLLM_MFU_TARGET[0], bench.REPEAT_TARGET,
                                                  *(t[0] for t in bench.LOW_END_TARGETS)]
    best = max(r["update MFU"] for r in rows if r["backend"] == "vllm" and r["workload"] == "fixed")
    assert targets[4]["measured"].startswith(f"{best:.1%} at best")
    assert targets[4]["verdict"] == ("met" if best >= bench.VLLM_MFU_TARGET[1] else "missed")
    ragged = bench.step_ratio(bench.load_results(bench.committed_file(bench.RAGGED_RUN))["grpo_step"])
    assert ragged.is_claim and targets[2]["measured"] == ragged.describe()  # the interleaved ragged file
    assert targets[2]["verdict"] == ragged.verdict(bench.GRPO_STEP_TARGETS[2][1])
    runs = [bench.step_ratio(bench.load_results(bench.committed_file(key))["grpo_step"])
            for key in bench.INTERLEAVED_RUNS]
    assert all(r.is_claim for r in runs) and f"range {runs[0].low:.2f}x..{runs[0].high:.2f}x" in targets[1]["measured"]
    assert targets[5]["measured"].startswith(
        "micro-batches of 32: " + " and ".join(f"{r.low:.2f}x..{r.high:.2f}x" for r in runs)
        + "; fixed, micro-batches of 128: ") and "; ragged, micro-batches of 128: " in targets[5]["measured"]
    # the fixed-length verdict and the overlap, from made-up interleaved files: a verdict from each low end
    for path in (RESULTS_DIR / "h200").glob("grpo_step_seed_qwen2.5-0.5b*.json"):
        shutil.copy(path, tmp_path / path.name)
    made_up = ([4.0, 4.5, 4.8, 4.2, 5.2], *[[3.0, 3.1, 3.2, 3.1, 3.0]] * (len(bench.INTERLEAVED_RUNS) - 1))
    for key, vllm in zip(bench.INTERLEAVED_RUNS, made_up, strict=True):
        changed = json.loads(bench.committed_file(key, tmp_path).read_text())
        changed["grpo_step"]["backends"]["hf"]["step_s"] = [10.0, 10.5, 11.0, 10.2, 10.8]
        changed["grpo_step"]["backends"]["vllm"]["step_s"] = vllm  # 10 / 5.2 = 1.92 .. 2.75; 10 / 3.2 = 3.12 .. 3.67
        bench.committed_file(key, tmp_path).write_text(json.dumps(changed))
    again = bench.committed_grpo_step_targets(tmp_path)
    assert "range 1.92x..2.75x" in again[1]["measured"] and "range 3.12x..3.67x" in again[1]["measured"]
    assert again[1]["verdict"].endswith("_1.json: not met (only the high end reaches 2.00x); "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_2.json: met; "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_3.json: met; "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_4.json: met; "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_5.json: met; "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_6.json: met; "
                                        "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_7.json: met")
    assert again[5]["verdict"] == ("micro-batches of 32: missed; fixed, micro-batches of 128: met; "
                                   "ragged, micro-batches of 128: met"), (
        "1.92..2.75 and 3.12..3.67 do not overlap; the committed runs in micro-batches of 128 do")


def test_a_ratio_range_pairs_the_extremes_and_its_verdict_uses_the_conservative_end():
    ratio = bench.speedup_range([10.0, 12.0, 11.0, 10.5, 11.5], [5.0, 6.0, 5.5, 5.2, 5.8], interleaved=True)
    assert (ratio.low, ratio.high) == (pytest.approx(10 / 6), pytest.approx(12 / 5))
    assert ratio.median == pytest.approx(11 / 5.5) and ratio.is_claim
    assert ratio.verdict(1.6) == "met" and ratio.verdict(2.5) == "missed"
    assert ratio.verdict(2.0) == "not met (only the high end reaches 2.00x)"
    slowdown = bench.speedup_range([1.3] * 5, [1.0, 1.1, 1.05, 1.0, 1.02], interleaved=True)  # in-trainer / fresh
    assert slowdown.verdict(1.3, "<=") == "met" and slowdown.verdict(1.2, "<=").startswith("not met")
    few = bench.speedup_range([10.0, 11.0], [5.0, 6.0], interleaved=False)
    assert few.verdict(1.0) == few.caveat() == "2 runs each, not interleaved: no spread, not a claim"
    assert bench.speedup_range([1.0] * 4, [1.0] * 5, interleaved=True).caveat() == (
        "4 and 5 runs: no spread, not a claim")
    assert bench.get_bench_profile("tiny").grpo_steps >= bench.MIN_RUNS
    assert bench.get_bench_profile("seed").grpo_steps >= bench.MIN_RUNS


def test_paired_ratios_cancel_a_drift_that_the_range_keeps():
    """Both backends slowing down together through a run (the machine) widens the range of extremes, not the ratios
    round by round; uneven rounds are refused."""
    hf, vllm = [10.0, 12.0, 14.0, 16.0, 18.0], [5.0, 6.0, 7.0, 8.0, 9.0]  # every round exactly 2x
    paired = bench.paired_ratios(hf, vllm)
    assert paired.min == paired.max == 2.0
    ratio = bench.speedup_range(hf, vllm, interleaved=True)
    assert ratio.low == pytest.approx(10 / 9) and ratio.high == pytest.approx(18 / 5)
    with pytest.raises(DataError, match="same number of rounds"):
        bench.paired_ratios(hf, vllm[:4])
    assert bench.paired_step_ratios({"backends": {"hf": {"step_s": hf}, "vllm": {"step_s": vllm}}}) is None


def test_committed_paired_ratios_read_each_interleaved_file_round_by_round():
    rows = {r["file"]: r for r in bench.committed_paired_step_ratios()}
    path = bench.committed_file("grpo step ragged interleaved 4")
    step = bench.load_results(path)["grpo_step"]
    hf, vllm = step["backends"]["hf"]["step_s"], step["backends"]["vllm"]["step_s"]
    row = rows[path.name]
    assert row["rounds"] == " ".join(f"{h / v:.2f}" for h, v in zip(hf, vllm))
    ratio = bench.step_ratio(step)
    assert row["range (extremes)"] == f"{ratio.low:.2f}x..{ratio.high:.2f}x"
    low = min(h / v for h, v in zip(hf, vllm))
    assert ratio.low <= low and row["round by round"].startswith(f"{low:.2f}x")
    assert bench.committed_file("grpo step fixed").name not in rows  # its backends ran one after the other


def test_interleaved_turns_alternate_after_each_backends_warm_up():
    assert bench.interleaved_turns(("hf", "vllm"), 1, 3) == ["hf", "vllm", "hf", "vllm", "hf", "vllm", "hf", "vllm"]
    assert bench.interleaved_turns(("hf", "vllm"), 2, 1) == ["hf", "hf", "vllm", "vllm", "hf", "vllm"]
    assert bench.interleaved_turns(("hf",), 1, 2) == ["hf", "hf", "hf"]


def test_two_real_trainers_take_whole_steps_in_turn(tmp_path):
    """The baton on the tiny model: two HF-generate trainers (the same code path as hf + vllm colocate, without the
    second engine), built together, step strictly in the interleaved order, one whole step at a time."""
    from grpo_lab.data import write_jsonl
    from grpo_lab.device import Machine
    from grpo_lab.models import resolve_model
    from grpo_lab.train import StepClock, build_trainer

    profile = bench.get_bench_profile("tiny", num_prompts=2, num_generations=2, max_completion_length=4,
                                      grpo_steps=2, grpo_warmup_steps=1, per_device_train_batch_size=4)
    rows = bench.seed_workload(load_tokenizer(resolve_model()), 2, 32)
    write_jsonl(rows, tmp_path / "rows.jsonl")
    order = [name.replace("vllm", "other") for name in bench.interleaved_turns(("hf", "vllm"), 1, 2)]
    turns, trainers, clocks = bench.Turns(order), {}, {}
    for name in ("hf", "other"):
        config = bench.grpo_step_config(profile, resolve_model(), tmp_path / "rows.jsonl", 48, "cpu",
                                        output_dir=str(tmp_path / name)).resolve(Machine.detect())
        gate, release = turns.callbacks(name)
        clocks[name] = StepClock("cpu", keep_checkpoints=False)
        trainers[name] = build_trainer(config, callbacks=[gate, clocks[name], release])
    turns.run(trainers, main="other")
    assert turns.log == [(name, event) for name in order for event in ("begin", "end")]
    assert [len(clock.seconds) for clock in clocks.values()] == [3, 3]


def test_committed_mfu_counts_only_the_forwards_the_trainer_ran():
    vllm, hf = {"settings": {"beta": 0.04}}, {"settings": {"beta": 0.04}}
    # before the bench recorded it: the trainer deferred the correction from 2026-12-01 17:56 UTC (commit 095862f)
    assert bench.deferred_correction(vllm, "vllm", "2026-12-02T04:43:46+0000")
    assert not bench.deferred_correction(vllm, "vllm", "2026-12-01T08:44:29+0000")
    assert not bench.deferred_correction(hf, "hf", "2026-12-02T04:43:46+0000")
    recorded = {"settings": {"beta": 0.04, "deferred_correction": False}}
    assert not bench.deferred_correction(recorded, "vllm", "2026-12-02T04:43:46+0000")


def test_committed_host_work_reads_the_host_counters_of_each_backend():
    rows = bench.committed_host_work()
    files = {r["file"] for r in rows}
    assert files == {bench.committed_file(key).name for key in (  # the files that recorded them
        "grpo step interleaved 4", "grpo step interleaved 5", "grpo step interleaved 6",
        "grpo step interleaved 7", *bench.RAGGED_RUNS[1:], *bench.NO_CORRECTION_RUNS, *bench.MICRO_BATCH_RUNS)}
    data = bench.load_results(bench.committed_file("grpo step interleaved 4"))["grpo_step"]["backends"]["vllm"]
    row = next(r for r in rows if r["file"].endswith("_fixed_interleaved_4.json") and r["backend"] == "vllm")
    assert row["host CPU s"] == round(bench.median(data["host"]["host_cpu_s"]), 2)
    assert row["CPU / step"] == round(bench.median(data["host"]["host_cpu_s"]) / bench.median(data["step_s"]), 2)
    assert row["driver allocations"] == round(bench.median(data["host"]["driver_allocations"]))


def test_the_committed_engine_profile_splits_vllms_generate_into_its_parts():
    """py-spy's samples inside LLM.generate in the trainer (session 8): the engine's loop is mostly the host's Python,
    the device's forward and sampling a fifth of it."""
    stacks = bench.Stacks.read(bench.ENGINE_PROFILE)
    assert stacks.total > 500 and all(len(stack) <= 12 for stack in stacks.counts)
    assert not any(":" in frame.rsplit("(", 1)[-1] for stack in stacks.counts for frame in stack)  # no line numbers
    rows = {row["part"]: row["share"] for row in bench.committed_engine_profile()}
    assert len(rows) == len(bench.ENGINE_PARTS) + 1 and all(0 <= share <= 1 for share in rows.values())
    host = sum(share for part, share in rows.items() if "Scheduler" in part or "OutputProcessor" in part)
    device = sum(share for part, share in rows.items() if "execute_model" in part or "sample_tokens" in part)
    assert host > 0.6 and device < 0.3  # what notebook 06 says


def test_stacks_cut_under_a_call_merge_line_numbers_and_write_back(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("main (a.py:1);run (b.py:2);step (c.py:3) 5\nmain (a.py:1);run (b.py:2);step (c.py:4) 2\n"
                   "main (a.py:1);run (b.py:9) 4\nmain (a.py:1) 1\n", encoding="utf-8")
    stacks = bench.Stacks.read(raw)
    inside = stacks.under("run (b.py")
    assert inside.counts == {("step (c.py)",): 7}  # the samples in run's own body have no frame below it
    assert bench.Stacks.read(inside.write(tmp_path / "cut.txt")) == inside
    assert stacks.share("run (") == 11 / 12 and bench.function_of("f (x.py:12)") == "f (x.py)"
