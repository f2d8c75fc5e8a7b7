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
``overrides`` (TRL names -> verl keys); ``folder``, ``rows`` (parquet), ``target`` (:class:`VerlTarget`). Every name
imports from ``grpo_lab.verl_export``.

    >>> from grpo_lab.train import TrainConfig
    >>> from grpo_lab.verl_export import VerlTarget, export_verl
    >>> export = export_verl("runs/verl-gpu", TrainConfig(profile="gpu"),
    ...                      VerlTarget(device="cuda", n_gpus_per_node=8))          # doctest: +SKIP
    >>> export.overrides["actor_rollout_ref.rollout.n"]                             # doctest: +SKIP
    4

From a shell: ``python -m grpo_lab.verl_export --out runs/verl-gpu --profile gpu --gpus 8``.
"""

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

__all__ = [
    "ABILITY", "CANN_ENV_SCRIPTS", "DATA_SOURCE", "LAUNCH_FILE", "LOSS_AGG_MODE", "LR_SCHEDULER", "MANIFEST_FILE",
    "MODEL_KEY", "NORM_BY_STD", "OVERRIDES_FILE", "PATH_KEYS", "README_FILE", "REWARDS_SNAPSHOT", "REWARD_FILE",
    "REWARD_FUNCTION", "TEST_FILE", "TRAIN_FILE", "VERL_CHECKED", "VERL_SOURCE_ENV", "LoadedExport", "SchemaCheck",
    "Setting", "VerlConfigSource", "VerlExport", "VerlTarget", "absolute_overrides", "build_parser", "export_verl",
    "find_verl_config", "grpo_settings", "hydra_value", "launch_script", "load_export", "load_reward_function", "main",
    "override_args", "parse_launch_overrides", "read_parquet", "resolve_experiment", "reward_module_source",
    "to_verl_row", "validate_overrides", "verl_rows", "write_parquet",
]
