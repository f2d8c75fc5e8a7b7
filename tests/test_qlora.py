"""QLoRA (``TrainConfig(use_peft=True, load_in_4bit=True)``): checked before anything loads, planned at 4 bits, handed
to TRL as TRL takes it, served both ways. CPU only: nothing here loads bitsandbytes."""

from __future__ import annotations

import dataclasses
import inspect
import json
import warnings

import pytest

from grpo_lab import device, experiment, lora, memory, models, train
from grpo_lab.deploy import (
    FOUR_BIT_QUANTIZATION,
    DeployError,
    ServeConfig,
    served_quantization,
    served_weights,
)
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import TrainConfig, memory_budget
from grpo_lab.experiment.profiles import LORA_LEARNING_RATE_SCALE

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # its shape ships in data/configs (smollm2-135m)
CARD = Machine("cuda", bf16=True, memory_gib=16)


def qlora(**fields) -> TrainConfig:
    return TrainConfig(profile="gpu", model=SMOLLM2, use_peft=True, load_in_4bit=True, output_dir="unused", **fields)


def test_load_in_4bit_needs_lora():
    with pytest.raises(ConfigError, match="use_peft=True"):
        TrainConfig(load_in_4bit=True)
    with pytest.raises(memory.MemoryPlanError, match="lora_r > 0"):
        memory.TrainingShape(load_in_4bit=True)


@pytest.mark.parametrize("kind, why", [("cpu", "NVIDIA GPUs only"), ("npu", "no Ascend NPU backend")])
def test_refused_off_cuda_before_anything_loads(kind, why):
    with pytest.raises(ConfigError, match=why):
        qlora().resolve(Machine(kind, bf16=True, memory_gib=32))
    with pytest.raises(ConfigError, match=why):
        qlora(device=kind)
    assert device.four_bit_missing("cuda") is None


def test_the_planner_counts_a_4_bit_base():
    shape = memory.ModelShape.from_config(memory.course_configs()["qwen2.5-7b"])
    quantized = shape.quantized_parameters
    assert 0.8 * shape.num_parameters < quantized < shape.num_parameters  # the embedding and LM head stay
    four_bit = shape.weight_bytes(2, load_in_4bit=True)
    assert four_bit == pytest.approx(quantized * (0.5 + 4 / 64) + (shape.num_parameters - quantized) * 2, abs=1)
    kwargs = dict(precision="bf16", device_memory_gib=16, device_kind="cuda", per_device_train_batch_size=4,
                  num_generations=4, lora_r=16)
    lora_plan = memory.plan_memory(shape, **kwargs)
    qlora_plan = memory.plan_memory(shape, load_in_4bit=True, **kwargs)
    weights = {b.shape.load_in_4bit: next(r.bytes for r in b.rows if r.component == "policy weights")
               for b in (lora_plan, qlora_plan)}
    assert weights[True] == four_bit and weights[False] == shape.num_parameters * 2
    assert not lora_plan.fits and qlora_plan.fits
    assert any("4-bit weight dequantized" in row.component for row in qlora_plan.rows) or qlora_plan.peak_phase != \
        "layer backward"
    assert any("QLoRA" in line for line in qlora_plan.assumptions)
    vllm = memory.vllm_non_kv_bytes(shape, 2, 8, load_in_4bit=True)["vLLM weights"]
    assert vllm == four_bit  # TRL starts vLLM with quantization="bitsandbytes"
    assert "QLoRA (use_peft=True, load_in_4bit=True" in lora_plan.advice


def test_a_qlora_experiment_plans_and_trains_in_bf16():
    config = qlora().resolve(CARD)
    assert config.precision == "bf16" and config.training_shape().load_in_4bit
    assert config.planner_recipe()["load_in_4bit"] is True
    full = TrainConfig(profile="gpu", model=SMOLLM2, use_peft=True, output_dir="unused").resolve(CARD)
    assert memory_budget(config, CARD).training_peak_bytes < memory_budget(full, CARD).training_peak_bytes
    assert "4-bit base (QLoRA)" in config.step_summary()


def test_trl_gets_the_quantization_config_and_the_compute_dtype(monkeypatch):
    config = qlora().resolve(CARD)
    quantization = lora.quantization_config(config)
    assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
    assert str(quantization.bnb_4bit_compute_dtype).endswith("bfloat16")
    assert not quantization.bnb_4bit_use_double_quant  # the planner counts one fp32 scale per block
    assert lora.model_init_kwargs(config) == {"dtype": "bfloat16"}
    assert lora.model_init_kwargs(dataclasses.replace(config, bf16=False)) == {"dtype": "float16"}
    plain = dataclasses.replace(config, load_in_4bit=False)
    assert lora.quantization_config(plain) is None and lora.model_init_kwargs(plain) is None
    from trl import GRPOTrainer

    assert "quantization_config" in inspect.signature(GRPOTrainer.__init__).parameters
    assert experiment.trl_kwargs(config, True, 0.5)["model_init_kwargs"] == {"dtype": "bfloat16"}


def test_forced_lengths_reach_the_sampler():
    config = TrainConfig(profile="gpu", model=SMOLLM2, ignore_eos=True, output_dir="unused").resolve(CARD)
    assert experiment.trl_kwargs(config, True, 0.5)["generation_kwargs"] == {"ignore_eos": True}
    assert experiment.trl_kwargs(config, False, 0.5)["generation_kwargs"] == {"min_new_tokens": 256}
    plain = TrainConfig(profile="gpu", model=SMOLLM2, output_dir="unused").resolve(CARD)
    assert experiment.trl_kwargs(plain, True, 0.5)["generation_kwargs"] is None


def _run(tmp_path, four_bit: bool):
    run = tmp_path / ("qlora" if four_bit else "lora")
    (run / "adapter").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 16, "base_model_name_or_path": "base"}))
    if four_bit:  # a QLoRA run's final/: its adapter, with the 4-bit base it loads on
        (run / "final" / "adapter_config.json").write_text(json.dumps({"r": 16, "base_model_name_or_path": "base"}))
        models.write_manifest(run / "final", {"base_model_path": "base", "quantization": {"load_in_4bit": True}})
    (run / "config.json").write_text(json.dumps({"config": {"model": "base", "use_peft": True,
                                                            "load_in_4bit": four_bit}}))
    return run


def test_a_qlora_run_serves_its_adapter_on_the_4_bit_base(tmp_path):
    run = _run(tmp_path, four_bit=True)
    assert served_weights(run, adapter=True) == ("base", str(run / "adapter"))
    assert served_quantization(run, adapter=True) == served_quantization(run / "adapter", adapter=True) == "bitsandbytes"
    assert served_weights(run) == ("base", str(run / "final")) and served_quantization(run) == "bitsandbytes"
    lora_run = _run(tmp_path, four_bit=False)
    assert served_quantization(lora_run, adapter=True) is None and served_quantization(lora_run) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert served_weights(lora_run) == (str(lora_run / "final"), None)
        served_weights(run, adapter=True)
    command = ServeConfig(model="data/models/tiny-qwen2", quantization=FOUR_BIT_QUANTIZATION).command(8000)
    assert command[command.index("--quantization") + 1] == "bitsandbytes" and "--load-format" not in command
    assert "safetensors" in ServeConfig(model="data/models/tiny-qwen2").command(8000)
    with pytest.raises(DeployError, match="quantization='awq'"):
        ServeConfig(model="data/models/tiny-qwen2", quantization="awq").validate()


def test_liger_stays_off_under_a_4_bit_base(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel"
                        else find_spec(name, *a))
    assert TrainConfig(profile="gpu", model=SMOLLM2).resolve(CARD).use_liger_kernel
    assert not qlora().resolve(CARD).use_liger_kernel
    assert qlora(use_liger_kernel=True).resolve(CARD).use_liger_kernel  # asked for: as asked


def test_qlora_defaults_make_the_engine_follow_the_adapter_and_learn_at_lora_s_rate():
    """TRL's merge into 4-bit codes rounds a LoRA update away, so by default a 4-bit base sampled by the colocated
    engine hands the engine the adapter itself; merging it anyway is allowed and told before training."""
    config = qlora().resolve(CARD)
    assert config.use_vllm and config.vllm_lora_sync == "adapter" and lora.rollout_caveats(config) == []
    assert config.learning_rate == experiment.PROFILES["gpu"]["learning_rate"] * LORA_LEARNING_RATE_SCALE
    assert qlora(learning_rate=1e-5).resolve(CARD).learning_rate == 1e-5  # asked for: as asked
    merged = qlora(vllm_lora_sync="merge").resolve(CARD)
    assert lora.rollout_caveats(merged) == [lora.QLORA_ENGINE_CAVEAT] and "one 4-bit step" in lora.QLORA_ENGINE_CAVEAT
    assert lora.rollout_caveats(dataclasses.replace(merged, use_vllm=False)) == []
    asleep = qlora(vllm_enable_sleep_mode=True).resolve(CARD)  # sleep drops the base the adapter rides on
    assert asleep.vllm_lora_sync == "merge" and lora.rollout_caveats(asleep) == [lora.QLORA_ENGINE_CAVEAT]
    plain = TrainConfig(profile="gpu", model=SMOLLM2, use_peft=True, output_dir="unused").resolve(CARD)
    assert plain.vllm_lora_sync == "merge" and lora.rollout_caveats(plain) == []
    assert "rollout_caveats" in inspect.getsource(experiment.plan)
