"""Which model to use, checking a model folder against its manifest, loading it, and a quick accuracy check.

The default model is the tiny Qwen2 the repository builds and ships (``data/models/tiny-qwen2``). Choose
another with an argument or ``GRPO_LAB_MODEL`` (a hub id or a local folder)::

    >>> from grpo_lab.models import load_model_and_tokenizer, evaluate_accuracy
    >>> from grpo_lab.data import load_split
    >>> model, tokenizer = load_model_and_tokenizer()          # verifies the manifest first
    >>> report = evaluate_accuracy(model, tokenizer, load_split("eval")[:8], num_samples=2)
    >>> 0.0 <= report.greedy <= 1.0
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from grpo_lab.rewards import is_correct

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_DIR = REPO_ROOT / "data" / "models" / "tiny-qwen2"
MANIFEST_NAME = "manifest.json"
MODEL_ENV_VAR = "GRPO_LAB_MODEL"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
REBUILD_HINT = ("restore the shipped files with `git checkout -- data/models/tiny-qwen2` "
                "or rebuild the model with `grpo-lab build-tiny-model`")


class ModelIntegrityError(RuntimeError):
    """A model folder does not match its manifest (missing, altered or unexpected files)."""


# --------------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------------
def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_files(model_dir: Path) -> list[str]:
    return sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*")
                  if p.is_file() and p.name != MANIFEST_NAME)


def write_manifest(model_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``manifest.json``: ``info`` plus the size and sha256 of every other file in the folder."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"no model folder at {model_dir}")
    files = {name: {"sha256": file_sha256(model_dir / name), "bytes": (model_dir / name).stat().st_size}
             for name in _model_files(model_dir)}
    manifest_path = model_dir / MANIFEST_NAME
    manifest_path.write_text(json.dumps({**info, "files": files}, indent=2, ensure_ascii=False) + "\n",
                             encoding="utf-8")
    return manifest_path


def _fix_hint(model_dir: Path) -> str:
    if model_dir.resolve() == TINY_MODEL_DIR.resolve():
        return REBUILD_HINT
    return (f"restore or re-export the model into {model_dir}, or, if you changed it on purpose, "
            f"rewrite its manifest with grpo_lab.models.write_manifest")


def verify_model_dir(model_dir: str | Path = TINY_MODEL_DIR) -> dict[str, Any]:
    """Check every file listed in the manifest (present, same sha256) and that no unlisted weights exist.

    Returns the manifest. Raises :class:`ModelIntegrityError` listing every problem and how to fix it.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelIntegrityError(f"model folder {model_dir} does not exist; {_fix_hint(model_dir)}")
    manifest_path = model_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ModelIntegrityError(f"{model_dir} has no {MANIFEST_NAME}; {_fix_hint(model_dir)}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        listed = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ModelIntegrityError(f"{manifest_path} is not a valid manifest ({error}); {_fix_hint(model_dir)}")
    problems = []
    for name, expected in sorted(listed.items()):
        path = model_dir / name
        if not path.is_file():
            problems.append(f"missing file: {name}")
        elif file_sha256(path) != expected["sha256"]:
            problems.append(f"altered file (sha256 differs from the manifest): {name}")
    for name in _model_files(model_dir):
        if name not in listed and name.endswith(WEIGHT_SUFFIXES):
            problems.append(f"unexpected weights file not in the manifest: {name}")
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ModelIntegrityError(f"model folder {model_dir} does not match its manifest:\n{lines}\n"
                                  f"Fix: {_fix_hint(model_dir)}")
    return manifest


def require_safetensors(model_dir: str | Path) -> None:
    """Refuse a model folder without ``*.safetensors`` weights: grpo-lab loads weights only from safetensors
    (pickle files such as ``pytorch_model.bin`` can run code while they are loaded)."""
    folder = Path(model_dir)
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    found = f" (only pickle weights: {', '.join(pickles)})" if pickles else ""
    raise FileNotFoundError(
        f"{folder} has no *.safetensors weights{found}; grpo-lab loads weights only from safetensors. Pass the "
        f"folder that holds model.safetensors, or, if you trust where the pickle files come from, convert them once: "
        f"AutoModelForCausalLM.from_pretrained(folder, use_safetensors=False).save_pretrained(folder).")


# --------------------------------------------------------------------------------------------------
# Choosing and loading
# --------------------------------------------------------------------------------------------------
def resolve_model(name: str | os.PathLike[str] | None = None) -> str:
    """The model to use: ``name`` if given, else ``$GRPO_LAB_MODEL``, else the shipped tiny model.

    Returns an absolute folder path for local models, the hub id unchanged otherwise.
    """
    chosen = name if name not in (None, "") else os.environ.get(MODEL_ENV_VAR) or TINY_MODEL_DIR
    path = Path(chosen).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model path {path} is a file; pass the folder that holds config.json")
        return str(path.resolve())
    text = str(chosen)
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text:  # a path, not "org/name"
        hint = REBUILD_HINT if path.resolve() == TINY_MODEL_DIR.resolve() else "check the path or the spelling"
        raise FileNotFoundError(f"model folder {text} does not exist; {hint}")
    return text


def load_model_and_tokenizer(name_or_path: str | os.PathLike[str] | None = None, device: str = "cpu",
                             dtype: Any = None, trust_remote_code: bool = False, verify: bool = True):
    """Load ``(model, tokenizer)`` from safetensors only, in eval mode, on ``device``.

    A local folder with a ``manifest.json`` is verified first (``verify=False`` skips it). ``dtype`` is a
    torch dtype or its name (``"float32"``, ``"bfloat16"``); None keeps the saved one.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name_or_path)
    if verify and (Path(resolved) / MANIFEST_NAME).is_file():
        verify_model_dir(resolved)
    if Path(resolved).is_dir():
        require_safetensors(resolved)
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")
        dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype if dtype is not None else "auto",
                                                 use_safetensors=True, trust_remote_code=trust_remote_code)
    return model.to(device).eval(), tokenizer


# --------------------------------------------------------------------------------------------------
# Quick accuracy check with HF generate
# --------------------------------------------------------------------------------------------------
def generate_completions(model, tokenizer, prompts: Sequence[list[dict[str, str]]], num_samples: int = 1,
                         temperature: float = 0.0, max_new_tokens: int = 48, batch_size: int = 64,
                         seed: int = 0, progress: bool = False) -> list[list[str]]:
    """``num_samples`` completions per chat prompt with HF ``generate`` (greedy when ``temperature`` is 0)."""
    import torch

    if temperature == 0.0 and num_samples != 1:
        raise ValueError("greedy decoding gives one completion per prompt; use num_samples=1 or temperature > 0")
    torch.manual_seed(seed)
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: list[list[str]] = [[] for _ in texts]
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {
        "do_sample": False}
    try:
        starts = range(0, len(order), batch_size)
        for start in tqdm(starts, desc="generate", disable=not progress):
            batch = order[start:start + batch_size]
            encoded = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True,
                                add_special_tokens=False).to(model.device)
            with torch.no_grad():
                output = model.generate(**encoded, max_new_tokens=max_new_tokens, num_return_sequences=num_samples,
                                        pad_token_id=tokenizer.pad_token_id, **sampling)
            decoded = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
            for j, i in enumerate(batch):
                results[i] = decoded[j * num_samples:(j + 1) * num_samples]
    finally:
        tokenizer.padding_side = padding_side
    return results


@dataclass
class AccuracyReport:
    """Exact-answer accuracy: greedy, sampled pass@1 (mean over k samples) and pass@k, overall and per type."""

    greedy: float
    sampled_pass_at_1: float
    pass_at_k: float
    k: int
    temperature: float
    count: int
    per_type: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """A plain-text table, one line per type and one for all."""
        head = f"{'type':<22}{'n':>5}{'greedy':>9}{'pass@1':>9}{f'pass@{self.k}':>9}"
        rows = [f"{name:<22}{int(m['count']):>5}{m['greedy']:>9.1%}{m['sampled_pass_at_1']:>9.1%}"
                f"{m['pass_at_k']:>9.1%}" for name, m in sorted(self.per_type.items())]
        rows.append(f"{'all':<22}{self.count:>5}{self.greedy:>9.1%}{self.sampled_pass_at_1:>9.1%}"
                    f"{self.pass_at_k:>9.1%}")
        return "\n".join([head, *rows])


def evaluate_accuracy(model, tokenizer, rows: Sequence[dict[str, Any]], num_samples: int = 8,
                      temperature: float = 1.0, max_new_tokens: int = 48, batch_size: int = 64, seed: int = 0,
                      progress: bool = False) -> AccuracyReport:
    """Greedy accuracy plus sampled pass@1 / pass@k (k = ``num_samples``) on rows with ``prompt``/``answer``.

    A completion is right by :func:`grpo_lab.rewards.is_correct`.
    """
    if not rows:
        raise ValueError("no rows to evaluate")
    prompts = [row["prompt"] for row in rows]
    greedy = generate_completions(model, tokenizer, prompts, 1, 0.0, max_new_tokens, batch_size, seed, progress)
    sampled = generate_completions(model, tokenizer, prompts, num_samples, temperature, max_new_tokens,
                                   max(1, batch_size // num_samples), seed, progress)
    return accuracy_report(rows, [g[0] for g in greedy], sampled, temperature)


def accuracy_report(rows: Sequence[dict[str, Any]], greedy_texts: Sequence[str],
                    sampled_texts: Sequence[Sequence[str]], temperature: float) -> AccuracyReport:
    """Greedy accuracy, pass@1 (mean over each row's samples) and pass@k, overall and per problem type.

    A completion is right by :func:`grpo_lab.rewards.is_correct` (the number after its last ``####``).
    """
    scores: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for row, greedy_text, samples in zip(rows, greedy_texts, sampled_texts, strict=True):
        hits = [is_correct(text, row["answer"]) for text in samples]
        score = (float(is_correct(greedy_text, row["answer"])), sum(hits) / len(hits), float(any(hits)))
        scores[row.get("type", "all")].append(score)

    def summary(values: list[tuple[float, float, float]]) -> dict[str, float]:
        n = len(values)
        return {"count": n, "greedy": sum(v[0] for v in values) / n,
                "sampled_pass_at_1": sum(v[1] for v in values) / n, "pass_at_k": sum(v[2] for v in values) / n}

    overall = summary([v for values in scores.values() for v in values])
    return AccuracyReport(greedy=overall["greedy"], sampled_pass_at_1=overall["sampled_pass_at_1"],
                          pass_at_k=overall["pass_at_k"], k=len(sampled_texts[0]), temperature=temperature,
                          count=len(rows), per_type={name: summary(v) for name, v in scores.items()})
