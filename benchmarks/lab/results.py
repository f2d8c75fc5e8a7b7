"""The committed GRPO experiments the course reads, each file read by one function into a small record.

* :func:`kl_brake`: ``benchmarks/kl_brake/results.json``, the tiny profile trained with ``beta = 0`` and
  ``beta > 0`` (a frozen reference model) on the same seeds;
* :func:`smollm2_run`: ``benchmarks/grpo_smollm2/`` (``results.json`` and the base model's temperature probe
  ``probe_cpu.json``), the gpu recipe on SmolLM2-135M-Instruct on a GPU;
* :func:`gsm8k_run`: ``benchmarks/gsm8k/results.json``, the gpu recipe on GSM8K with held-out accuracy before and
  after;
* :func:`course_gpu_run`: ``benchmarks/course_gpu/results/``, the whole course run on a GPU (``run.json``) and the
  training run its notebook 03 kept (``grpo-run/``).

Each record carries where it came from (a :class:`~lab.committed.Provenance`), as far as its file records it.
:mod:`lab.bench` and :mod:`lab.verl_parity` compare against the SmolLM2 run through :func:`smollm2_run` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import runs
from lab.committed import BENCHMARKS_DIR, Provenance, read_committed

KL_BRAKE_FILE = BENCHMARKS_DIR / "kl_brake" / "results.json"
GSM8K_FILE = BENCHMARKS_DIR / "gsm8k" / "results.json"
GSM8K_TRAIN_FILE = BENCHMARKS_DIR / "gsm8k" / "train.jsonl.xz"
"""GSM8K's training split as the course ships it offline (``grpo_lab.data.load_gsm8k("train", path=...)`` reads it)."""
SMOLLM2_DIR = BENCHMARKS_DIR / "grpo_smollm2"
"""The SmolLM2 run's folder: ``results.json``, ``probe_cpu.json``, ``metrics.jsonl``, ``curves.png``."""
COURSE_GPU_DIR = BENCHMARKS_DIR / "course_gpu" / "results"
"""The course's committed GPU run: ``run.json``, the executed notebooks, notebook 03's run folder ``grpo-run/``."""


@dataclass(frozen=True)
class KLBrakeRun:
    """One training run of the KL-brake comparison and how its held-out accuracy changed."""

    beta: float
    seed: int
    train_seconds: float
    kl_last_25: float | None
    """Mean KL to the reference over the last 25 steps (None with ``beta = 0``: no reference, no KL)."""
    changes: dict[str, dict[str, dict[str, float]]]
    """``{group: {measure: {"before", "after", "points"}}}``; groups ``trained``, ``untrained`` (problem types)
    and ``all``; measures ``greedy``, ``sampled_pass_at_1``, ``pass_at_k``."""

    def points(self, group: str, measure: str) -> float:
        """Change of ``measure`` on ``group`` in percentage points (after - before)."""
        return self.changes[group][measure]["points"]


@dataclass(frozen=True)
class KLBrake:
    """``beta = 0`` against ``beta > 0`` on the tiny profile: same seeds, steps and held-out problems."""

    provenance: Provenance
    max_steps: int
    seeds: tuple[int, ...]
    eval_size: int
    train_types: tuple[str, ...]
    runs: tuple[KLBrakeRun, ...]


def kl_brake(path: str | Path = KL_BRAKE_FILE) -> KLBrake:
    """The committed KL-brake comparison (``benchmarks/kl_brake/run.py`` writes it)."""
    data = read_committed(path)
    settings = data["settings"]
    runs = tuple(KLBrakeRun(beta=run["beta"], seed=run["seed"], train_seconds=run["train_seconds"],
                            kl_last_25=run["train_metrics"].get("kl_last_25"), changes=run["changes"])
                 for run in data["runs"])
    return KLBrake(provenance=Provenance(data["command"], data["date"], data["machine"]["device"], Path(path),
                                         data.get("commit", "")),
                   max_steps=settings["max_steps"], seeds=tuple(settings["seeds"]), eval_size=settings["eval_size"],
                   train_types=tuple(settings["train_types"]), runs=runs)


@dataclass(frozen=True)
class SmolLM2Run:
    """The gpu recipe on SmolLM2-135M-Instruct: the recipe, the evaluations before and after, the step timings."""

    provenance: Provenance
    """The file records its device only."""
    model: str
    versions: dict[str, str]
    recipe: dict[str, Any]
    """The TrainConfig fields the run changed from the gpu profile, as run."""
    reward_weights: tuple[float, ...]
    """Correctness, format."""
    train_langs: tuple[str, ...]
    before: dict[str, dict[str, float]]
    """Evaluation of the base model by language subset (``all``, ``en``, ``zh``): ``{subset: {measure: share}}``."""
    after: dict[str, dict[str, float]]
    evaluated: str
    """The checkpoint ``after`` evaluates."""
    note: str
    step_seconds: dict[str, dict[str, float]]
    """Mean GRPO step by rollout backend (``vllm_colocate``, ``hf_generate``): step, generation, update, reward …"""
    base_last_number_pass_at_1: dict[str, float]
    """The base model's samples right by their last number, by sampling temperature (the probe that chose T)."""
    metrics: tuple[dict[str, Any], ...]
    """The vLLM colocate run's per-step records (``metrics.jsonl``)."""
    folder: Path

    @property
    def prompts_per_step(self) -> int:
        return self.recipe["per_device_train_batch_size"] // self.recipe["num_generations"]


def smollm2_run(folder: str | Path = SMOLLM2_DIR) -> SmolLM2Run:
    """The committed SmolLM2 run (``benchmarks/grpo_smollm2/run.py`` writes ``results.json``, the training run
    ``metrics.jsonl``; the CPU probe of the base model ``probe_cpu.json``)."""
    folder = Path(folder)
    data, probe = read_committed(folder / "results.json"), read_committed(folder / "probe_cpu.json")
    return SmolLM2Run(
        provenance=Provenance("", "", data["device"], folder / "results.json"),
        model=data["model"], versions=dict(data["train_config"].get("versions", {})),
        recipe=data["recipe"], reward_weights=tuple(data["train_config"]["config"]["reward_weights"]),
        train_langs=tuple(data["train_langs"]), before=data["before"]["by_lang"], after=data["after"]["by_lang"],
        evaluated=data["after"]["model_dir"], note=data["after"].get("note", ""),
        step_seconds={backend: data[backend] for backend in ("vllm_colocate", "hf_generate")},
        base_last_number_pass_at_1={t: row["last_number_pass_at_1"] for t, row in probe["by_temperature"].items()},
        metrics=tuple(runs.read_metrics(folder / runs.METRICS_FILE)), folder=folder)


@dataclass(frozen=True)
class GSM8KRun:
    """The course's recipe trained on GSM8K: held-out greedy answers before and after training."""

    provenance: Provenance
    model: str
    steps: int
    train_rows: int
    held_out: int
    seconds: float
    accuracy: dict[str, Any]
    """The paired change of greedy accuracy: ``evaluation.Gain``'s fields, and ``describe`` (its sentence)."""
    format: dict[str, Any]
    """The same for greedy answers that end with one ``#### N`` line."""
    training: dict[str, Any]
    """The training reward and the share of groups without a signal, first and last steps; the median step."""
    lenient: dict[str, Any] | None = None
    """The same for lenient accuracy (the final number, with or without the marker); None in a record that predates
    it, where a rise of strict accuracy may be the format's."""
    sft: dict[str, dict[str, Any]] | None = None
    """Where the run fine-tuned first (``--sft-epochs``): what SFT changed, by measure (before GRPO)."""

    @property
    def learned_the_format_not_the_arithmetic(self) -> bool:
        """The ``#### N`` line rose by more than its standard error allows by chance (2), accuracy did not (lenient
        accuracy where recorded: strict accuracy rises with the format alone)."""
        return self.format["standard_errors"] >= 2 > (self.lenient or self.accuracy)["standard_errors"]


def gsm8k_run(path: str | Path = GSM8K_FILE) -> GSM8KRun | None:
    """The committed GSM8K run (``benchmarks/gsm8k/run.py`` writes it); None until one is committed."""
    if not Path(path).is_file():
        return None
    data = read_committed(path)
    return GSM8KRun(provenance=Provenance(data["command"], data["date"], data["machine"]["device"], Path(path),
                                          data.get("commit", "")),
                    model=data["model"], steps=data["steps"], train_rows=data["data"]["train_rows"],
                    held_out=data["data"]["held_out"], seconds=data["seconds"]["total_s"], accuracy=data["accuracy"],
                    format=data["format"], training=data["training"], lenient=data.get("grpo", {}).get("lenient"),
                    sft=data.get("sft", {}).get("changes"))


@dataclass(frozen=True)
class CourseRun:
    """The whole course run on a GPU (``benchmarks/course_gpu/run.sh``): its settings and notebook 03's training run."""

    provenance: Provenance
    profile: str
    model: str
    cap_gib: float | None
    """The device memory cap the course ran under (``GRPO_LAB_DEVICE_MEMORY_GIB``), None without one."""
    metrics: tuple[dict[str, Any], ...]
    """Notebook 03's per-step records (``grpo-run/metrics.jsonl``)."""
    folder: Path


def course_gpu_run(folder: str | Path = COURSE_GPU_DIR) -> CourseRun:
    """The committed GPU run of the course (``run.json``, and the training run notebook 03 kept)."""
    folder = Path(folder)
    meta = read_committed(folder / "run.json")
    return CourseRun(provenance=Provenance(meta["command"], meta["started"], meta["device"].split(", ")[0],
                                           folder / "run.json", meta.get("commit", "")),
                     profile=meta["profile"], model=meta["model"], cap_gib=meta.get("cap_gib"),
                     metrics=tuple(runs.read_metrics(folder / "grpo-run")), folder=folder)
