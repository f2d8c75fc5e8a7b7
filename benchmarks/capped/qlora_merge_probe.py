"""What TRL's colocated vLLM engine can be sent of a QLoRA adapter (CPU, bitsandbytes 0.50.2, SmolLM2-135M).

TRL 1.16 syncs a PEFT policy to its colocated vLLM engine by merging the adapter into the base
(``model.merge_adapter()``), sending every base parameter, then unmerging. On a 4-bit NF4 base, peft's merge
dequantizes each weight, adds the LoRA delta and quantizes the sum again (blocks of 64, new scales); the parameter
sent is the packed 4-bit codes (the scales are not parameters). This probe trains a LoRA (r=16, alpha 32, all
linear layers) on the 4-bit SmolLM2 for ``--steps`` AdamW steps at ``--lr`` (the ``qlora`` job's 50 and 2e-4; a
language-model loss on the course's training answers stands in for GRPO's: an AdamW update is about the learning rate
in size either way), then does peft's merge arithmetic with bitsandbytes' own ``quantize_4bit`` /
``dequantize_4bit`` on the base's codes as they were loaded, and compares, in float32 copies of the model (no 4-bit
kernel in the forward: bitsandbytes' CPU backend repacks codes for its own kernels), the logits on held-out prompts of:

- the 4-bit base (what the engine starts with);
- the trained policy, the 4-bit base plus the adapter's delta (what the trainer trains and saves);
- the merged weights, quantized again (the most an engine could be sent).

"kept" is the share of the adapter's effect that the merged weights keep (1: all of it, 0: none), on the logits and
on the weights; "codes changed" is the share of 4-bit codes the merge changed. What vLLM then does with codes sent
without their scales needs the GPU.

    PYTHONPATH=<bitsandbytes 0.50.2> python benchmarks/capped/qlora_merge_probe.py --model /tmp/grpo-smollm2/model \\
        --out benchmarks/capped/results/qlora_merge_probe.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
QUANT_TYPE, BLOCK = "nf4", 64


def encode(tokenizer, rows: list[dict], with_answer: bool) -> list[torch.Tensor]:
    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
             + (row["completion"] + tokenizer.eos_token if with_answer else "") for row in rows]
    return [torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]]) for text in texts]


def logits_with(model, weights: dict[str, torch.Tensor], batches: list[torch.Tensor]) -> torch.Tensor:
    """The float32 model's last-token logits with its linear layers' weights set to ``weights``."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, weight in weights.items():
            modules[name].weight.copy_(weight)
        return torch.cat([model(ids).logits[0, -1:] for ids in batches])


def requantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """peft's merge on a 4-bit weight: quantize the sum again (bf16 in, NF4 blocks of 64); its codes and values."""
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    codes, state = quantize_4bit(weight.to(torch.bfloat16), blocksize=BLOCK, quant_type=QUANT_TYPE)
    return codes, dequantize_4bit(codes, state).float()


def main() -> int:
    from bitsandbytes.functional import dequantize_4bit
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from grpo_lab.data import load_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/tmp/grpo-smollm2/model")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--probe-prompts", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    began = time.time()
    english = {split: [row for row in load_split(split) if row["lang"] == "en"] for split in ("train", "eval")}
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANT_TYPE, bnb_4bit_compute_dtype=torch.bfloat16)
    policy = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=quant, device_map="cpu",
                                                  dtype=torch.bfloat16)
    base = {name: (module.weight.data.clone(), dequantize_4bit(module.weight.data, module.weight.quant_state).float())
            for name, module in policy.named_modules() if type(module).__name__ == "Linear4bit"}  # codes as loaded
    policy = get_peft_model(policy, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                               task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.lr)
    losses = []
    for step in range(args.steps):
        rows = [english["train"][(step * args.batch + i) % len(english["train"])] for i in range(args.batch)]
        loss = sum(policy(ids, labels=ids).loss for ids in encode(tokenizer, rows, with_answer=True)) / args.batch
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 4))
        print(f"step {step + 1}/{args.steps}: loss {loss.item():.4f}", flush=True)
    modules = dict(policy.named_modules())
    with torch.no_grad():
        deltas = {name: modules[f"base_model.model.{name}"].get_delta_weight("default").float() for name in base}

    trained, merged, changed, codes = {}, {}, 0, 0
    for name, (base_codes, base_values) in base.items():
        trained[name] = base_values + deltas[name]
        merged_codes, merged[name] = requantize(trained[name])
        changed += int((merged_codes != base_codes).sum())
        codes += base_codes.numel()
    del policy
    full = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    probes = encode(tokenizer, english["eval"][:args.probe_prompts], with_answer=False)
    logits = {label: logits_with(full, weights, probes) for label, weights in
              (("base", {n: v for n, (_, v) in base.items()}), ("trained", trained), ("merged", merged))}
    effect = logits["trained"] - logits["base"]
    delta_sq = sum(float((d * d).sum()) for d in deltas.values())
    along = sum(float(((merged[n] - base[n][1]) * deltas[n]).sum()) for n in base)
    numel = sum(d.numel() for d in deltas.values())
    record = {
        "command": " ".join(["python", *sys.argv]), "model": Path(args.model).name, "steps": args.steps,
        "lr": args.lr, "batch": args.batch, "probe_prompts": len(probes), "losses": losses,
        "torch": torch.__version__, "host": platform.machine(), "seconds": round(time.time() - began, 1),
        "lora_delta_rms": delta_sq ** 0.5 / numel ** 0.5,
        "base_weight_rms": (sum(float((v * v).sum()) for _, v in base.values()) / numel) ** 0.5,
        "adapter_effect_logit_rms": float(effect.pow(2).mean().sqrt()),
        "kept_by_merged_logits": round(float(((logits["merged"] - logits["base"]) * effect).sum()
                                             / effect.pow(2).sum()), 4),
        "kept_by_merged_weights": round(along / delta_sq, 4),
        "codes_changed_by_merge": round(changed / codes, 5),
        "next_token_same_as_trained": {label: round(float((logits[label].argmax(-1)
                                                           == logits["trained"].argmax(-1)).float().mean()), 4)
                                       for label in ("base", "merged")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "losses"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
