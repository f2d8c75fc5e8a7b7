"""Resource planning: which devices hold the actor, the rollout, the reference and the reward, per
layout (:func:`plan_resources`), and the memory each layout needs (:func:`memory_by_layout`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab import device as device_module
from grpo_lab.errors import ConfigError
from grpo_lab.memory import GIB, VLLM_MEMORY_FRACTION, plan_memory
from grpo_lab.scale.devices import default_rollout_count, plan_devices

LAYOUTS = ("colocate", "server", "verl")
"""The layouts :func:`plan_resources` places roles in: TRL colocate, TRL server, verl's hybrid engine."""


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


def plan_resources(num_devices: int = 8, layout: str = "server", kind: str = "cuda", beta: float = 0.04
                   ) -> ResourcePlan:
    """Which devices hold the actor, rollout engine, reference model and (rule) reward: ``colocate`` (TRL, every
    device trains and generates in turn), ``server`` (:func:`default_rollout_count` devices serve vLLM, the rest
    train) or ``verl`` (its hybrid engine on Ray). ``beta=0`` drops the reference.

    >>> print(plan_resources(8, "server").roles[1].devices)
    0,1
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    if not device_module.is_accelerator(kind):
        raise ConfigError(f"kind={kind!r}: resource plans are for accelerators, 'cuda' or 'npu'")
    var = device_module.visible_devices_var(kind)
    train = rollout = list(range(num_devices))
    if layout == "server":
        plan = plan_devices(kind, num_devices, rollout_devices=range(default_rollout_count(num_devices)
                                                                     if num_devices >= 2 else 0))
        train, rollout = list(plan.train_devices), list(plan.rollout_devices)
    t, r = _span(train), _span(rollout)
    reference = RoleAssignment("reference", *((t, "frozen copy of the policy beside each actor shard (for the KL term)")
                                              if beta > 0 else ("none", "not loaded: beta = 0")))
    reward = RoleAssignment("reward", "CPU", "a Python function in the trainer processes, between rollout and update")
    if layout == "colocate":
        roles = (RoleAssignment("actor", t, f"TRL GRPOTrainer, {len(train)} process(es) via accelerate (DDP / FSDP / "
                                            "ZeRO)"),
                 RoleAssignment("rollout", r, "vLLM inside each training process (`vllm_mode='colocate'`), "
                                              "`vllm_gpu_memory_utilization` of each device"), reference, reward)
        launch = (f"{var}=0 python -m grpo_lab.train --use-vllm true --vllm-mode colocate   # one device",)
        if num_devices > 1:
            launch += (f"# on {num_devices} devices this layout is TRL's `accelerate launch --num_processes "
                       f"{num_devices}` of that trainer; grpo_lab.train writes its run folder from one process, so it "
                       "trains on one device for now",)
        note = ("Every device does everything in turn: no device idles, but generation and training share memory "
                "(vLLM gets a fraction) and vLLM runs in the trainer's process, without its own scheduler process.")
    elif layout == "server":
        roles = (RoleAssignment("actor", t, f"TRL GRPOTrainer, {len(train)} process(es) via accelerate"),
                 RoleAssignment("rollout", r, f"TRL's vLLM server (`trl vllm-serve`), tensor parallel {len(rollout)}"),
                 reference, reward)
        serving = ",".join(map(str, rollout))
        launch = (f"python -m grpo_lab.scale --rollout-devices {serving} --train-devices {train[0]}",
                  f"# starts TRL's vLLM server ({var}={serving} trl vllm-serve --model MODEL "
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
                 RoleAssignment("reference", t, "FSDP reference in the same workers (`actor_rollout_ref.ref`)")
                 if beta > 0 else reference,
                 RoleAssignment("reward", "CPU", "`compute_score` in verl's reward workers (see the export)"))
        launch = (f"bash verl-gpu/run_verl.sh   # written by grpo_lab.verl_export; "
                  f"trainer.n_gpus_per_node={num_devices}",)
        note = ("verl's hybrid engine puts actor, rollout and reference on every device and switches between them "
                "(vLLM frees its memory during the update): no device idles, at the price of Ray and a second "
                "framework.")
    return ResourcePlan(layout, kind, num_devices, roles, launch, note)


def memory_by_layout(model: Any, device_memory_gib: float, device_kind: str = "cuda",
                     vllm_gpu_memory_utilization: float = VLLM_MEMORY_FRACTION["server"],
                     **training: Any) -> list[dict[str, Any]]:
    """Colocate on one device vs server mode on two (the trainer's device holds the training peak and the margin, the
    rollout device gives vLLM its share), from :func:`grpo_lab.memory.plan_memory`; ``training``: its shape fields."""
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
         "kv_sequences": server.sequences_in_kv_cache,
         "setting": f"vllm_gpu_memory_utilization={vllm_gpu_memory_utilization}"},
    ]
