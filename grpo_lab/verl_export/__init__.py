"""Export the course's GRPO experiment to verl: parquet data, a ``compute_score`` reward module, the config.

verl (``python3 -m verl.trainer.main_ppo``) trains GRPO with Ray workers, FSDP and vLLM rollouts across many GPUs or
Ascend NPUs. This package writes what it needs, from the same :class:`~grpo_lab.train.TrainConfig` that ``grpo-lab
train`` runs, into one folder to copy to a verl machine:

* ``train.parquet`` / ``test.parquet``: the course rows in verl's format;
* ``reward_fn.py`` with ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, scoring with
  ``grpo_lab_rewards.py`` beside it: a verbatim copy of :mod:`grpo_lab.rewards` (standard library only), since verl
  loads the reward file by path in workers where grpo_lab is usually not installed;
* ``verl_overrides.yaml``: the Hydra overrides of verl's ``ppo_trainer`` config (TRL's names in verl's keys);
* ``run_verl.sh``: the launch command with the device variables; ``README.md`` explains each setting and
  ``export.json`` records the experiment, file checksums and the schema check.

:func:`validate_overrides` checks every override key against verl's own config wherever its files can be found (an
installed ``verl``, or ``GRPO_LAB_VERL_SOURCE`` naming a verl wheel, checkout or config folder). grpo_lab never runs
verl itself. The package is not named ``verl`` so that it never shadows the real one. Modules: ``cli``; ``export``
(write a folder, read it back); ``files`` (``reward_fn.py``, ``run_verl.sh``); ``schema`` (the key check);
``overrides`` (TRL names -> verl keys); ``folder``, ``rows`` (parquet), ``target`` (:class:`VerlTarget`). Its public
names (``__all__``) import from ``grpo_lab.verl_export``.

    >>> from grpo_lab.experiment import TrainConfig
    >>> from grpo_lab.verl_export import VerlTarget, export_verl
    >>> export = export_verl("runs/verl-gpu", TrainConfig(profile="gpu"),
    ...                      VerlTarget(device="cuda", n_gpus_per_node=8))          # doctest: +SKIP
    >>> export.overrides["actor_rollout_ref.rollout.n"]                             # doctest: +SKIP
    4

From a shell: ``python -m grpo_lab.verl_export --out runs/verl-gpu --profile gpu --gpus 8``.
"""

from __future__ import annotations

__all__ = ["VerlTarget", "export_verl", "load_export", "validate_overrides"]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
from grpo_lab.verl_export.cli import build_parser, main
from grpo_lab.verl_export.export import LoadedExport, VerlExport, export_verl, load_export, load_reward_function
from grpo_lab.verl_export.files import CANN_ENV_SCRIPTS, launch_script, parse_launch_overrides, reward_module_source
from grpo_lab.verl_export.folder import (
    LAUNCH_FILE,
    MANIFEST_FILE,
    MODEL_KEY,
    OVERRIDES_FILE,
    PATH_KEYS,
    README_FILE,
    REWARD_FILE,
    REWARD_FUNCTION,
    REWARDS_SNAPSHOT,
    TEST_FILE,
    TRAIN_FILE,
    VERL_CHECKED,
)
from grpo_lab.verl_export.overrides import (
    LOSS_AGG_MODE,
    LR_SCHEDULER,
    NORM_BY_STD,
    Setting,
    absolute_overrides,
    grpo_settings,
    hydra_value,
    override_args,
    resolve_experiment,
)
from grpo_lab.verl_export.rows import ABILITY, DATA_SOURCE, read_parquet, to_verl_row, verl_rows, write_parquet
from grpo_lab.verl_export.schema import (
    VERL_SOURCE_ENV,
    SchemaCheck,
    VerlConfigSource,
    find_verl_config,
    validate_overrides,
)
from grpo_lab.verl_export.target import VerlTarget
