"""Export a self-contained model folder and verify it: the files, their checksums, the weights, the tokenizer."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from grpo_lab import __version__, models
from grpo_lab.errors import DeployError


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REQUIRED_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)


def export_model(source, out_dir: str | Path, tokenizer=None, overwrite: bool = False) -> Path:
    """Write a self-contained serving folder (safetensors, tokenizer with chat template, generation config, manifest)
    from a model folder or an in-memory model (then pass its ``tokenizer``)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise DeployError(f"{out_dir} is not empty; choose a new folder or pass overwrite=True.")
        shutil.rmtree(out_dir)
    if isinstance(source, (str, Path)):
        source_name = str(source)
        model, tokenizer = models.load_model_and_tokenizer(source, verify=True)
    else:
        if tokenizer is None:
            raise DeployError("export_model(model, ...) needs the tokenizer too: "
                              "export_model(model, out, tokenizer=tok).")
        model, source_name = source, type(source).__name__
    if not getattr(tokenizer, "chat_template", None):
        raise DeployError("the tokenizer has no chat template; chat requests to the server would fail. "
                          "Set tokenizer.chat_template before exporting.")
    staging = out_dir.with_name(out_dir.name + ".partial")  # never leave a half-written export behind
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if not (staging / "generation_config.json").is_file():
        model.generation_config.save_pretrained(staging)
    models.write_manifest(staging, {
        "kind": "grpo-lab export", "source": source_name, "grpo_lab": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    staging.rename(out_dir)
    return out_dir


@dataclass
class VerifyReport:
    """What :func:`verify_export` found; ``ok`` when ``problems`` is empty."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.folder}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}"
        return "\n".join([head] + [f"  ✓ {c}" for c in self.checked] + [f"  ✗ {p}" for p in self.problems])

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise DeployError(str(self) + "\nFix: re-export the model with grpo_lab.deploy.export_model.")


def verify_export(folder: str | Path, load_weights: bool = True) -> VerifyReport:
    """Check a serving folder: required files, manifest checksums, weights load, tokenizer fits the model."""
    folder = Path(folder)
    report = VerifyReport(folder)
    if not folder.is_dir():
        report.problems.append("folder does not exist")
        return report
    for name in REQUIRED_FILES:
        present = (folder / name).is_file()
        (report.checked if present else report.problems).append(f"{name} present" if present else f"missing {name}")
    weights = sorted(folder.glob("*.safetensors"))
    if weights:
        report.checked.append(f"{len(weights)} safetensors file(s)")
    else:
        report.problems.append("missing weights: no *.safetensors file")
    pickles = [p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles:
        report.problems.append(f"pickle weights {pickles}: serve only safetensors (delete them or re-export)")
    try:
        models.verify_model_dir(folder)
        report.checked.append("manifest checksums match")
    except models.ModelIntegrityError as exc:
        listed = [line[4:] for line in str(exc).splitlines() if line.startswith("  - ")]
        # a required file reported missing above is one problem, not two
        already = {f"missing file: {name}" for name in REQUIRED_FILES if f"missing {name}" in report.problems}
        report.problems.extend([p for p in listed if p not in already] if listed else [str(exc).splitlines()[0]])
    if report.problems or not load_weights:
        return report
    try:
        model, tokenizer = models.load_model_and_tokenizer(folder, verify=False)
    except Exception as exc:
        report.problems.append(f"weights or tokenizer do not load: {type(exc).__name__}: {exc}")
        return report
    report.checked.append("weights load with transformers")
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        report.problems.append(f"tokenizer has {len(tokenizer)} tokens but the model only {rows} embedding rows")
    else:
        report.checked.append(f"tokenizer ({len(tokenizer)} tokens) fits the embedding ({rows} rows)")
    if not getattr(tokenizer, "chat_template", None):
        report.problems.append("tokenizer has no chat template")
    else:
        report.checked.append("chat template present")
    return report
