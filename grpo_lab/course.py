"""Run the course headless (``make course``): every notebook in order, each in its own kernel with
``GRPO_LAB_RUN_DIR`` at the run folder, which keeps the executed copies and ``summary.json`` (rows of earlier parts
too). A failure stops the rest unless ``--keep-going``. Also: where to go next, with the models that fit a device.
"""

from __future__ import annotations

__all__ = ["LEARNER_MODELS", "REOPEN", "course_notebooks", "next_commands"]

import argparse
import ast
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from grpo_lab import device, experiment, memory, runs
from grpo_lab.device import Machine
from grpo_lab.experiment import PROFILE_DEVICE, TrainConfig
from grpo_lab.memory.sampler import DeviceMemorySampler, gib
from grpo_lab.paths import REPO_ROOT

NOTEBOOK_DIR = REPO_ROOT / "notebooks"

# (goal, notebook topic: its file name after the number, what to change there)
_REOPEN_TOPICS = (
    ("train a real model on your GPU or NPU", "grpo_training",
     "set GRPO_LAB_PROFILE and GRPO_LAB_MODEL before starting Jupyter: the same cells train it, plot the curves and "
     "evaluate before and after"),
    ("fit a larger model, or more completions per step", "memory_budget",
     "the planner with your model and device memory: vLLM's share, the micro-batch, gradient checkpointing"),
    ("your own problems, your own reward, or a real task (GSM8K)", "bring_your_own",
     "JSONL rows in the course's format, register_reward, data.load_gsm8k, and grpo-lab doctor on the experiment"),
    ("a reward that cannot be gamed", "reward_design",
     "score the completions your model really writes; watch for a reward that outvotes correctness"),
    ("pick the sampling settings (temperature, n, lengths)", "vllm_smoke",
     "sample your model's answers at a few temperatures: GRPO needs groups that disagree"),
    ("serve what you trained", "deployment", "export, verify, serve and load-test the run's final model"),
    ("find out what limits your step", "performance", "generation or update: the measured split and the roofline"),
    ("more than one device", "scale_out", "server mode, asynchronous GRPO, or an export to verl"),
    ("teach the model to call a tool", "tools",
     "register your tool (tools.register_tool), prime the call format, then TrainConfig(tools=...) with GRPO"),
    ("a new machine or a new version stack", "environment", "the environment report and the smoke test"),
)


def _notebook_stem(topic: str, directory: Path = NOTEBOOK_DIR) -> str:
    """The name (stem) of the course notebook on ``topic``, whatever its number; the topic where none is."""
    found = sorted(directory.glob(f"[0-9][0-9]_{topic}.ipynb"))
    return found[0].stem if found else topic


REOPEN: tuple[tuple[str, str, str], ...] = tuple((goal, _notebook_stem(topic), what)
                                                 for goal, topic, what in _REOPEN_TOPICS)
"""(goal, notebook, what to change there); every notebook and ``grpo-lab`` subcommand named exists (tested)."""

LEARNER_MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct",
                  "Qwen/Qwen2.5-7B-Instruct")
"""Hub models anyone can download, smallest first; their ``config.json`` ships with the course (planned offline)."""
TYPICAL_DEVICE_GIB = {"gpu": (16, 24, 80), "npu": (32, 64)}
"""The device sizes planned for, by profile, on a machine that has none of that kind."""


@dataclass(frozen=True)
class ModelFit:
    """The largest of :data:`LEARNER_MODELS` whose profile experiment the memory planner fits on a device."""

    profile: str
    memory_gib: float
    model: str
    use_peft: bool
    training_peak_gib: float

    def train_command(self, max_steps: int = 300) -> str:
        lora = " --use-peft true" if self.use_peft else ""
        return f"grpo-lab train --profile {self.profile} --model {self.model}{lora} --max-steps {max_steps}"


def largest_fitting_model(profile: str, memory_gib: float, use_peft: bool = False) -> ModelFit | None:
    """The largest of :data:`LEARNER_MODELS` whose resolved experiment fits on one device of ``memory_gib``."""
    machine = Machine(PROFILE_DEVICE[profile], bf16=True, memory_gib=memory_gib)
    for model in reversed(LEARNER_MODELS):
        try:
            config = TrainConfig(profile=profile, model=model, use_peft=use_peft).resolve(machine)
        except memory.MemoryPlanError:
            continue
        budget = experiment.memory_budget(config, machine)
        if budget.fits:
            return ModelFit(profile, memory_gib, model, use_peft, round(budget.training_peak_bytes / 2**30, 1))
    return None


def _device_commands(profile: str, memory_gib: float, where: str) -> list[tuple[str, str]]:
    full, lora = largest_fitting_model(profile, memory_gib), largest_fitting_model(profile, memory_gib, use_peft=True)
    if full is None and lora is None:
        return [(f"grpo-lab doctor --profile {profile}",
                 f"{where}: no model of {', '.join(LEARNER_MODELS)} fits this recipe, even with LoRA; the doctor's "
                 "memory plan says what would")]
    best = lora if full is None or LEARNER_MODELS.index(lora.model) > LEARNER_MODELS.index(full.model) else full
    how = "with LoRA" if best.use_peft else "fine-tuning every weight"
    also = f"; every weight: {full.model.split('/')[-1]}" if full is not None and best is not full else ""
    commands = [(best.train_command(), f"{where}: the largest model the memory planner fits, {how} (training peak "
                                       f"{best.training_peak_gib:g} GiB{also})")]
    if full is not None:  # the course's notebooks train every weight: the smallest model, which the planner fits
        commands.insert(0, (f"GRPO_LAB_PROFILE={profile} GRPO_LAB_MODEL={LEARNER_MODELS[0]} make course",
                            f"{where}: the whole course with a real model (any local folder or hub id)"))
    return commands


def next_commands(machine: Machine) -> list[tuple[str, str]]:
    """``(command, why)`` to run after the course, with the models the memory planner fits on this device, or on a
    CPU for the ``gpu`` and ``npu`` profiles on devices of the sizes in :data:`TYPICAL_DEVICE_GIB`."""
    kind = machine.kind
    here = not device.is_cpu(kind)
    own_size = machine.memory_gib if here else None
    commands = []
    for name in [n for n, of in PROFILE_DEVICE.items() if of == kind] if here else list(TYPICAL_DEVICE_GIB):
        commands.append((f"grpo-lab doctor --profile {name}", f"{name}: the stack, the device and the profile "
                                                              "checked before a long run"))
        for size in (own_size,) if own_size else TYPICAL_DEVICE_GIB[name]:
            where = f"this device ({size:.0f} GiB)" if own_size else f"{name.upper()} with {size:g} GiB"
            commands += _device_commands(name, size, where)
    return commands


@dataclass
class NotebookResult:
    notebook: str
    status: str  # "ok" | "failed" | "not run"
    seconds: float
    executed_copy: str | None = None
    error: str | None = None
    runs: list[str] = field(default_factory=list)
    """The GRPO runs this notebook trained or used, e.g. ``"trained grpo-tiny-<time>"``."""
    max_allocated_gib: float | None = None
    """torch's peak allocated in the kernel; None where it never used the device."""
    device_used_gib: float | None = None
    """The driver's peak for the kernel and the processes it started (:class:`~grpo_lab.memory.DeviceMemorySampler`)."""


KERNEL_PEAK_EXPRESSION = (
    "(lambda torch: torch.cuda.max_memory_allocated() if torch is not None and torch.cuda.is_initialized() else None)"
    "(__import__('sys').modules.get('torch'))")
"""What the runner asks a kernel after its last cell: torch's peak allocated, without importing torch there."""


class MeasuredClient(NotebookClient):
    """nbclient's client that also samples the device memory of the kernel's process tree and asks torch's peak."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampler = DeviceMemorySampler(kind=device.detect())
        self.torch_peak_bytes: int | None = None

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        await super().async_start_new_kernel(**kwargs)
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid:
            self.sampler.start(pid)

    async def _async_cleanup_kernel(self) -> None:
        if self.kc is not None and self.torch_peak_bytes is None and device.is_cuda(self.sampler.kind):
            self.torch_peak_bytes = await self._ask_torch_peak()
        self.sampler.stop()
        await super()._async_cleanup_kernel()

    async def _ask_torch_peak(self, timeout_s: float = 30.0) -> int | None:
        try:
            msg_id = self.kc.execute("", silent=True, store_history=False,
                                     user_expressions={"peak": KERNEL_PEAK_EXPRESSION})
            reply = await asyncio.wait_for(self.async_wait_for_reply(msg_id), timeout_s)
            value = reply["content"]["user_expressions"]["peak"]
            return ast.literal_eval(value["data"]["text/plain"]) if value.get("status") == "ok" else None
        except Exception:  # a busy or dead kernel: no number, never a failed course
            return None


def course_notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The course notebooks in order (their names start with a two-digit number)."""
    return sorted(directory.glob("[0-9][0-9]_*.ipynb"))


def cell_error(exc: CellExecutionError) -> str:
    """The failed cell's exception as one line: its name and the first line of its message."""
    message = (exc.evalue or "").strip().splitlines()
    if exc.ename:
        return f"{exc.ename}: {message[0]}" if message else exc.ename
    return (str(exc).strip().splitlines() or [repr(exc)])[-1]


CELL_TIMEOUT_S = 1800
"""The longest one cell may run (nbclient's ``timeout``); it also bounds any wait for a kernel message."""


def run_notebook(path: Path, out_dir: Path, timeout_s: int = CELL_TIMEOUT_S) -> NotebookResult:
    """Execute one notebook in its own folder (``timeout_s``: per cell); save the executed copy."""
    nb = nbformat.read(path, as_version=4)
    client = MeasuredClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    status, error = "ok", None
    os.environ[runs.NOTEBOOK_ENV] = path.name  # the kernel inherits it: runs it trains or uses are recorded
    try:
        client.execute()
    except CellExecutionError as exc:
        status, error = "failed", cell_error(exc)
    except Exception as exc:  # a dead kernel or a timeout: keep what ran
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.pop(runs.NOTEBOOK_ENV, None)
    copy = out_dir / path.name
    nbformat.write(nb, copy)
    used = [f"{use['how']} {use['run']}" for use in runs.recorded_uses(out_dir) if use["notebook"] == path.name]
    return NotebookResult(path.name, status, time.perf_counter() - start, str(copy), error, used,
                          gib(client.torch_peak_bytes), gib(client.sampler.peak_bytes))


def run_course(out_dir: Path, notebooks: list[Path] | None = None, keep_going: bool = False,
               cell_timeout_s: int = CELL_TIMEOUT_S) -> list[NotebookResult]:
    """Run the notebooks in order, stopping after a failure unless ``keep_going``; ``summary.json`` is written after
    each notebook, so a course stopped half-way keeps the rows of those it finished."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ[runs.RUN_DIR_ENV] = str(out_dir.resolve())
    path = out_dir / "summary.json"  # keeps the rows of notebooks not run this time
    summary = {row["notebook"]: row for row in (json.loads(path.read_text()) if path.is_file() else [])}
    results: list[NotebookResult] = []
    for notebook in notebooks or course_notebooks():
        if results and results[-1].status != "ok" and not keep_going:
            results.append(NotebookResult(notebook.name, "not run", 0.0))
        else:
            print(f"running {notebook.name} ...", flush=True)
            results.append(run_notebook(notebook, out_dir, cell_timeout_s))
            print(f"  {results[-1].status} in {results[-1].seconds:.0f} s", flush=True)
        summary[results[-1].notebook] = asdict(results[-1])
        path.write_text(json.dumps([summary[name] for name in sorted(summary)], indent=2))
    return results


def format_summary(results: list[NotebookResult]) -> str:
    lines = [f"{'notebook':32s} {'status':8s} {'seconds':>8s}  runs"]
    for r in results:
        peaks = (f"   torch peak {r.max_allocated_gib} GiB, device {r.device_used_gib} GiB"
                 if r.max_allocated_gib is not None or r.device_used_gib is not None else "")
        lines.append(f"{r.notebook:32s} {r.status:8s} {r.seconds:8.0f}  {', '.join(r.runs) or '-'}{peaks}"
                     + (f"   {r.error}" if r.error else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run every course notebook headless, in order.")
    parser.add_argument("--out", type=Path, default=Path("runs/course"), help="run folder (default runs/course)")
    parser.add_argument("--keep-going", action="store_true", help="run the later notebooks after a failure too")
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_S,
                        help=f"seconds one cell may run (default {CELL_TIMEOUT_S})")
    parser.add_argument("notebooks", nargs="*", type=Path, help="only these notebooks (default: all)")
    args = parser.parse_args(argv)
    results = run_course(args.out, args.notebooks or None, keep_going=args.keep_going, cell_timeout_s=args.cell_timeout)
    print(f"\n{format_summary(results)}\n\nExecuted copies and results: {args.out}/")
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
