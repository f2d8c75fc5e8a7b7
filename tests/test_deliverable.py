"""What a run keeps is what it trained: ``final/``, loaded from disk and sampled greedily with HF generate, answers as
the trainer's own model did at the end of training, for every weight trained and for LoRA (the adapter merged); a
QLoRA run's ``final/`` is its adapter, which loads on its base (CPU: the folder's form; the 4-bit load needs CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_lab import deploy, models, runs
from grpo_lab.data import load_split
from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig
from grpo_lab.rollout import open_engine
from grpo_lab.train import train

CPU = Machine("cpu", bf16=False, memory_gib=24)
STEPS = dict(profile="tiny", max_steps=2, per_device_train_batch_size=8, num_generations=4, live_plot=False,
             save_steps=100)


def greedy_in_memory(model, tokenizer, prompts: list[list[dict]], max_tokens: int) -> list[str]:
    texts = []
    model.eval()
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens, pad_token_id=tokenizer.eos_token_id)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


@pytest.mark.parametrize("lora", [False, True], ids=["every weight", "lora"])
def test_final_answers_as_the_trained_model_did(tmp_path, lora):
    config = TrainConfig(**STEPS, use_peft=lora, learning_rate=5e-3 if lora else 5e-4, output_dir=str(tmp_path / "run"))
    result = train(config, machine=CPU)
    prompts = [row["prompt"] for row in load_split("eval")[:12]]
    trained = greedy_in_memory(result.trainer.model, result.trainer.processing_class, prompts, 24)
    with open_engine(result.final_model_dir, backend="hf", n=1, temperature=0.0, max_tokens=24) as engine:
        saved = [out.completions[0].text for out in engine.generate(prompts).outputs]
    assert saved == trained
    base = greedy_in_memory(*models.load_model_and_tokenizer(config.with_profile(CPU).model), prompts, 24)
    assert trained != base  # the steps changed the answers: the comparison means something


def test_a_qlora_final_is_its_adapter_on_its_four_bit_base(tmp_path):
    """The folder a QLoRA run delivers, as the run writes it: the adapter with its base and 4-bit loading recorded;
    served on that base in 4 bits; sampled with HF generate, never a merge into the full-precision base."""
    run = tmp_path / "qlora"
    final = run / runs.FINAL
    final.mkdir(parents=True)
    (run / runs.CONFIG_FILE).write_text(json.dumps({"config": {"model": "base", "use_peft": True,
                                                               "load_in_4bit": True}}))
    (final / models.ADAPTER_CONFIG).write_text(json.dumps({"r": 16, "base_model_name_or_path": "base"}))
    (final / "adapter_model.safetensors").write_bytes(b"")
    models.write_manifest(final, {"base_model_path": "org/base", "quantization": {"load_in_4bit": True}})
    adapter = models.adapter_model(final)
    assert (adapter.base, adapter.quantization) == ("org/base", {"load_in_4bit": True})
    assert "in 4 bits" in adapter.describe()
    assert deploy.served_weights(run) == ("org/base", str(final))
    assert deploy.served_quantization(run) == "bitsandbytes"
    with pytest.raises(Exception, match="HF generate"):
        open_engine(final, backend="vllm")


def test_a_final_folder_is_saved_in_the_dtype_it_is_served_in(tmp_path):
    """A run that trained with bf16 autocast keeps fp32 master weights; its ``final/`` is cast to bf16, the dtype vLLM
    serves and HF generate evaluates it in, every floating tensor and the config alike."""
    from safetensors.torch import load_file

    model, tokenizer = models.load_model_and_tokenizer(models.TINY_MODEL_DIR, dtype="float32")
    model.save_pretrained(tmp_path)
    assert models.saved_dtype(tmp_path) == "float32"
    models.cast_weights(tmp_path, "bfloat16")
    assert models.saved_dtype(tmp_path) == "bfloat16"
    tensors = load_file(str(next(tmp_path.glob("*.safetensors"))))
    assert {str(t.dtype) for t in tensors.values() if t.is_floating_point()} == {"torch.bfloat16"}
    reloaded, _ = models.load_model_and_tokenizer(tmp_path, verify=False)
    assert next(reloaded.parameters()).dtype == torch.bfloat16


def test_trl_s_own_reward_functions_of_any_number_train(tmp_path):
    """TRL's ``trl.rewards`` beside one of your own, with no names or weights in the config: each is named after
    its function, weighted 1.0, and the run trains."""
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    def my_reward(prompts, completions, answer, **kwargs):
        return [float(str(a) in str(c)) for c, a in zip(completions, answer)]

    funcs = [my_reward, think_format_reward, get_soft_overlong_punishment(32, 8), "format"]
    result = train(TrainConfig(**{**STEPS, "max_steps": 1}, output_dir=str(tmp_path / "run")), reward_funcs=funcs,
                   machine=CPU)
    assert result.global_step == 1 and len(result.config.rewards) == 4 and result.config.reward_weights == (1.0,) * 4
    assert result.config.rewards[0] == "my_reward" and "rewards/my_reward/mean" in result.metrics[0]
