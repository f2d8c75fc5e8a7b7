"""A model folder for memory measurements: random weights of a given config.json shape plus a tokenizer.

Memory does not depend on the weights' values, only on the shape, so measurements use random weights. The
tokenizer is the course's tiny tokenizer (``data/models/tiny-qwen2``) when it is there — its ids fit inside
any larger vocabulary — otherwise a byte-level stand-in with the same chat format.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = REPO_ROOT / "data" / "models" / "tiny-qwen2"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tokenizer():
    """The shipped tiny tokenizer, or a byte-level stand-in (259 ids) with the same special tokens."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (TINY_MODEL_DIR / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *sorted(alphabet)])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=SPECIAL_TOKENS[1], eos_token=SPECIAL_TOKENS[2],
                                  pad_token=SPECIAL_TOKENS[0])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_random_model(config_path: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``out_dir`` with random weights of the config's shape, the tokenizer and the config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    values = {k: v for k, v in json.loads(Path(config_path).read_text()).items() if not k.startswith("_")}
    tok = tokenizer()
    if len(tok) > values["vocab_size"]:
        raise ValueError(f"The tokenizer has {len(tok)} ids but {config_path} only {values['vocab_size']}.")
    values.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = AutoConfig.for_model(**values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
