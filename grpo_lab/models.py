"""Model folders: which model to use, checking a folder against its manifest of checksums, and loading it.

The default model is the tiny Qwen2 the repository builds and ships (``data/models/tiny-qwen2``). Choose
another with an argument or ``GRPO_LAB_MODEL`` (a hub id or a local folder)::

    >>> from grpo_lab.models import load_model_and_tokenizer
    >>> model, tokenizer = load_model_and_tokenizer()          # verifies the manifest first
    >>> model.config.model_type
    'qwen2'
"""

from __future__ import annotations

__all__ = [
    "MODEL_ENV_VAR", "load_model_and_tokenizer", "read_manifest", "resolve_model", "saved_dtype", "verify_model_dir",
    "weights_digest",
]

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, GrpoLabError, MissingFileError
from grpo_lab.paths import TINY_MODEL_DIR

MANIFEST_NAME = "manifest.json"
MODEL_ENV_VAR = "GRPO_LAB_MODEL"
"""The variable that replaces the profile's model (a hub id or a local folder)."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
REBUILD_HINT = ("restore the shipped files with `git checkout -- data/models/tiny-qwen2` "
                "or rebuild the model with `grpo-lab build-tiny-model`")


class ModelIntegrityError(GrpoLabError, RuntimeError):
    """A model folder does not match its manifest (missing, altered or unexpected files)."""


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
        raise MissingFileError(f"no model folder at {model_dir}")
    files = {name: {"sha256": file_sha256(model_dir / name), "bytes": (model_dir / name).stat().st_size}
             for name in _model_files(model_dir)}
    manifest_path = model_dir / MANIFEST_NAME
    manifest_path.write_text(json.dumps({**info, "files": files}, indent=2, ensure_ascii=False) + "\n",
                             encoding="utf-8")
    return manifest_path


@dataclass(frozen=True)
class ModelManifest:
    """What a model folder's ``manifest.json`` says of the model (the shipped tiny model has one; yours need not)."""

    name: str
    rebuild: str  # the command that rebuilds the model: where it came from
    device: str
    parameters: int | None
    deliberate_slip: str | None
    """The mistake planted in part of its fine-tuning targets, in words (GRPO is to remove it)."""
    slip_types: tuple[str, ...]
    languages: tuple[str, ...]  # the languages it reads; empty: any
    train_sha256: str | None  # the sha256 of the training file it was fine-tuned on
    files: dict[str, dict[str, Any]]  # ``{name: {"sha256", "bytes"}}`` of every other file of the folder


def _load_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The one reader of ``manifest.json``: its contents, None where there is none; one that does not parse raises."""
    path = model_dir / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw.get("files"), dict):
            raise TypeError("no 'files' table")
        return raw
    except (json.JSONDecodeError, AttributeError, TypeError) as error:
        raise ModelIntegrityError(f"{path} is not a valid manifest ({error}); {_fix_hint(model_dir)}") from error


def read_manifest(model_dir: str | Path) -> ModelManifest | None:
    """The manifest of a model folder as a record, or None where there is none (a hub id, a model of your own)."""
    raw = _load_manifest(Path(model_dir))
    if raw is None:
        return None
    recipe = raw.get("recipe") or {}
    return ModelManifest(
        name=raw.get("name", Path(model_dir).name), rebuild=raw.get("rebuild", ""),
        device=(raw.get("machine") or {}).get("device", ""), parameters=raw.get("parameters"),
        deliberate_slip=raw.get("deliberate_slip"), slip_types=tuple(recipe.get("slip_types") or ()),
        languages=tuple(raw.get("languages") or ()),
        train_sha256=((raw.get("data") or {}).get("train") or {}).get("sha256"), files=raw["files"])


def _fix_hint(model_dir: Path) -> str:
    if model_dir.resolve() == TINY_MODEL_DIR.resolve():
        return REBUILD_HINT
    return (f"restore or re-export the model into {model_dir}, or, if you changed it on purpose, "
            f"rewrite its manifest with grpo_lab.models.write_manifest")


def verify_model_dir(model_dir: str | Path = TINY_MODEL_DIR) -> dict[str, Any]:
    """Check the files the manifest lists (present, same sha256) and no unlisted weights; return it."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelIntegrityError(f"model folder {model_dir} does not exist; {_fix_hint(model_dir)}")
    manifest = _load_manifest(model_dir)
    if manifest is None:
        raise ModelIntegrityError(f"{model_dir} has no {MANIFEST_NAME}; {_fix_hint(model_dir)}")
    listed = manifest["files"]
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
    raise MissingFileError(
        f"{folder} has no *.safetensors weights{found}; grpo-lab loads weights only from safetensors. Pass the "
        f"folder that holds model.safetensors, or, if you trust where the pickle files come from, convert them once: "
        f"AutoModelForCausalLM.from_pretrained(folder, use_safetensors=False).save_pretrained(folder).")


def resolve_model(name: str | os.PathLike[str] | None = None) -> str:
    """``name``, else ``$GRPO_LAB_MODEL``, else the tiny model: a local folder's absolute path or a hub id."""
    chosen = name if name not in (None, "") else os.environ.get(MODEL_ENV_VAR) or TINY_MODEL_DIR
    path = Path(chosen).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"model path {path} is a file; pass the folder that holds config.json")
        return str(path.resolve())
    text = str(chosen)
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text:  # a path, not "org/name"
        hint = REBUILD_HINT if path.resolve() == TINY_MODEL_DIR.resolve() else "check the path or the spelling"
        raise MissingFileError(f"model folder {text} does not exist; {hint}")
    return text


ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class AdapterModel:
    """A LoRA adapter folder that stands for a model: PEFT's adapter on its base (QLoRA: in 4 bits)."""

    folder: Path
    base: str
    quantization: dict[str, Any] | None
    """transformers' ``BitsAndBytesConfig`` fields the base is loaded with (None: as saved)."""

    def describe(self) -> str:
        how = "in 4 bits" if self.quantization else "as saved"
        return f"the LoRA adapter {self.folder.name}/ on its base {self.base} ({how})"


def adapter_model(folder: str | os.PathLike[str]) -> AdapterModel | None:
    """The adapter a folder holds (``adapter_config.json``) with its base; None for a plain model folder or a hub id."""
    path = Path(folder)
    if not (path / ADAPTER_CONFIG).is_file():
        return None
    manifest = _load_manifest(path) or {}
    base = (manifest.get("base_model_path")
            or json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"])
    return AdapterModel(path, str(base), manifest.get("quantization"))


def load_model_and_tokenizer(name_or_path: str | os.PathLike[str] | None = None, device: str = "cpu",
                             dtype: Any = None, trust_remote_code: bool = False, verify: bool = True):
    """Load ``(model, tokenizer)`` from safetensors only, in eval mode, on ``device``, verifying a ``manifest.json``
    first; ``dtype``: a torch dtype or its name (None: as saved). An adapter folder loads on its base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name_or_path)
    if verify and (Path(resolved) / MANIFEST_NAME).is_file():
        verify_model_dir(resolved)
    if Path(resolved).is_dir():
        require_safetensors(resolved)
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ConfigError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")
        dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    dtype = "auto" if dtype is None else dtype
    adapter = adapter_model(resolved)
    if adapter is None:
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype, use_safetensors=True,
                                                     trust_remote_code=trust_remote_code)
        return model.to(device).eval(), tokenizer
    from peft import PeftModel
    from transformers import BitsAndBytesConfig

    quantized = adapter.quantization is not None
    base = AutoModelForCausalLM.from_pretrained(
        resolve_model(adapter.base), dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
        device_map={"": device} if quantized else None,
        quantization_config=BitsAndBytesConfig(**adapter.quantization) if quantized else None)
    model = PeftModel.from_pretrained(base if quantized else base.to(device), resolved,
                                      trust_remote_code=trust_remote_code)
    return model.eval(), tokenizer


def saved_dtype(model_dir: str | Path) -> str:
    """The dtype a model folder's config says its weights are saved in (``"float32"``, ``"bfloat16"`` ...)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def cast_weights(model_dir: str | Path, dtype: str) -> None:
    """Rewrite a model folder's floating-point safetensors weights, and its config's dtype, in ``dtype``."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    for path in Path(model_dir).glob("*.safetensors"):
        tensors = {name: t.to(target) if t.is_floating_point() else t for name, t in load_file(str(path)).items()}
        save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = Path(model_dir) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["dtype"] = dtype
    config.pop("torch_dtype", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def weights_digest(model_dir: str | Path) -> str:
    """sha256 over a folder's weights, tensor by tensor: the same model gives it however it is split."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MissingFileError(f"{model_dir} has no *.safetensors weights to compare")
    tensors = {name: tensor for path in files for name, tensor in load_file(str(path)).items()}
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
