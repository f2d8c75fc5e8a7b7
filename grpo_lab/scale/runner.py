"""The trainer under ``accelerate launch``, watched against a running rollout server, and a server layout end to end
(:func:`serve_and_train`): server mode's, and :mod:`grpo_lab.async_grpo`'s."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from grpo_lab import device as device_module
from grpo_lab import runs, train
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import TrainConfig
from grpo_lab.scale.config import DISTRIBUTED_VARS, RESULT_FILE, TRAINER_LOG, ScaleOutError, ServerModeConfig
from grpo_lab.scale.devices import DevicePlan, plan_devices
from grpo_lab.scale.server import RolloutServer, launch_rollout_server
from grpo_lab.servers import free_port, log_tail, start_process_group, stop_process_group
from grpo_lab.upstream.trl import file_sync_client
from grpo_lab.upstream.vllm import SYNC_FOLDER

R = TypeVar("R")


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
        steps = self.step_seconds[skip:] or self.step_seconds
        return statistics.median(steps) if steps else math.nan

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["plan"] = {**dataclasses.asdict(self.plan), "visible_devices_var": self.plan.visible_devices_var}
        values["median_step_seconds"] = self.median_step_seconds()
        return json.loads(json.dumps(values, default=str))

    def summary(self) -> str:
        """What ``done:`` adds after the steps and the median step."""
        return (f" (server start {self.server_start_seconds:.0f} s); server generated "
                f"{self.server_stats['generation_tokens']:.0f} tokens in {self.server_stats['requests']:.0f} requests")

    def save(self, name: str) -> ServerModeResult:
        """Write :meth:`to_dict` to ``<run>/name``; return the result."""
        (self.run_dir / name).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return self


def trainer_command(plan: DevicePlan, spec_path: Path, bf16: bool, module: str = "grpo_lab.scale") -> list[str]:
    """``accelerate launch`` of ``python -m module trainer SPEC``, one process per training device."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(plan.num_train_processes),
               "--num_machines", "1", "--mixed_precision", "bf16" if bf16 else "no", "--dynamo_backend", "no"]
    if device_module.is_cpu(plan.kind):
        command.append("--cpu")
    elif plan.num_train_processes > 1:
        command.append("--multi_gpu")
    return command + ["-m", module, "trainer", str(spec_path)]


def trainer_environment(plan: DevicePlan) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    return {**env, **device_module.allocator_env(plan.kind), **plan.train_env(), "PYTHONUNBUFFERED": "1"}


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
    """A finished trainer launched by :func:`launch_trainer`: the outcome it wrote, how it was started."""

    outcome: dict[str, Any]
    command: list[str]
    pid: int
    log_path: Path


def launch_trainer(server: RolloutServer, config: ServerModeConfig, run_dir: Path, spec: dict[str, Any], bf16: bool,
                   module: str = "grpo_lab.scale", sync_dir: Path | None = None) -> TrainerProcess:
    """Write ``spec`` to ``<run>/server_mode_spec.json``, run ``module``'s trainer entry under ``accelerate launch``
    in a watched process group against ``server`` (waited for while the trainer loads) and return the outcome it
    wrote to ``spec["result_path"]``; ``sync_dir`` is removed afterwards."""
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
    """The :class:`ServerModeResult` fields of a finished trainer against ``server``."""
    outcome = trainer.outcome
    return dict(
        run_dir=run_dir, final_model_dir=Path(outcome["final_model_dir"]), global_step=outcome["global_step"],
        step_seconds=outcome["step_seconds"], train_seconds=outcome["seconds"],
        server_start_seconds=server.start_seconds, server_stats=server.stats(), metrics=runs.read_metrics(run_dir),
        server_log=server.log_path, trainer_log=trainer.log_path, trainer_pid=trainer.pid, plan=server.plan,
        weight_sync=server.weight_sync, server_command=server.command, trainer_command=trainer.command)


def train_against(server: RolloutServer, config: ServerModeConfig, train_config: TrainConfig,
                  module: str = "grpo_lab.scale", base_url: str | None = None, spec: dict[str, Any] | None = None,
                  **fields: Any) -> tuple[TrainerProcess, dict[str, Any]]:
    """Launch ``module``'s trainer for a resolved ``train_config`` (plus ``fields``) against ``server`` (``base_url``
    replaces its address) with ``spec``'s entries; return it and its :func:`result_fields`."""
    run_dir = Path(train_config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base_url = base_url or server.base_url
    sync_dir = run_dir / SYNC_FOLDER if server.weight_sync == "file" else None
    train_config = dataclasses.replace(train_config, vllm_server_base_url=base_url,
                                       vllm_server_timeout=config.startup_timeout_s, **fields)
    spec = {"train_config": train_config.to_dict(), "base_url": base_url, "sync_dir": sync_dir and str(sync_dir),
            "result_path": str(run_dir / "trainer_result.json"), **(spec or {})}
    trainer = launch_trainer(server, config, run_dir, spec, bool(train_config.bf16), module, sync_dir)
    return trainer, result_fields(server, trainer, run_dir)


def train_with_server(server: RolloutServer, config: ServerModeConfig, train_config: TrainConfig) -> ServerModeResult:
    """Run :func:`grpo_lab.train.train` under ``accelerate launch`` against a running ``server``; return its facts."""
    if train_config.vllm_mode != "server" or not train_config.use_vllm:
        raise ConfigError("train_config must have use_vllm=True and vllm_mode='server' (use run_server_mode, or "
                         "server_train_config(train_config)).")
    group = {"vllm_group_port": config.group_port or free_port()} if server.weight_sync == "nccl" else {}
    return ServerModeResult(**train_against(server, config, train_config, **group)[1]).save(RESULT_FILE)


def server_train_config(train_config: TrainConfig, machine: Machine | None = None) -> TrainConfig:
    """``train_config`` with rollouts from the server, resolved for ``machine`` (default: this one), with a run dir."""
    config = dataclasses.replace(train_config, use_vllm=True, vllm_mode="server").resolve(machine or Machine.detect())
    if config.output_dir is None:
        config = dataclasses.replace(config, output_dir=str(runs.new_run_dir(config.profile, datetime.now())))
    return config


def serve_and_train(config: ServerModeConfig | None, train_config: TrainConfig | None,
                    resolve: Callable[[TrainConfig], TrainConfig], train_with: Callable[..., R], name: str,
                    why_one: str, settings: str = "") -> R:
    """A layout end to end: plan the devices, resolve the experiment, start the rollout server and, while it starts,
    the trainer (``train_with(server, config, train_config)``); stop everything. ``name``, ``why_one`` and ``settings``
    word what it prints, and why it trains on one device."""
    config = (config or ServerModeConfig()).resolved()
    plan = plan_devices(config.device, rollout_devices=config.rollout_devices, train_devices=config.train_devices)
    if plan.num_train_processes > 1:
        raise ConfigError(f"train_devices={list(plan.train_devices)}: {why_one}, so {name[0].lower() + name[1:]} "
                          f"trains on one device for now. Pass one training device (the others can serve rollouts: "
                          f"tensor parallel).")
    train_config = resolve(train_config or TrainConfig())
    print(f"{name}: {plan.describe()}; weight sync: {config.weight_sync}{settings}; run folder "
          f"{train_config.output_dir}")
    with launch_rollout_server(config, train_config, plan, wait=False) as server:
        print(f"Rollout server starting at {server.base_url}; the trainer loads meanwhile ...")
        result = train_with(server, config, train_config)
    print(f"Rollout server was ready after {result.server_start_seconds:.0f} s; trained {result.global_step} steps in "
          f"{result.train_seconds:.0f} s")
    return result


def run_server_mode(config: ServerModeConfig | None = None, train_config: TrainConfig | None = None
                    ) -> ServerModeResult:
    """Server mode end to end (:func:`serve_and_train`); a :class:`ScaleOutError` names the log of what failed."""
    return serve_and_train(config, train_config, server_train_config, train_with_server, "Server mode",
                           "grpo_lab.train writes its run folder from one process")


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
