"""grpo_lab.memory: each component against hand-computed values, the seed's 2B / 32 GB example, bad input."""

import json
import math
from dataclasses import replace

import pytest

from grpo_lab import memory
from grpo_lab.memory import (
    GIB,
    DoesNotFitError,
    MemoryPlanError,
    STEP_DEFAULTS,
    ModelShape,
    TrainingShape,
    course_configs,
    get_precision,
    plan_memory,
    recommendation_table,
    training_phases,
)
from grpo_lab.paths import REPO_ROOT
from lab import memory as lab_memory

CONFIGS = course_configs()
QWEN_05B = CONFIGS["qwen2.5-0.5b"]
P_05B = 494_032_768  # Qwen2.5-0.5B's published parameter count


def plan(config=QWEN_05B, **kwargs):
    kwargs.setdefault("device_memory_gib", 80)
    kwargs.setdefault("device_kind", "cuda")
    return plan_memory(config, **kwargs)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_matches_transformers(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in json.loads(CONFIGS[name].read_text()).items() if not k.startswith("_")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values))
    assert ModelShape.from_config(CONFIGS[name]).num_parameters == sum(p.numel() for p in model.parameters())


def test_qwen_05b_shape_and_kv_cache():
    shape = ModelShape.from_config(QWEN_05B)
    assert shape.num_parameters == P_05B
    assert (shape.head_dim, shape.q_dim, shape.kv_dim) == (64, 896, 128)
    assert shape.kv_cache_bytes_per_token(2) == 24 * 2 * 64 * 2 * 2 == 12_288
    explicit = ModelShape.from_config({"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                                       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                                       "vocab_size": 151936, "tie_word_embeddings": True})
    assert explicit.kv_cache_bytes_per_token(2) == 28 * 8 * 128 * 2 * 2  # head_dim is read, not derived


def test_config_sources_agree(tmp_path):
    values = json.loads(QWEN_05B.read_text())
    (tmp_path / "config.json").write_text(json.dumps(values))
    from transformers import AutoConfig

    transformers_config = AutoConfig.for_model(**{k: v for k, v in values.items() if not k.startswith("_")})
    shapes = [ModelShape.from_config(x, name="m") for x in (QWEN_05B, tmp_path, values, transformers_config)]
    assert len(set(shapes)) == 1


def test_static_components_hand_computed():
    shape = ModelShape.from_config(QWEN_05B)
    training = TrainingShape(per_device_train_batch_size=4, num_generations=4, beta=0.04)
    for precision, (w, g, s) in {"bf16": (2, 2, 4), "mixed": (4, 4, 8), "fp32": (4, 4, 8)}.items():
        expected = {"policy weights": P_05B * w, "AdamW states": P_05B * s, "reference model": P_05B * w,
                    "gradients": P_05B * g}
        for kind in ("npu", "cpu"):
            assert training_phases(shape, get_precision(precision), training, kind)["optimizer step"] == expected
        # cuBLAS's workspaces (32 MiB + 1 MiB cuBLASLt) live in torch's allocator: forward and backward thread
        cuda = training_phases(shape, get_precision(precision), training, "cuda")
        assert cuda["optimizer step"] == {**expected, "cuBLAS workspaces": 2 * 33 * 2**20}
        assert all(phase["cuBLAS workspaces"] == 2 * 33 * 2**20 for phase in cuda.values())
    with pytest.raises(MemoryPlanError, match="device_kind must be one of npu, cuda, cpu"):
        training_phases(shape, get_precision("bf16"), training, "triton")


def test_activations_hand_computed():
    shape = ModelShape.from_config(QWEN_05B)
    h, i, q, heads, layers, v = 896, 4864, 896, 14, 24, 151936
    bf16, fp32, mixed = (get_precision(p) for p in ("bf16", "fp32", "mixed"))
    # per token and layer: two RMSNorms (fp32 upcast + normalised + output), q/k/v/out of attention, MLP
    assert memory.activation_bytes_per_token_per_layer(shape, bf16) == 2 * (4 * h + 4 * h) + 8 * q + 4 * heads + 8 * i
    assert memory.activation_bytes_per_token_per_layer(shape, fp32) == 2 * (4 * h + 8 * h) + 16 * q + 4 * heads + 16 * i
    assert memory.activation_bytes_per_token_per_layer(shape, mixed) == 26 * h + 8 * q + 4 * heads + 8 * i

    b, prompt, completion = 2, 8, 8
    t, n = prompt + completion, b * (prompt + completion)
    training = TrainingShape(per_device_train_batch_size=b, num_generations=2, max_prompt_length=prompt,
                             max_completion_length=completion, gradient_checkpointing=False)
    phase = training_phases(shape, bf16, training, "cuda")["LM-head backward"]
    per_layer = n * 60_472 + b * t * t * 2  # + SDPA's float copy of the padding mask
    outside = n * (4 * h + 2 * h) + b * completion * 2 * h  # final RMSNorm, LM-head input
    assert phase["activations saved for backward"] == layers * per_layer + outside
    tile = min(b * completion, 4096) * 32768 * 2
    assert phase["LM-head backward buffers"] == tile + v * h * 4 + b * completion * h * 4 + v * h * 2 + b * completion * h * 2
    checkpointed = training_phases(shape, bf16, TrainingShape(per_device_train_batch_size=b, num_generations=2,
                                                              max_prompt_length=prompt, max_completion_length=completion),
                                   "cuda")
    # checkpointing keeps each layer's input, and the boolean padding mask in the recompute closure
    assert checkpointed["LM-head backward"]["activations saved for backward"] == layers * n * 2 * h + outside + b * t * t
    assert checkpointed["layer backward"]["recomputed layer"] == per_layer


def test_layer_backward_hand_computed():
    shape = ModelShape.from_config(QWEN_05B)
    h, i, v, layers, layer = 896, 4864, 151936, 24, shape.layer_parameters
    bf16 = get_precision("bf16")
    b, t = 2, 16
    n = b * t
    training = TrainingShape(per_device_train_batch_size=b, num_generations=2, max_prompt_length=8, max_completion_length=8)
    phase = training_phases(shape, bf16, training, "cuda")["layer backward"]
    # short sequences: the peak is in the last layer done (layer 0), with all gradients but its own gate, up,
    # attention and norms, its input, its recomputed activations and the MLP's backward buffers
    assert phase["gradients"] == P_05B * 2 - (layer - h * i) * 2
    assert phase["activations saved for backward"] == n * 2 * h + b * t * t
    # the gradients of gate, up and their product replace the freed product (+2 of 3); the gradient flowing in
    assert phase["layer backward buffers"] == n * (2 * 2 * i + 2 * h)
    assert phase["autocast weight copies"] == 0
    # long sequences: the first layer done (the top one), every layer's input still kept, few gradients yet
    long = TrainingShape(per_device_train_batch_size=64, num_generations=8, max_prompt_length=512,
                         max_completion_length=4096)
    n = 64 * (512 + 4096)
    phase = training_phases(shape, bf16, long, "cuda")["layer backward"]
    assert phase["gradients"] == v * h * 2 + h * 2 + h * i * 2  # LM head, final norm, top down_proj
    assert phase["activations saved for backward"] == layers * n * 2 * h + 64 * 4608 * 4608


def test_embedding_backward_by_device():
    shape = ModelShape.from_config(QWEN_05B)
    untied = ModelShape.from_config({**json.loads(QWEN_05B.read_text()), "tie_word_embeddings": False})
    h, v = 896, 151936
    b, t = 16, 512
    n = b * t
    training = TrainingShape(per_device_train_batch_size=b, num_generations=4, max_prompt_length=256,
                             max_completion_length=256)
    bf16 = get_precision("bf16")

    def buffers(model, kind):
        return training_phases(model, bf16, training, kind)["embedding backward"]["embedding backward buffers"]

    partial_sums = (n // 10 + n) * h * 4  # CUDA: fp32 partial sums sized for the worst case
    assert buffers(shape, "cuda") == n * 2 * h + partial_sums + v * h * 2  # tied: a dense gradient, added in place
    assert buffers(untied, "cuda") == n * 2 * h + partial_sums  # untied: the dense gradient is the .grad
    assert buffers(shape, "cpu") == buffers(shape, "npu") == n * 2 * h + v * h * 2
    assert buffers(untied, "npu") == n * 2 * h


def test_mixed_precision_autocast_copies():
    shape = ModelShape.from_config(QWEN_05B)
    h, v, layers = 896, 151936, 24
    mixed = get_precision("mixed")
    b, prompt, completion = 8, 256, 256
    n = b * (prompt + completion)
    kwargs = dict(per_device_train_batch_size=b, num_generations=8, max_prompt_length=prompt,
                  max_completion_length=completion)
    on = training_phases(shape, mixed, TrainingShape(**kwargs), "cuda")
    off = training_phases(shape, mixed, TrainingShape(gradient_checkpointing=False, **kwargs), "cuda")
    copies = shape.layer_linear_parameters * 2  # bf16 copies of one layer's linear weights and biases
    assert shape.layer_linear_parameters == shape.layer_parameters - 2 * h  # not the two RMSNorm weights
    # checkpointing: autocast's cache is gone after the forward; the recompute makes one layer's copies
    assert on["LM-head backward"]["autocast weight copies"] == 0
    assert on["layer backward"]["autocast weight copies"] == copies
    # without it every linear keeps its copy until its backward
    assert off["LM-head backward"]["autocast weight copies"] == layers * copies
    # an fp32 residual: the first RMSNorm's upcast is the kept layer input itself
    per_layer = n * memory.activation_bytes_per_token_per_layer(shape, mixed) + b * 512 * 512 * 2
    assert on["layer backward"]["recomputed layer"] == per_layer - n * 4 * h
    # the LM head casts each 32768-row weight chunk and 2048-token input chunk to bf16; no final casts (fp32)
    tile_rows = b * completion
    assert on["LM-head backward"]["LM-head backward buffers"] == (tile_rows * 32768 * 2 + v * h * 4 + tile_rows * h * 4
                                                                  + (32768 + tile_rows) * h * 2)


def _benchmark(name):
    """A script of benchmarks/memory as a module (it puts its folder on sys.path itself)."""
    import importlib.util

    path = REPO_ROOT / "benchmarks" / "memory" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_memory_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_earlier_models_are_subtracted_from_leaky_train_step_records():
    measure_gpu = _benchmark("measure_gpu")
    records = [{"case": "qwen2.5-0.5b, bf16, B=16, 256+256, checkpointing on"},
               {"case": "qwen2.5-0.5b, mixed, B=8, 256+256, checkpointing on"},
               {"case": "qwen2.5-1.5b, bf16, B=8, 256+512, checkpointing on"}]
    assert measure_gpu.earlier_models_bytes(records) == [0, P_05B * 2, P_05B * 2 + P_05B * 4]
    fixed = [{**r, "earlier_models_freed": True} for r in records]
    assert measure_gpu.earlier_models_bytes(fixed) == [0, 0, 0]
    with pytest.raises(ValueError, match="Cannot read the parameters"):
        measure_gpu.earlier_models_bytes([{"case": "qwen2.5-0.5b, B=16"}])


def test_committed_comparisons_are_current_and_within_target():
    """results/comparison_*.json (read by notebook 04) equal a fresh recompute with this planner; training
    rows within 10 % on the GPU and 1.5 % on CPU (the CPU RSS-growth row is explained in results/cpu.md)."""
    results = lab_memory.MEASUREMENTS_DIR
    rows = {"cpu": _benchmark("measure_cpu").comparison_rows(results),
            "gpu": _benchmark("measure_gpu").comparison_rows(results)}
    for where, fresh in rows.items():
        committed = json.loads((results / f"comparison_{where}.json").read_text())
        assert committed == json.loads(json.dumps(fresh)), f"re-render: measure_{where}.py --render"
    assert not [r for r in rows["gpu"] if "failed" in r]
    assert all(abs(r["error"]) <= 0.10 for r in rows["gpu"])
    assert all(abs(r["error"]) <= 0.015 for r in rows["cpu"] if r["quantity"] != "RSS growth")
    assert {r["where"] for r in lab_memory.measured_vs_predicted()} == {"CPU", "NVIDIA H200"}
    sources = lab_memory.measurement_provenance()
    assert {p.device for p in sources} >= {"NVIDIA H200"} and all(p.command for p in sources)


def test_vllm_side_and_kv_cache():
    budget = plan(vllm_gpu_memory_utilization=0.3, per_device_train_batch_size=8, num_generations=8,
                  max_prompt_length=256, max_completion_length=256)
    rows = {r.component: r.bytes for r in budget.rows}
    assert rows["vLLM weights"] == P_05B * 2
    non_kv = rows["vLLM weights"] + rows["vLLM activations"] + rows["vLLM runtime (non-torch, CUDA graphs)"]
    assert rows["vLLM KV cache"] == math.ceil(80 * GIB * 0.3) - non_kv
    assert budget.sequences_in_kv_cache == rows["vLLM KV cache"] // (12_288 * 16) // (512 // 16)
    assert budget.vllm_bytes == math.ceil(80 * GIB * 0.3)
    assert budget.free_bytes == budget.device_bytes - budget.used_bytes


def test_seed_2b_on_32gb_npu():
    seed = CONFIGS["seed-2b-shaped"]
    shape = dict(device_memory_gib=32, device_kind="npu", per_device_train_batch_size=8, num_generations=8,
                 max_prompt_length=256, max_completion_length=256)
    budget = plan_memory(seed, **shape)
    params = budget.model.num_parameters
    assert 1.95e9 < params < 2.05e9
    step = training_phases(budget.model, budget.precision, budget.shape, "npu")["optimizer step"]
    assert step["policy weights"] / 1e9 == pytest.approx(4.0, abs=0.1)  # the seed's "weights ≈ 4 GB"
    assert step["AdamW states"] / 1e9 == pytest.approx(8.0, abs=0.2)
    assert step["gradients"] / 1e9 == pytest.approx(4.0, abs=0.1)
    assert budget.fits and 0.3 <= budget.recommended.vllm_gpu_memory_utilization <= 0.4
    too_much = plan_memory(seed, vllm_gpu_memory_utilization=0.6, **shape)
    assert not too_much.fits and too_much.free_bytes < 0
    assert "vllm_gpu_memory_utilization down first" in too_much.advice
    with pytest.raises(DoesNotFitError, match="use at most 0.4"):
        too_much.check()


def test_knob_order_checkpointing_then_batch():
    no_checkpointing = plan(device_memory_gib=40, per_device_train_batch_size=64, num_generations=8,
                            max_prompt_length=512, max_completion_length=1024, gradient_checkpointing=False)
    assert not no_checkpointing.fits and "gradient_checkpointing" in no_checkpointing.advice
    big_batch = plan(CONFIGS["qwen2.5-1.5b"], device_memory_gib=24, per_device_train_batch_size=64,
                     num_generations=8, max_prompt_length=512, max_completion_length=1024)
    assert not big_batch.fits
    assert "per_device_train_batch_size first: 64 →" in big_batch.advice
    smaller = int(big_batch.advice.split("64 → ")[1].split()[0])
    assert plan(CONFIGS["qwen2.5-1.5b"], device_memory_gib=24, per_device_train_batch_size=smaller,
                num_generations=8, max_prompt_length=512, max_completion_length=1024).fits


def test_cannot_fit_at_any_batch_says_what_would():
    budget = plan(CONFIGS["qwen2.5-1.5b"], device_memory_gib=20, beta=0.04, per_device_train_batch_size=4,
                  num_generations=4)
    assert not budget.fits
    assert "Cannot fit at any batch size" in budget.advice and "It would fit with" in budget.advice
    assert "a device with at least" in budget.advice and "beta=0" in budget.advice
    assert "server mode on another device" in budget.advice
    with pytest.raises(DoesNotFitError, match="Cannot fit at any batch size"):
        budget.check()
    # each option offered really fits on its own
    assert plan(CONFIGS["qwen2.5-1.5b"], device_memory_gib=20, beta=0.0, per_device_train_batch_size=1,
                num_generations=4, gradient_checkpointing=True).fits


def test_cannot_fit_offers_only_what_would_fit():
    """Qwen2.5-3B on 24 GiB: the trainer alone is too big, so neither beta=0 nor server mode is offered as a fix."""
    budget = plan(CONFIGS["qwen2.5-3b"], device_memory_gib=24, beta=0.04, per_device_train_batch_size=4,
                  num_generations=4)
    assert not budget.fits and "a device with at least" in budget.advice
    assert "beta=0" not in budget.advice and "server mode on another device" not in budget.advice
    assert "server mode alone would not be enough: the trainer by itself peaks at" in budget.advice


@pytest.mark.parametrize("kwargs, message", [
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be a positive integer"),
    ({"max_prompt_length": -5}, "max_prompt_length must be a positive integer"),
    ({"max_completion_length": 0}, "max_completion_length must be a positive integer"),
    ({"num_generations": 1}, "num_generations=1: .* at least 2"),
    ({"beta": -0.1}, "beta must be >= 0"),
    ({"per_device_train_batch_size": 3, "num_generations": 4, "steps_per_generation": 1}, "does not divide the generation batch"),
    ({"vllm_gpu_memory_utilization": 0}, r"in \(0, 1\]"),
    ({"vllm_gpu_memory_utilization": 1.2}, r"in \(0, 1\]"),
    ({"device_memory_gib": 0}, "device_memory_gib must be a positive number"),
    ({"device_memory_gib": -8}, "device_memory_gib must be a positive number"),
    ({"device_kind": "tpu"}, "device_kind must be one of npu, cuda, cpu"),
    ({"precision": "int4"}, "Unknown precision 'int4'"),
    ({"optimizer": "sgd"}, "Only AdamW is modelled"),
    ({"margin_gib": -1}, "margin_gib must be >= 0"),
    ({"num_generation": 4}, "Unknown training field"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(MemoryPlanError, match=message):
        plan(**kwargs)


def test_bad_configs(tmp_path):
    with pytest.raises(MemoryPlanError, match="lacks intermediate_size, vocab_size"):
        ModelShape.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})
    with pytest.raises(MemoryPlanError, match="hidden_size must be a positive integer"):
        ModelShape.from_config({"hidden_size": 0, "intermediate_size": 8, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "vocab_size": 10})
    with pytest.raises(FileNotFoundError, match="No config.json"):
        ModelShape.from_config(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MemoryPlanError, match="not valid JSON"):
        ModelShape.from_config(tmp_path)


def test_default_device_memory_comes_from_device_module(monkeypatch):
    from grpo_lab import device

    monkeypatch.setattr(device, "detect", lambda: "cuda")
    monkeypatch.setattr(device, "memory_info", lambda index=0, kind=None: device.MemoryInfo(48 * GIB, 40 * GIB))
    monkeypatch.setattr(device, "bf16_supported", lambda kind=None: True)
    monkeypatch.setattr(device, "device_name", lambda index=0, kind=None: "a GPU")
    monkeypatch.delenv(device.MEMORY_CAP_ENV, raising=False)
    budget = plan_memory(QWEN_05B)
    assert budget.device_bytes == 48 * GIB and budget.device_kind == "cuda"


def test_table_text_and_html():
    budget = plan(per_device_train_batch_size=8, num_generations=8)
    text, page = str(budget), budget._repr_html_()
    for component in ("policy weights", "AdamW states", "vLLM KV cache", "runtime margin", "free"):
        assert component in text and component in page
    assert page.startswith("<table>") and "recommended: vllm_gpu_memory_utilization=" in text
    assert [r["component"] for r in budget.table()][-1] == "free"


def test_recommendation_table_covers_devices_and_models():
    models = {k: CONFIGS[k] for k in ("tiny-qwen2", "qwen2.5-0.5b", "qwen2.5-3b")}
    rows = recommendation_table(models, num_generations=8, max_prompt_length=256, max_completion_length=256)
    assert len(rows) == len(memory.COMMON_DEVICES) * 3
    h200_3b = next(r for r in rows if r["device"].startswith("H200") and r["model"] == "qwen2.5-3b")
    assert h200_3b["fits"] and 0 < h200_3b["vllm_gpu_memory_utilization"] < 1
    small_3b = next(r for r in rows if r["device"].startswith("24 GB") and r["model"] == "qwen2.5-3b")
    assert not small_3b["fits"] and "Cannot fit" in small_3b["advice"]


def test_tiny_config_matches_shipped_model():
    shipped = REPO_ROOT / "data" / "models" / "tiny-qwen2" / "config.json"
    if not shipped.is_file():
        pytest.skip("the tiny model is not built in this checkout")
    assert ModelShape.from_config(shipped, name="t") == ModelShape.from_config(CONFIGS["tiny-qwen2"], name="t")


def test_lora_trains_only_the_adapters():
    shape = ModelShape.from_config(QWEN_05B)
    h, i, q, kv, layers = 896, 4864, 896, 128, 24
    r = 16
    adapter = layers * r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))  # A and B of all seven linears
    assert shape.lora_layer_parameters(r, TrainingShape().lora_target_modules) * layers == adapter
    lora = TrainingShape(per_device_train_batch_size=4, num_generations=4, beta=0.04, lora_r=r)
    for precision, (w, g, s) in {"bf16": (2, 2, 4), "mixed": (4, 4, 8)}.items():
        step = training_phases(shape, get_precision(precision), lora, "npu")["optimizer step"]
        # frozen base (weights only), adapters with gradients and AdamW states, no reference copy (adapter off)
        assert step == {"policy weights": P_05B * w, "LoRA adapters": adapter * w, "AdamW states": adapter * s,
                        "gradients": adapter * g}
    phases = training_phases(shape, get_precision("mixed"), lora, "cuda")
    full = training_phases(shape, get_precision("mixed"), replace(lora, lora_r=0), "cuda")
    assert phases["embedding backward"]["embedding backward buffers"] < full["embedding backward"][
        "embedding backward buffers"]  # a frozen embedding: no vocab × hidden gradient
    assert max(sum(p.values()) for p in phases.values()) < max(sum(p.values()) for p in full.values()) / 2
    with pytest.raises(MemoryPlanError, match="cannot plan LoRA on lm_head"):
        shape.lora_layer_parameters(8, ("q_proj", "lm_head"))


def test_lora_dropout_keeps_each_adapters_input():
    shape = ModelShape.from_config(QWEN_05B)
    bf16 = get_precision("bf16")
    no_dropout = TrainingShape(lora_r=8, lora_target_modules=("q_proj", "down_proj"))
    with_dropout = TrainingShape(lora_r=8, lora_target_modules=("q_proj", "down_proj"), lora_dropout=0.05)
    assert memory.lora_activation_bytes_per_token_per_layer(shape, bf16, no_dropout) == 2 * 8 * 2
    assert memory.lora_activation_bytes_per_token_per_layer(shape, bf16, with_dropout) == (
        2 * 8 * 2 + 896 * (2 + 1) + 4864 * (2 + 1))


def test_sleep_mode_frees_vllm_during_the_update():
    kwargs = dict(device_memory_gib=32, device_kind="npu", precision="mixed", beta=0.04, lora_r=16,
                  per_device_train_batch_size=8, num_generations=8)
    awake = plan(CONFIGS["seed-2b-shaped"], **kwargs)
    asleep = plan(CONFIGS["seed-2b-shaped"], vllm_enable_sleep_mode=True, **kwargs)
    assert awake.fits and asleep.fits
    assert asleep.vllm_gpu_memory_utilization > awake.vllm_gpu_memory_utilization
    # the update: training peak + what a sleeping vLLM keeps + margin; the rollout: states + vLLM's whole share
    assert asleep.side_bytes("vllm") == memory.VLLM_ASLEEP_BYTES
    step = asleep.phases["optimizer step"]
    grads = training_phases(ModelShape.from_config(CONFIGS["seed-2b-shaped"]), get_precision("mixed"), asleep.shape,
                            "npu")["optimizer step"]["gradients"]
    assert asleep.rollout_bytes == step - grads + asleep.vllm_bytes
    assert asleep.rollout_bytes + asleep.side_bytes("runtime") <= asleep.device_bytes
    assert "sleep mode" in asleep.summary() and not awake.rollout_bytes


def test_seed_2b_levers_on_32_gib_with_the_course_recipe():
    plans = {p.setting: p for p in memory.lever_plans(
        CONFIGS["seed-2b-shaped"], device_memory_gib=32, device_kind="npu", precision="mixed", beta=0.04,
        per_device_train_batch_size=8, num_generations=8, max_prompt_length=256, max_completion_length=256)}
    assert [p.fits for p in plans.values()] == [False, False, True, True]
    assert plans["full fine-tuning at 0.6"].headroom_gib < 0 < plans["LoRA (r=16)"].headroom_gib
    assert "LoRA (use_peft=True" in plans["full fine-tuning at the planner's share"].advice
    rows = memory.largest_models({n: CONFIGS[n] for n in ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b")},
                                 device_gibs=(32, 80), device_kind="npu", precision="mixed", beta=0.04,
                                 num_generations=8, max_prompt_length=256, max_completion_length=256)
    assert rows[0] == {"setting": "full fine-tuning at 0.6", "32 GiB": "qwen2.5-0.5b", "80 GiB": "qwen2.5-0.5b"}
    assert rows[2]["80 GiB"] == "qwen2.5-7b"


def test_training_shape_speaks_train_configs_names():
    """max_prompt_length as in TrainConfig, through plan_memory too."""
    assert plan(max_prompt_length=128).shape.max_prompt_length == 128
    shape = TrainingShape()
    assert {name: getattr(shape, name) for name in STEP_DEFAULTS} == STEP_DEFAULTS


def test_a_plan_without_vllm_describes_the_trainer_alone():
    """A run that samples with HF generate has no vLLM engine: its summary names none and its verdict is the
    trainer's (peak and margin), not the colocated plan's."""
    budget = plan(vllm_gpu_memory_utilization=0.9)
    assert not budget.fits and budget.trainer_fits  # vLLM's 0.9 leaves the trainer too little, alone it fits
    line = budget.summary("hf")
    assert "no vLLM engine" in line and ": fits; training peak" in line
    assert "KV cache" not in line and "vllm_gpu_memory_utilization" not in line
    assert "KV cache holds" in budget.summary()
