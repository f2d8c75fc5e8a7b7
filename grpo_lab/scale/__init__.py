"""Scale out with TRL's server mode: vLLM rollouts on their own device(s), the trainer on the others.

In ``vllm_mode="colocate"`` vLLM lives *inside* the training process and takes turns with it on the same device. In
``vllm_mode="server"`` TRL talks to a separate vLLM server over HTTP: the server generates on its own devices, the
trainer trains on the others and pushes its weights to the server after every optimizer step. This package runs that
layout from one call:

1. :func:`plan_devices` splits the visible devices into rollout and training sets and names the variable that hides
   the rest from each process (from :mod:`grpo_lab.device`);
2. :func:`launch_rollout_server` starts TRL's server (the command ``trl vllm-serve`` runs) on the rollout devices,
   waits for ``/health`` and, on exit or error, ends its whole process group;
3. :func:`train_with_server` runs ``accelerate launch`` for :func:`grpo_lab.train.train` on the training devices with
   ``vllm_mode="server"``, watches both processes and returns the run folder and metrics;
4. :func:`run_server_mode` does 2 and 3 in one call.

Modules: ``cli`` (``grpo-lab scale``); ``runner`` (the trainer under ``accelerate launch``, server mode end to end:
what :mod:`grpo_lab.async_grpo` builds on); ``server`` (the rollout server); ``planning`` (who runs where, memory per
layout); ``config`` (:class:`ServerModeConfig`, file names, :class:`ScaleOutError`); ``devices`` (:func:`plan_devices`).
Its public names (``__all__``) import from ``grpo_lab.scale``.

**Weight sync.** TRL pushes weights over NCCL, which exists only on CUDA. Elsewhere the trainer writes its weights to
``<run>/.weight_sync/model.safetensors`` and asks the server, through vLLM's ``/collective_rpc`` endpoint, to run
:meth:`ReloadWeightsExtension.grpo_lab_reload_weights` (vLLM's own ``reload_weights``, then the re-packing of the tied
``lm_head`` that :mod:`grpo_lab.weight_sync` explains); TRL's ``VLLMGeneration.sync_weights`` still decides when and
what to sync. On Ascend TRL's client refuses any device but CUDA for its transfer, so the file path is the default
there too (written from the vllm-ascend docs, not run on Ascend hardware).

**Resource planning.** :func:`plan_resources` says which devices hold the actor, the rollout engine, the reference
model and the reward in three layouts: TRL colocate, TRL server and verl's hybrid engine.

Example (CPU; the vLLM-CPU engine takes minutes to start)::

    >>> from grpo_lab.scale import ServerModeConfig, run_server_mode
    >>> from grpo_lab.experiment import TrainConfig
    >>> result = run_server_mode(ServerModeConfig(), TrainConfig(profile="tiny", max_steps=2,
    ...                          per_device_train_batch_size=8, num_generations=4, live_plot=False))  # doctest: +SKIP
    >>> result.global_step, result.server_stats["generation_tokens"] > 0                              # doctest: +SKIP
    (2, True)

From a shell: ``python -m grpo_lab.scale --max-steps 2`` (every ``grpo-lab train`` option works, plus
``--rollout-devices 0 --train-devices 1 --port 8000``).
"""

from __future__ import annotations

__all__ = [
    "LAYOUTS", "ServerModeConfig", "memory_by_layout", "plan_devices", "plan_resources", "run_server_mode",
    "server_command", "server_train_config", "trainer_command",
]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
from grpo_lab.scale.cli import (
    SCALE_DESCRIPTION,
    build_parser,
    device_indices,
    exit_on_sigterm,
    main,
    parse_command_line,
    print_commands,
)
from grpo_lab.scale.config import (
    DISTRIBUTED_VARS,
    RESULT_FILE,
    SERVER_LOG,
    TRAINER_LOG,
    WEIGHT_SYNC_MODES,
    ScaleOutError,
    ServerModeConfig,
)
from grpo_lab.scale.devices import DevicePlan, default_rollout_count, plan_devices
from grpo_lab.scale.planning import LAYOUTS, ResourcePlan, RoleAssignment, memory_by_layout, plan_resources
from grpo_lab.scale.runner import (
    ServerModeResult,
    TrainerProcess,
    launch_trainer,
    result_fields,
    run_server_mode,
    run_trainer,
    server_train_config,
    train_with_server,
    trainer_command,
    trainer_environment,
)
from grpo_lab.scale.server import (
    CPU_SERVER_FLAGS,
    RolloutServer,
    launch_rollout_server,
    server_command,
    server_environment,
)
