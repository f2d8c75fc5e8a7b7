"""The benchmark: roofline arithmetic, alternation and medians, the results schema, small real runs, and the catalogue
of committed runs (benchmarks/results/catalogue.json) read back into records, tables and verdicts.

Fast except two end-to-end runs: HF generate plus a one-step GRPO trainer (~20 s), and the only vLLM engine
these tests start (~40 s on two cores), which checks fixed lengths, drawn lengths and prefix isolation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo_lab.errors import DataError
from grpo_lab.rollout import RolloutConfig, Sampling, load_tokenizer
from grpo_lab.rollout.engine import check_completion_lengths
from lab import bench
from lab.bench.catalogue import CATALOGUE_FILE, CatalogueError, read_catalogue
from lab.bench.cli import key_value
from lab.bench.committed import ENGINE_PARTS, deferred_correction
from lab.bench.grpo_step import Turns, _step_summary, interleaved_turns
from lab.bench.results import SCHEMA, check_results, paired_step_ratios
from lab.bench.rollout_bench import Measurement
from lab.bench.roofline import DeviceRates, ModelCost, extra_forwards, roofline, sequence_flops, update_mfu
from lab.bench.stacks import Stacks, function_of
from lab.bench.stats import MIN_RUNS, alternating_orders, median, paired_ratios
from lab.committed import BENCHMARKS_DIR, RESULTS_DIR

REPO = Path(__file__).resolve().parent.parent
COMMITTED_CPU = REPO / "benchmarks" / "results" / "cpu" / "bench_tiny.json"
TOY = ModelCost(params=1000, embedding_params=100, tied_embeddings=True, bytes_per_param=2, layers=1,
                attention_width=4, kv_bytes_per_token=8)
SLOW_DEVICE = DeviceRates(kind="cpu", name="toy", dtype="bfloat16", bandwidth_bytes_per_s=1000.0,
                          matmul_flops_per_s=10_000.0)


@pytest.fixture(scope="module")
def catalogue():
    return read_catalogue()


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
    from lab.bench.workload import SHAPES

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
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    orders = alternating_orders(("hf", "vllm", "vllm+prefix"), 4)
    assert orders == [["hf", "vllm", "vllm+prefix"], ["vllm", "vllm+prefix", "hf"],
                      ["vllm+prefix", "hf", "vllm"], ["hf", "vllm", "vllm+prefix"]]
    assert {order[0] for order in orders[:3]} == {"hf", "vllm", "vllm+prefix"}  # each config leads once


def test_measurement_takes_the_median_of_tokens_per_second():
    class Result:
        def __init__(self, seconds, tokens):
            self.generate_s, self.new_tokens, self.outputs = seconds, tokens, []

    m = Measurement()
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


def test_run_verdicts_carry_each_runs_settings_and_the_targets_verdict(catalogue):
    """Catalogue.run_verdicts: one row per run a step target reads (the low-end targets here), with the micro-batch and
    correction the file records and the same verdict as the targets table."""
    rows = []
    for target_id in ("fixed low end", "ragged low end"):
        target, table = catalogue.target(target_id), catalogue.verdict(target_id).verdict
        own = catalogue.run_verdicts(target_id)
        assert [r["file"] for r in own] == [catalogue.runs[key].name for key in target.reads]
        assert all(f"{row['file']}: {row['verdict']}" in table and row["needed"] == f"{target.threshold:.1f}x"
                   for row in own)
        rows += own
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
    assert key_value("async_scheduling=true") == ("async_scheduling", True)
    assert key_value("cache_implementation=static") == ("cache_implementation", "static")


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
    return {"schema": SCHEMA, "created": "now", "command": "", "profile": {}, "parts": ["rollout"],
            "model": {"path": "m", "weights": "real", "dtype": "float32", "params": 1}, "environment": {},
            "load_average": {}, "notes": [],
            "rollout": {"workload": {}, "method": "", "configs": {}, "settings": {}, "load_s": {},
                        "variants": {"fixed": {"lengths": "", "sampling": {}, "speedup_vs_hf": {},
                                               "configs": {"hf": {"times_s": [1.0], "median_s": 1.0,
                                                                  "new_tokens": [8], "tokens_per_s": 8.0}}}}},
            "grpo_step": {"skipped": "not in --parts"}}


def test_check_results_names_every_missing_key():
    results = _minimal_results()
    assert check_results(results) is results
    del results["environment"]
    del results["rollout"]["variants"]["fixed"]["configs"]["hf"]["median_s"]
    with pytest.raises(ValueError, match=r"environment, .*rollout\.variants\.fixed\.configs\.hf\.median_s"):
        check_results(results)


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
    # which of the trainer's speed-ups ran: 0.3.0 keeps only the sampled-token log-probs skipped where nothing reads
    # them (HF generate has none to skip)
    assert step["settings"]["deferred_correction"] is False and step["settings"]["length_grouping"] is False
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
    assert json.loads(json.dumps(results, default=str))["schema"] == SCHEMA


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
    cost = ModelCost(params=1000, embedding_params=100, tied_embeddings=True, bytes_per_param=2, layers=2,
                           attention_width=4, kv_bytes_per_token=32)
    # backbone 900 weights on all 10 tokens, the head (100) on the 6 completion tokens, attention 2*2*4*10^2
    assert sequence_flops(cost, 4, 6) == 2 * 900 * 10 + 2 * 100 * 6 + 2 * 2 * 4 * 100
    step = {"median": {"update_s": 2.0, "mean_completion_tokens": 6}}
    mfu = update_mfu(step, cost, 4, completions=8, peak_flops=1e6, extra_forwards=extra_forwards("vllm", 0.04))
    flops = 8 * sequence_flops(cost, 4, 6) * 5  # forward + backward (3) + old log-probs + reference
    assert mfu["mfu"] == pytest.approx(flops / 2.0 / 1e6) and mfu["extra_forwards"] == 2
    assert extra_forwards("hf", 0.0) == 0
    # the correction taken from the loss's own forward (grpo_lab.trainer.defers_correction): no old log-prob pass
    assert extra_forwards("vllm", 0.04, deferred_correction=True) == 1
    # the correction off: TRL 1.16 computes no old log-probs when one generation feeds one optimizer step
    assert extra_forwards("vllm", 0.04, importance_sampling_correction=False) == 1


def test_committed_mfu_counts_no_old_forward_where_the_correction_was_off(catalogue):
    """A file with the correction off records an MFU that counted an old-log-prob forward TRL never ran (its bench
    predates the fix); the split counts the forwards from the recorded settings."""
    rows = {(r["file"], r["backend"]): r for r in catalogue.grpo_split()}
    off = rows[("grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection.json", "vllm")]
    on = rows[("grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_7.json", "vllm")]
    data = json.loads((RESULTS_DIR / "h200" / "grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection.json").read_text())
    block = data["grpo_step"]["backends"]["vllm"]
    assert block["settings"]["vllm_importance_sampling_correction"] is False
    assert off["update MFU"] == pytest.approx(block["mfu"]["mfu"] * 4 / 5, abs=1e-3)  # 3 + reference, not 3 + 2
    assert on["update MFU"] < 0.25 and off["update MFU"] < 0.25


def test_committed_numbers_are_read_from_their_files(catalogue):
    """Notebooks 03 and 06 quote the committed GPU results through these, never from prose."""
    smollm2 = bench.committed_smollm2_steps(BENCHMARKS_DIR / "grpo_smollm2")
    assert smollm2["steps"] == (3, 6) and smollm2["hf_step_s"] == 7.607
    assert 1.8 < smollm2["vllm_step_s"] < 2.0 and smollm2["speedup"] == pytest.approx(7.607 / smollm2["vllm_step_s"])
    headlines = {(r.model, r.variant, r.provenance.file): r for r in catalogue.rollout_headlines()}
    large = headlines[("qwen2.5-1.5b", "ragged", "bench_seed_qwen2.5-1.5b.json")]
    assert large.best == "vllm" and large.speedup.median == pytest.approx(5.833, abs=0.05)
    assert large.speedup.low <= large.speedup.median <= large.speedup.high and large.speedup.interleaved
    assert large.provenance.device == "NVIDIA H200" and "--shape qwen2.5-1.5b" in large.provenance.command
    rollout, steps = catalogue.verdict("ragged rollout"), catalogue.verdict("step 4x")
    # the 1.5B rollout file has 3 repeats per config and the first step files 2 steps, run one backend after the
    # other: no claim, whatever the medians say; the 0.5B rollout with 5 repeats gets a verdict
    assert rollout.verdict == "qwen2.5-0.5b: missed; qwen2.5-1.5b: 3 runs each: no spread, not a claim"
    assert catalogue.target("ragged rollout").reads == ("rollout 0.5b 5 repeats", "rollout 1.5b")
    assert "2 runs each, not interleaved: no spread, not a claim" in steps.verdict
    assert "0.98x" in steps.measured and "5.8" in rollout.measured
    assert steps.measured.endswith(f"SmolLM2-135M steps 3-6: {smollm2['speedup_range'].describe()}")


def test_the_grpo_step_split_and_its_targets_are_computed_from_the_committed_files(catalogue, tmp_path):
    """Notebook 06's table of the step and the targets in benchmarks/results/README.md: every number from the files,
    every verdict from the conservative end of a range, and no verdict from files that cannot make a claim."""
    rows = catalogue.grpo_split()
    fixed = {r["backend"]: r for r in rows if r["file"].endswith("_fixed.json")}
    data = catalogue.run("grpo step fixed").step
    assert fixed["vllm"]["step"] == round(data["backends"]["vllm"]["median"]["step_s"], 2)
    assert fixed["vllm"]["vs hf"] == round(data["speedup_vs_hf"], 2) and fixed["hf"]["vs hf"] == 1.0
    assert {"vllm_generate", "weight_sync", "old_ref_logps", "backward_optimizer"} <= set(fixed["vllm"])
    assert all(0 < r["update MFU"] < 1 for r in rows)
    verdicts = {v.target.id: v for v in catalogue.verdicts()}
    assert list(verdicts) == [t.id for t in catalogue.targets] and len(verdicts) == 11
    mfu = catalogue.target("vLLM update MFU")
    best = max(r["update MFU"] for key in mfu.reads for r in catalogue.runs[key].split() if r["backend"] == "vllm")
    assert verdicts["vLLM update MFU"].measured.startswith(f"{best:.1%} at best")
    assert verdicts["vLLM update MFU"].verdict == ("met" if best >= mfu.threshold else "missed")
    ragged = catalogue.run("grpo step ragged micro-batch 128 2").step_ratio()
    assert ragged.is_claim and verdicts["ragged step 3.3x"].measured == ragged.describe()  # one run: no name
    assert verdicts["ragged step 3.3x"].verdict == ragged.verdict(3.3)
    runs = [run.step_ratio() for run in catalogue.in_series("fixed interleaved")]
    assert len(runs) == 7 and all(r.is_claim for r in runs)
    assert f"range {runs[0].low:.2f}x..{runs[0].high:.2f}x" in verdicts["fixed step 2x"].measured
    repeats = verdicts["repeats overlap"].measured
    assert repeats.startswith("micro-batches of 32: " + " and ".join(f"{r.low:.2f}x..{r.high:.2f}x" for r in runs)
                              + "; fixed, micro-batches of 128: ") and "; ragged, micro-batches of 128: " in repeats
    # the fixed-length verdict and the overlap, from made-up interleaved files in a copy of the catalogue's folder
    copy = tmp_path / "results"
    for path in [*RESULTS_DIR.glob("*/*.json"), catalogue.engine_profile_file]:
        (copy / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy / path.parent.name / path.name)
    entries = json.loads(CATALOGUE_FILE.read_text())
    next(t for t in entries["targets"] if "smollm2" in t)["smollm2"]["folder"] = str(BENCHMARKS_DIR / "grpo_smollm2")
    (copy / CATALOGUE_FILE.name).write_text(json.dumps(entries))
    made_up = ([4.0, 4.5, 4.8, 4.2, 5.2], *[[3.0, 3.1, 3.2, 3.1, 3.0]] * 6)
    for run, vllm in zip(catalogue.in_series("fixed interleaved"), made_up, strict=True):
        changed = copy / run.path.parent.name / run.name
        results = json.loads(changed.read_text())
        results["grpo_step"]["backends"]["hf"]["step_s"] = [10.0, 10.5, 11.0, 10.2, 10.8]
        results["grpo_step"]["backends"]["vllm"]["step_s"] = vllm  # 10 / 5.2 = 1.92 .. 2.75; 10 / 3.2 = 3.12 .. 3.67
        changed.write_text(json.dumps(results))
    again = read_catalogue(copy / CATALOGUE_FILE.name)
    fixed_step = again.verdict("fixed step 2x")
    assert "range 1.92x..2.75x" in fixed_step.measured and "range 3.12x..3.67x" in fixed_step.measured
    assert fixed_step.verdict == ("grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_1.json: not met (only the high end "
                                  "reaches 2.00x); " + "; ".join(f"grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_{i}"
                                                                 ".json: met" for i in range(2, 8)))
    assert again.verdict("repeats overlap").verdict == (
        "micro-batches of 32: missed; fixed, micro-batches of 128: met; ragged, micro-batches of 128: met"), (
        "1.92..2.75 and 3.12..3.67 do not overlap; the committed runs in micro-batches of 128 do")


def test_the_catalogue_names_every_committed_file_and_checks_what_it_reads(tmp_path):
    """A results file the catalogue does not name, a series or target that reads an unknown name, and an unknown
    measure are errors that say which; the committed catalogue has none, and every series and target reads runs."""
    catalogue = read_catalogue()
    assert {run.path for run in catalogue.runs.values()} == set(RESULTS_DIR.glob("*/*.json"))
    assert all(run.plot.is_file() for run in catalogue.runs.values() if run.is_bench)
    assert all(series.runs for series in catalogue.series.values())
    assert all(target.reads or target.groups for target in catalogue.targets)
    assert catalogue.file("rollout 1.5b", ".png").is_file() and catalogue.engine_profile_file.is_file()
    entries = json.loads(CATALOGUE_FILE.read_text())
    (tmp_path / "h200").mkdir()
    for name in ("bench_seed_qwen2.5-0.5b.json", "unnamed.json"):
        shutil.copy(RESULTS_DIR / "h200" / "bench_seed_qwen2.5-0.5b.json", tmp_path / "h200" / name)
    small = {"runs": {"rollout 0.5b": "h200/bench_seed_qwen2.5-0.5b"}, "series": {},
             "engine_profile": {"file": "none.txt", "run": "rollout 0.5b"}, "targets": []}
    for change, error in (({}, r"does not name h200/unnamed\.json"),
                          ({"series": {"s": {"runs": ["nope"]}}}, r"series 's' reads 'nope', which is neither"),
                          ({"targets": [{**entries["targets"][0], "measure": "speed"}]},
                           r"measure 'speed' is not one")):
        (tmp_path / "catalogue.json").write_text(json.dumps({**small, **change}))
        with pytest.raises(CatalogueError, match=error):
            read_catalogue(tmp_path / "catalogue.json")
        (tmp_path / "h200" / "unnamed.json").unlink(missing_ok=True)  # the next cases are about other errors
    (tmp_path / "catalogue.json").write_text(json.dumps(small))
    assert list(read_catalogue(tmp_path / "catalogue.json").runs) == ["rollout 0.5b"]


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
    assert bench.get_bench_profile("tiny").grpo_steps >= MIN_RUNS
    assert bench.get_bench_profile("seed").grpo_steps >= MIN_RUNS


def test_paired_ratios_cancel_a_drift_that_the_range_keeps():
    """Both backends slowing down together through a run (the machine) widens the range of extremes, not the ratios
    round by round; uneven rounds are refused."""
    hf, vllm = [10.0, 12.0, 14.0, 16.0, 18.0], [5.0, 6.0, 7.0, 8.0, 9.0]  # every round exactly 2x
    paired = paired_ratios(hf, vllm)
    assert paired.min == paired.max == 2.0
    ratio = bench.speedup_range(hf, vllm, interleaved=True)
    assert ratio.low == pytest.approx(10 / 9) and ratio.high == pytest.approx(18 / 5)
    with pytest.raises(DataError, match="same number of rounds"):
        paired_ratios(hf, vllm[:4])
    assert paired_step_ratios({"backends": {"hf": {"step_s": hf}, "vllm": {"step_s": vllm}}}) is None


def test_committed_paired_ratios_read_each_interleaved_file_round_by_round(catalogue):
    rows = {r["file"]: r for r in catalogue.paired_step_ratios()}
    run = catalogue.run("grpo step ragged interleaved 4")
    hf, vllm = run.step["backends"]["hf"]["step_s"], run.step["backends"]["vllm"]["step_s"]
    row = rows[run.name]
    assert row["rounds"] == " ".join(f"{h / v:.2f}" for h, v in zip(hf, vllm))
    ratio = run.step_ratio()
    assert row["range (extremes)"] == f"{ratio.low:.2f}x..{ratio.high:.2f}x"
    low = min(h / v for h, v in zip(hf, vllm))
    assert ratio.low <= low and row["round by round"].startswith(f"{low:.2f}x")
    assert catalogue.file("grpo step fixed").name not in rows  # its backends ran one after the other


def test_interleaved_turns_alternate_after_each_backends_warm_up():
    assert interleaved_turns(("hf", "vllm"), 1, 3) == ["hf", "vllm", "hf", "vllm", "hf", "vllm", "hf", "vllm"]
    assert interleaved_turns(("hf", "vllm"), 2, 1) == ["hf", "hf", "vllm", "vllm", "hf", "vllm"]
    assert interleaved_turns(("hf",), 1, 2) == ["hf", "hf", "hf"]


def test_two_real_trainers_take_whole_steps_in_turn(tmp_path):
    """The baton on the tiny model: two HF-generate trainers (the same code path as hf + vllm colocate, without the
    second engine), built together, step strictly in the interleaved order, one whole step at a time."""
    from grpo_lab.data import write_jsonl
    from grpo_lab.device import Machine
    from grpo_lab.experiment import plan
    from grpo_lab.models import resolve_model
    from grpo_lab.train import StepClock, build_trainer

    profile = bench.get_bench_profile("tiny", num_prompts=2, num_generations=2, max_completion_length=4,
                                      grpo_steps=2, grpo_warmup_steps=1, per_device_train_batch_size=4)
    rows = bench.seed_workload(load_tokenizer(resolve_model()), 2, 32)
    write_jsonl(rows, tmp_path / "rows.jsonl")
    order = [name.replace("vllm", "other") for name in interleaved_turns(("hf", "vllm"), 1, 2)]
    turns, trainers, clocks = Turns(order), {}, {}
    for name in ("hf", "other"):
        config = plan(bench.grpo_step_config(profile, resolve_model(), tmp_path / "rows.jsonl", 48, "cpu",
                                             output_dir=str(tmp_path / name)), Machine.detect())
        gate, release = turns.callbacks(name)
        clocks[name] = StepClock("cpu", keep_checkpoints=False)
        trainers[name] = build_trainer(config, callbacks=[gate, clocks[name], release])
    turns.run(trainers, main="other")
    assert turns.log == [(name, event) for name in order for event in ("begin", "end")]
    assert [len(clock.seconds) for clock in clocks.values()] == [3, 3]


def test_committed_mfu_counts_only_the_forwards_the_trainer_ran():
    vllm, hf = {"settings": {"beta": 0.04}}, {"settings": {"beta": 0.04}}
    # before the bench recorded it: the trainer deferred the correction from 2026-12-01 17:56 UTC (commit 095862f)
    assert deferred_correction(vllm, "vllm", "2026-12-02T04:43:46+0000")
    assert not deferred_correction(vllm, "vllm", "2026-12-01T08:44:29+0000")
    assert not deferred_correction(hf, "hf", "2026-12-02T04:43:46+0000")
    recorded = {"settings": {"beta": 0.04, "deferred_correction": False}}
    assert not deferred_correction(recorded, "vllm", "2026-12-02T04:43:46+0000")


def test_committed_host_work_reads_the_host_counters_of_each_backend(catalogue):
    rows = catalogue.host_work()
    files = {r["file"] for r in rows}
    recorded = [*catalogue.series["fixed interleaved"].runs[3:], *catalogue.series["ragged interleaved"].runs[1:]]
    for name in ("fixed no correction", "ragged no correction", "fixed micro-batch 128", "fixed micro-batch 64",
                 "ragged micro-batch 128"):
        recorded += catalogue.series[name].runs
    assert files == {catalogue.runs[key].name for key in recorded}  # the files that recorded them
    data = catalogue.run("grpo step interleaved 4").step["backends"]["vllm"]
    row = next(r for r in rows if r["file"].endswith("_fixed_interleaved_4.json") and r["backend"] == "vllm")
    assert row["host CPU s"] == round(median(data["host"]["host_cpu_s"]), 2)
    assert row["CPU / step"] == round(median(data["host"]["host_cpu_s"]) / median(data["step_s"]), 2)
    assert row["driver allocations"] == round(median(data["host"]["driver_allocations"]))


def test_the_committed_engine_profile_splits_vllms_generate_into_its_parts(catalogue):
    """py-spy's samples inside LLM.generate in the trainer (the catalogue's engine profile): the engine's loop is
    mostly the host's Python, the device's forward and sampling a fifth of it."""
    stacks = Stacks.read(catalogue.engine_profile_file)
    assert stacks.total > 500 and all(len(stack) <= 12 for stack in stacks.counts)
    assert not any(":" in frame.rsplit("(", 1)[-1] for stack in stacks.counts for frame in stack)  # no line numbers
    rows = {row["part"]: row["share"] for row in catalogue.engine_profile()}
    assert len(rows) == len(ENGINE_PARTS) + 1 and all(0 <= share <= 1 for share in rows.values())
    host = sum(share for part, share in rows.items() if "Scheduler" in part or "OutputProcessor" in part)
    device = sum(share for part, share in rows.items() if "execute_model" in part or "sample_tokens" in part)
    assert host > 0.6 and device < 0.3  # what notebook 06 says
    assert catalogue.engine_profile_run in catalogue.series["fixed interleaved"].runs


def test_stacks_cut_under_a_call_merge_line_numbers_and_write_back(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("main (a.py:1);run (b.py:2);step (c.py:3) 5\nmain (a.py:1);run (b.py:2);step (c.py:4) 2\n"
                   "main (a.py:1);run (b.py:9) 4\nmain (a.py:1) 1\n", encoding="utf-8")
    stacks = Stacks.read(raw)
    inside = stacks.under("run (b.py")
    assert inside.counts == {("step (c.py)",): 7}  # the samples in run's own body have no frame below it
    assert Stacks.read(inside.write(tmp_path / "cut.txt")) == inside
    assert stacks.share("run (") == 11 / 12 and function_of("f (x.py:12)") == "f (x.py)"


def test_the_results_readme_shows_the_verdicts_the_catalogue_computes(catalogue):
    """benchmarks/results/README.md's table is `python -m lab.bench targets` of the committed catalogue."""
    assert catalogue.targets_markdown() in (RESULTS_DIR / "README.md").read_text(encoding="utf-8")
