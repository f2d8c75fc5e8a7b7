"""Who runs where: the visible devices split between the rollout server and the trainer (:func:`plan_devices`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpo_lab import device as device_module
from grpo_lab.errors import ConfigError


@dataclass(frozen=True)
class DevicePlan:
    """Device indices for the rollout server and the trainer (empty on the CPU: both share the host)."""

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
        if device_module.is_cpu(self.kind):
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
    """Split the visible devices between the rollout server and the trainer (by default the first
    :func:`default_rollout_count` serve rollouts, the rest train); the sets must not overlap.

    >>> plan_devices("cuda", num_devices=2).rollout_env(), plan_devices("cuda", num_devices=2).train_env()
    ({'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': '1'})
    """
    kind = (kind or device_module.detect()).strip().lower()
    if kind not in device_module.KINDS:
        raise ConfigError(f"unknown device kind {kind!r}: use one of {', '.join(device_module.KINDS)}")
    if device_module.is_cpu(kind):
        if rollout_devices or train_devices:
            raise ConfigError("device indices do not apply on the CPU: the rollout server and the trainer share the "
                              "host. Leave rollout_devices and train_devices empty.")
        return DevicePlan("cpu", (), ())
    count = device_module.device_count(kind) if num_devices is None else num_devices
    if count < 2 and not (rollout_devices and train_devices):
        raise ConfigError(f"server mode needs at least 2 {kind} devices (one for vLLM, one for training); "
                          f"{count} visible. On one device use colocate mode: `grpo-lab train --use-vllm true`.")
    rollout = tuple(int(i) for i in rollout_devices or ())
    train = tuple(int(i) for i in train_devices or ())
    if not rollout:
        rollout = tuple(i for i in range(count) if i not in train)[:default_rollout_count(count)]
    if not train:
        train = tuple(i for i in range(count) if i not in rollout)
    for name, indices in (("rollout_devices", rollout), ("train_devices", train)):
        if not indices:
            raise ConfigError(f"{name} is empty: server mode needs at least one device for each side.")
        if len(set(indices)) != len(indices):
            raise ConfigError(f"{name}={list(indices)} names a device twice.")
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            raise ConfigError(f"{name}={list(indices)}: device(s) {bad} do not exist ({count} visible {kind} devices, "
                              f"indices 0..{count - 1}).")
    shared = sorted(set(rollout) & set(train))
    if shared:
        raise ConfigError(f"device(s) {shared} are in both rollout_devices {list(rollout)} and train_devices "
                          f"{list(train)}: in server mode the vLLM server and the trainer each need devices of their "
                          f"own. Give them disjoint sets, or share a device with colocate mode (vllm_mode='colocate').")
    return DevicePlan(kind, rollout, train)
