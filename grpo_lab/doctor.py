"""`grpo-lab doctor`: one check per row of the write-up's troubleshooting section, each with its fix.

Each check (:func:`run_checks`) returns pass / warn / fail and never raises. :data:`SYMPTOMS` goes the other way, from
what a run shows to its usual causes, the fix and the checks that look at it (``grpo-lab doctor --symptoms``).
"""

from __future__ import annotations

__all__ = ["SYMPTOMS", "DoctorConfig", "run_checks", "symptom_table"]

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import psutil

from grpo_lab import device, env, experiment, memory, models
from grpo_lab.deploy import ServeConfig
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import DEFAULT_FOR_DEVICE, PROFILE_DEVICE, TrainConfig
from grpo_lab.rollout.prompts import tokenizer_differences
from grpo_lab.rollout.vllm_backend import vllm_usable
from grpo_lab.servers import group_members

SYMBOL = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


@dataclass(frozen=True)
class Check:
    """One diagnosis: what was checked, the verdict, what was seen, and what to do."""

    name: str
    status: str  # "pass" | "warn" | "fail"
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        line = f"[{SYMBOL[self.status]}] {self.name}: {self.detail}"
        return line + (f"\n       fix: {self.fix}" if self.fix and self.status != "pass" else "")


@dataclass(frozen=True)
class DoctorConfig:
    """What to diagnose: the experiment (a ``TrainConfig``, e.g. a run's own) and what lies outside it."""

    experiment: TrainConfig = field(default_factory=TrainConfig)
    dtype: str | None = None  # the dtype your own training script uses, if not the experiment's
    enable_prefix_caching: bool = True
    tokenizer: str | None = None  # the trainer's tokenizer, if it is not loaded from the model folder
    serve_max_num_seqs: int = ServeConfig.max_num_seqs
    expected_concurrent_requests: int = 16

    @classmethod
    def from_file(cls, path: str | Path) -> DoctorConfig:
        """Read a JSON file: any TrainConfig fields (a run's ``config.json`` works too) and this class's own."""
        path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
        try:
            values = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"doctor config {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"doctor config {path} is not valid JSON: {exc}") from None
        values = values.get("config", values)  # a run's config.json holds the experiment under "config"
        own = {f.name for f in fields(cls)} - {"experiment"}
        known = own | {f.name for f in fields(TrainConfig)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"doctor config {path}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(TrainConfig.from_dict({k: v for k, v in values.items() if k not in own}),
                   **{k: v for k, v in values.items() if k in own})


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:
        return Check(name, "fail", f"could not run: {type(exc).__name__}: {exc}",
                     "fix what the message names, then run grpo-lab doctor again")


def check_stack() -> Check:
    result = env.best_stack()
    if result.matches:
        return Check("versions", "pass", f"installed versions match the verified '{result.stack.name}' stack "
                                         f"({result.stack.status})")
    core_gone = any(d.installed is None and d.package in ("torch", "trl", "transformers") for d in result.differences)
    diffs = "; ".join(str(d) for d in result.differences)
    return Check("versions", "fail" if core_gone else "warn",
                 f"closest stack '{result.stack.name}' differs: {diffs}. Unverified combinations cause "
                 "operator errors and crashes inside vLLM.", result.advice())


def check_device(config: DoctorConfig) -> Check:
    kind = device.detect()
    count = device.device_count(kind)
    if count == 0:
        return Check("device", "fail", f"no {kind} device visible",
                     f"check the driver and {device.visible_devices_var(kind)}")
    name = config.experiment.with_profile().profile
    meant_for = PROFILE_DEVICE[name]
    if meant_for != kind:
        return Check("device", "warn" if device.is_cpu(meant_for) else "fail",
                     f"profile '{name}' is for {meant_for}, but this machine runs on {kind}",
                     f"set GRPO_LAB_PROFILE={DEFAULT_FOR_DEVICE[kind]} or run on the device the profile expects")
    wrong_var = device.FOREIGN_VISIBLE_DEVICES_VAR[kind]
    if wrong_var and os.environ.get(wrong_var) and not os.environ.get(device.visible_devices_var(kind)):
        return Check("device", "warn", f"{wrong_var} is set but this is a {kind} machine; it selects nothing here",
                     f"use {device.visible_devices_var(kind)} instead")
    return Check("device", "pass", f"{count} x {device.device_name(kind=kind)} ({kind}); profile '{name}'")


def check_device_memory() -> Check:
    """The device's size as the package treats it: its total, or ``GRPO_LAB_DEVICE_MEMORY_GIB``'s cap."""
    kind = device.detect()
    try:
        cap = device.Machine.detect().cap
    except device.MemoryCapError as error:
        return Check("device memory", "fail", str(error), f"set {device.MEMORY_CAP_ENV} to a positive number of GiB "
                                                          "no larger than the device, or unset it")
    if cap is None:
        return Check("device memory", "pass", f"the whole device: {device.memory_info(kind=kind).total_gib:.1f} GiB "
                                              f"({device.MEMORY_CAP_ENV} unset)")
    return Check("device memory", "pass" if cap.enforced else "warn", cap.describe(),
                 "" if cap.enforced else f"on {kind} the cap sizes the plan only: nothing stops a run from using more")


def check_vllm() -> Check:
    usable, reason = vllm_usable(device.detect())
    return Check("vllm", "pass" if usable else "warn", reason,
                 "" if usable else "rollouts fall back to HF generate (several times slower); " + reason)


def check_bytecode() -> Check:
    status = env.bytecode_status()
    if not status.missing:
        return Check("python bytecode", "pass", "torch, transformers, TRL and vLLM load compiled bytecode")
    if status.ok:
        return Check("python bytecode", "pass", f"{', '.join(status.missing)} not compiled yet: Python saves the "
                                                "bytecode at their first import")
    return Check("python bytecode", "warn", status.describe(), f"compile them once: {status.command()}")


def check_dtype(config: DoctorConfig) -> Check:
    kind = device.detect()
    dtype = config.dtype or ("bfloat16" if config.experiment.resolve(Machine.detect()).bf16 else "float32")
    if dtype in ("float16", "fp16", "half"):
        if not device.is_cpu(kind) and device.bf16_supported(kind):
            return Check("dtype", "warn", "fp16 training overflows easily (NaN loss); this device supports bf16",
                         "train in bf16 (bf16=True); if the loss is NaN, also check rewards for inf/NaN")
        return Check("dtype", "warn", "fp16 without bf16 support: watch for NaN loss",
                     "keep a loss scaler on and a lower learning rate; check rewards for inf/NaN")
    return Check("dtype", "pass", f"{dtype} on {kind}")


def check_allocator(config: DoctorConfig) -> Check:
    wanted = device.allocator_env(device.detect())
    if not wanted:
        return Check("allocator", "pass", "CPU: no device allocator to tune")
    (var, value), = wanted.items()
    expandable = "expandable_segments:True" in os.environ.get(var, "")
    if config.experiment.vllm_enable_sleep_mode:  # vLLM's memory pool refuses expandable segments (its assert)
        if expandable:
            return Check("allocator", "fail", f"{var} has expandable_segments:True, which vLLM's sleep mode refuses: "
                                              "its engine stops as it starts", f"unset {var} before starting Python")
        return Check("allocator", "pass", f"{var} without expandable segments, as vLLM's sleep mode needs")
    if expandable:
        return Check("allocator", "pass", f"{var}={os.environ[var]}")
    return Check("allocator", "pass", f"{var} unset: PyTorch's default allocator (where a run fails with much memory "
                                      f"reserved but unallocated, export {var}={value} before starting Python; never "
                                      "with vLLM's sleep mode)")


def check_prefix_caching(config: DoctorConfig) -> Check:
    if config.enable_prefix_caching:
        return Check("prefix caching", "pass", "on: the n samples of a prompt share its KV cache")
    return Check("prefix caching", "warn", "off: each of the n samples per prompt recomputes the prompt",
                 "set enable_prefix_caching=True (TRL: vllm_enable_prefix_caching / vLLM --enable-prefix-caching)")


def check_memory(config: DoctorConfig) -> Check:
    """The memory planner on the experiment as ``grpo_lab.train`` would run it here."""
    machine = Machine.detect()
    resolved = config.experiment.resolve(machine)
    budget = experiment.memory_budget(resolved, machine)
    if budget.trainer_fits if resolved.rollout_backend == "hf" else budget.fits:
        return Check("memory plan", "pass", budget.summary(resolved.rollout_backend).splitlines()[0])
    return Check("memory plan", "fail", "the plan does not fit: OOM at the first steps is likely",
                 budget.advice or budget.summary(resolved.rollout_backend))


def check_tokenizer(config: DoctorConfig) -> Check:
    model_path = models.resolve_model(config.experiment.with_profile().model)
    trainer = config.tokenizer or model_path
    if trainer == model_path:
        return Check("tokenizer", "pass", "vLLM and the trainer load the tokenizer from the same folder")
    differences = tokenizer_differences(model_path, trainer)
    if not differences:
        return Check("tokenizer", "pass", f"{trainer} and {model_path} have identical vocab and chat template")
    return Check("tokenizer", "fail", "vLLM and the trainer would use different tokenizers (garbled output): "
                 + "; ".join(differences), "load both from the model folder (one tokenizer path for everything)")


def check_serving(config: DoctorConfig) -> Check:
    if config.serve_max_num_seqs < config.expected_concurrent_requests:
        return Check("serving", "warn", f"max_num_seqs={config.serve_max_num_seqs} < "
                     f"{config.expected_concurrent_requests} expected concurrent requests: requests queue",
                     f"raise --max-num-seqs to at least {config.expected_concurrent_requests} and give the "
                     "server a higher --gpu-memory-utilization (0.85–0.9) than in training")
    return Check("serving", "pass", f"max_num_seqs={config.serve_max_num_seqs} covers "
                 f"{config.expected_concurrent_requests} concurrent requests")


@dataclass(frozen=True)
class VLLMGroup:
    """A process group of this user with a vLLM process that holds a device or a port, and how to stop it."""

    pgid: int
    pids: tuple[int, ...]
    """The processes to stop: the whole group, or only its vLLM processes when the group is another program's (a
    notebook kernel running an in-process engine)."""
    whole_group: bool
    command: str
    ports: tuple[int, ...]
    devices: tuple[str, ...]
    owner: str  # ``pid N (command)`` of the process that started the group, or ``none`` when it is gone (orphaned)

    @property
    def stop_command(self) -> str:
        target = f"-- -{self.pgid}" if self.whole_group else " ".join(map(str, self.pids))
        return f"kill {target}  (kill -9 {target} if anything is left after 30 s)"

    def __str__(self) -> str:
        held = [f"port {', '.join(map(str, self.ports))}" if self.ports else "", ", ".join(self.devices)]
        return (f"pgid {self.pgid} (pids {', '.join(map(str, self.pids))}: {self.command}) holds "
                f"{'; '.join(h for h in held if h)}; started by {self.owner}; stop: {self.stop_command}")


def _held_devices(pid: int) -> set[str]:
    """Accelerator device files (``/dev/nvidia0``, ``/dev/davinci3`` ...) the process has open."""
    prefixes = [re.escape(prefix) for prefix in device.DEVICE_FILE_PREFIX.values() if prefix]
    pattern = re.compile(rf"({'|'.join(prefixes)})\d+")
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while we looked
            target = os.readlink(fd)
            if pattern.fullmatch(target):
                held.add(target)
    return held


def _short(process: psutil.Process, width: int = 100) -> str:
    command = " ".join(shlex.join(process.cmdline()).split()) or process.name()
    return command if len(command) <= width else command[:width - 3] + "..."


def vllm_groups() -> list[VLLMGroup]:
    """This user's vLLM processes that listen on a port or hold an accelerator, one per process group."""
    found: dict[int, tuple[set[int], set[str], list[str], set[int]]] = {}
    for process in psutil.process_iter(["cmdline", "name", "uids"]):
        try:
            if process.pid == os.getpid() or process.info["uids"].real != os.getuid():
                continue
            text = " ".join(process.info["cmdline"] or []) + " " + (process.info["name"] or "")
            if "vllm" not in text.lower():
                continue
            ports = {c.laddr.port for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
            devices = _held_devices(process.pid)
            held = found.setdefault(os.getpgid(process.pid), (set(), set(), [], set()))
            held[3].add(process.pid)
            if ports or devices:
                held[0].update(ports)
                held[1].update(devices)
                held[2].append(_short(process))
        except (psutil.Error, OSError):  # ended while we looked, or not ours to read
            continue
    groups = []
    for pgid, (ports, devices, commands, vllm_pids) in sorted(found.items()):
        if not commands:  # none of its vLLM processes holds anything
            continue
        members = sorted(group_members(pgid))
        try:
            top = next((psutil.Process(pid) for pid in members if psutil.Process(pid).ppid() not in members), None)
            parent = top.parent() if top else None
            owner = "none: its owner is gone (orphaned)" if parent is None or parent.pid == 1 \
                else f"pid {parent.pid} ({_short(parent, 60)})"
            # the group is the server's own when every member is vLLM's (or a child of it); not a notebook kernel's
            whole = all(pid in vllm_pids or {q.pid for q in psutil.Process(pid).parents()} & vllm_pids
                        for pid in members)
        except psutil.Error:
            continue
        groups.append(VLLMGroup(pgid, tuple(members if whole else sorted(vllm_pids)), whole, commands[0],
                                tuple(sorted(ports)), tuple(sorted(devices)), owner))
    return groups


def check_vllm_processes() -> Check:
    groups = vllm_groups()
    if not groups:
        return Check("vllm processes", "pass", "no vLLM process of this user holds a device or a port")
    return Check("vllm processes", "warn",
                 f"{len(groups)} vLLM process group(s) of this user hold a device or a port:\n       "
                 + "\n       ".join(map(str, groups)),
                 "stop the ones you no longer use (the command is on each line): until then they keep their device "
                 "memory and port, and the next server or run meets 'out of memory' or 'address already in use'")


def run_checks(config: DoctorConfig | None = None) -> list[Check]:
    """Every check, in the order of the troubleshooting table."""
    config = config or DoctorConfig()
    checks = [("versions", check_stack), ("device", lambda: check_device(config)),
              ("device memory", check_device_memory), ("vllm", check_vllm), ("python bytecode", check_bytecode),
              ("memory plan", lambda: check_memory(config)), ("tokenizer", lambda: check_tokenizer(config)),
              ("dtype", lambda: check_dtype(config)), ("prefix caching", lambda: check_prefix_caching(config)),
              ("allocator", lambda: check_allocator(config)), ("serving", lambda: check_serving(config)),
              ("vllm processes", check_vllm_processes)]
    return [_guard(name, fn) for name, fn in checks]


@dataclass(frozen=True)
class Symptom:
    """What a run shows, why it usually happens, what to do, and which checks of :func:`run_checks` look at it."""

    symptom: str
    causes: str
    fix: str
    checks: tuple[str, ...] = ()


SYMPTOMS: tuple[Symptom, ...] = (
    Symptom("reward flat (stays near 0, or near 1)",
            "every completion of a group scores the same, so every advantage is 0 (TRL logs frac_reward_zero_std near "
            "1): the task is out of the model's reach, or already solved; or the reward reads the wrong thing (another "
            "column, another answer format)",
            "measure pass@k before training and train where it is well above greedy; print rewards.why() "
            "on a few samples; raise the temperature or change the data"),
    Symptom("loss zero (or near zero) every step",
            "normal in GRPO: with one update per generation the policy being updated is the one that sampled, so each "
            "probability ratio is 1 and the loss is minus the mean advantage, about 0 since advantages average 0 in "
            "each group; its gradient is not 0. A problem only when grad_norm is 0 too: no group has any signal (see "
            "'reward flat')",
            "read reward, reward_std, frac_reward_zero_std and grad_norm rather than the loss"),
    Symptom("out of memory at step N, not at step 1",
            "vLLM reserved its share at start; AdamW's states appear at the first optimizer step and activations grow "
            "with the longest completion, so the trainer's peak comes a few steps in; allocating and freeing in turns "
            "fragments memory",
            "in the memory planner's order: " + "; then ".join(memory.KNOBS_IN_ORDER)
            + ". And set the allocator's expandable_segments",
            ("memory plan", "allocator")),
    Symptom("vLLM will not start",
            "a vLLM built for another torch or device, no vLLM for this device, or less free memory than "
            "vllm_gpu_memory_utilization x total memory when it starts (the trainer already holds some, or a server "
            "left running from an earlier run does: 'out of memory', 'address already in use')",
            "install the verified stack (make install STACK=...); lower vllm_gpu_memory_utilization; on the CPU the KV "
            "cache is sized in bytes (VLLM_CPU_KVCACHE_SPACE); stop the leftover vLLM processes doctor lists",
            ("versions", "vllm", "memory plan", "vllm processes")),
    Symptom("server unreachable (TRL server mode, or a deployed model)",
            "the server is still loading and compiling (a minute or more), listens on another host or port, or died at "
            "start; a request without the server's API key is refused",
            "wait for GET /health before sending requests (TRL waits vllm_server_timeout seconds); check host and port; "
            "read the server's log; send the key the server was started with"),
    Symptom("every start is slow: a notebook's first cell, a vLLM engine or server, each takes tens of seconds",
            "Python compiles torch, transformers and vLLM from source in every process: the image sets "
            "PYTHONDONTWRITEBYTECODE=1 and its site-packages hold no bytecode; then vLLM's first start of an engine "
            "configuration compiles its graphs (a later one loads them from VLLM_CACHE_ROOT)",
            "compile the packages once (the command doctor prints); keep one VLLM_CACHE_ROOT for every engine (grpo_lab "
            "does)", ("python bytecode",)),
    Symptom("garbled completions, rewards computed on nonsense",
            "vLLM and the trainer loaded different tokenizers or chat templates",
            "load both from the model's own folder", ("tokenizer",)),
    Symptom("NaN loss",
            "fp16 overflow, or a reward that returned NaN or inf",
            "train in bf16 rather than fp16; wrap rewards with rewards.validate_reward; lower the learning rate",
            ("dtype",)),
    Symptom("slow rollouts",
            "HF generate where vLLM could run, or prefix caching off", "use vLLM with enable_prefix_caching=True",
            ("vllm", "prefix caching")),
    Symptom("the run uses the wrong device, or none",
            "a profile made for another device, or the other vendor's visible-devices variable",
            "set GRPO_LAB_PROFILE for this device; select devices with ASCEND_RT_VISIBLE_DEVICES or "
            "CUDA_VISIBLE_DEVICES", ("device",)),
)
"""The troubleshooting table, from symptom to fix (the checks named must exist in :func:`run_checks`)."""


def symptom_table(checks: Sequence[Check]) -> list[dict[str, str]]:
    """:data:`SYMPTOMS` as rows, each with the verdicts of the checks that look at it (``"-"``: none)."""
    found = {check.name: check.status for check in checks}
    return [{"symptom": s.symptom, "usual causes": s.causes, "fix": s.fix,
             "checks here": ", ".join(f"{name}: {SYMBOL[found[name]]}" if name in found else f"{name}: not run"
                                      for name in s.checks) or "-"} for s in SYMPTOMS]


def main(argv: list[str] | None = None) -> int:
    """`grpo-lab doctor [--config FILE] [--profile P] [--json]`; exit 1 when any check fails."""
    parser = argparse.ArgumentParser(prog="grpo-lab doctor", description="Diagnose the environment and a config.")
    parser.add_argument("--config", help="JSON file with TrainConfig and DoctorConfig fields, or a run folder")
    parser.add_argument("--profile", help="tiny | gpu | npu (default: GRPO_LAB_PROFILE or the device's)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--symptoms", action="store_true", help="also print the symptom -> fix table")
    args = parser.parse_args(argv)
    config = DoctorConfig.from_file(args.config) if args.config else DoctorConfig()
    if args.profile:
        config = dataclasses.replace(config, experiment=dataclasses.replace(config.experiment, profile=args.profile))
    checks = run_checks(config)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print("\n".join(str(c) for c in checks))
        counts = {s: sum(c.status == s for c in checks) for s in SYMBOL}
        print(f"\ndoctor: {counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail")
        if args.symptoms:
            for row in symptom_table(checks):
                print(f"\n{row['symptom']}\n  causes: {row['usual causes']}\n  fix:    {row['fix']}\n"
                      f"  checks: {row['checks here']}")
    return 1 if any(c.status == "fail" for c in checks) else 0
