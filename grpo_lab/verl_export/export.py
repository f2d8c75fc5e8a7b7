"""Write an export folder (:func:`export_verl`) and read it back the way verl would (:func:`load_export`)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab import rewards as rewards_module
from grpo_lab.data import load_split
from grpo_lab.errors import ExistingFileError, MissingFileError
from grpo_lab.experiment import PROFILE_DEVICE, TrainConfig, load_train_rows
from grpo_lab.rewards import RewardSet, prepare
from grpo_lab.verl_export.files import launch_script, reward_module_source
from grpo_lab.verl_export.folder import (
    LAUNCH_FILE,
    MANIFEST_FILE,
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
from grpo_lab.verl_export.overrides import Setting, absolute_overrides, grpo_settings, hydra_value, resolve_experiment
from grpo_lab.verl_export.rows import read_parquet, verl_rows, write_parquet
from grpo_lab.verl_export.schema import SchemaCheck, validate_overrides
from grpo_lab.verl_export.target import VerlTarget

@dataclass
class VerlExport:
    """An export folder: the experiment it came from, the target, the overrides (relative paths) and counts."""

    folder: Path
    train_config: TrainConfig
    target: VerlTarget
    overrides: dict[str, Any]
    reward_weights: tuple[float, ...]
    num_train_rows: int
    num_test_rows: int
    schema_check: SchemaCheck | None = None
    files: dict[str, str] = field(default_factory=dict)
    """File name -> sha256."""

    @property
    def launch_command(self) -> str:
        return f"bash {self.folder / LAUNCH_FILE}"

    def absolute_overrides(self) -> dict[str, Any]:
        return absolute_overrides(self.overrides, self.folder)


def export_verl(out_dir: str | Path, config: TrainConfig | None = None, target: VerlTarget | None = None,
                overwrite: bool = False, validate: bool = True, deep: bool = False) -> VerlExport:
    """Write the verl export of ``config`` (default: the profile's) for ``target`` into ``out_dir``; ``validate``
    checks the overrides against verl's config where it is found (:func:`validate_overrides`)."""
    import yaml

    profiled = (config or TrainConfig()).with_profile()
    target = (target or VerlTarget()).resolved(PROFILE_DEVICE[profiled.profile], profiled.profile, profiled.eval_size)
    config = resolve_experiment(profiled, target.device)
    weights = tuple(prepare(config.rewards, config.reward_weights).weights)  # unknown names, weight counts stop here
    train_rows = load_train_rows(config)
    test_rows = load_split("eval")[: target.val_size]
    settings = grpo_settings(config, target, len(train_rows))
    overrides = {s.key: s.value for s in settings}

    folder = Path(out_dir)
    if folder.exists() and any(folder.iterdir()):
        if not overwrite:
            raise ExistingFileError(f"{folder} is not empty; choose a new folder or pass overwrite=True "
                                    "(--overwrite) to replace its contents (nothing was written).")
        if not (folder / MANIFEST_FILE).is_file():
            raise ExistingFileError(f"{folder} holds files that are not a verl export ({MANIFEST_FILE} is missing); "
                                    "refusing to overwrite it. Choose an empty folder.")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)

    write_parquet(verl_rows(train_rows, "train"), folder / TRAIN_FILE)
    write_parquet(verl_rows(test_rows, "eval"), folder / TEST_FILE)
    shutil.copyfile(Path(rewards_module.__file__), folder / REWARDS_SNAPSHOT)
    (folder / REWARD_FILE).write_text(reward_module_source(config.rewards, weights), encoding="utf-8")
    (folder / OVERRIDES_FILE).write_text(
        "# Hydra overrides of verl's ppo_trainer config (python3 -m verl.trainer.main_ppo key=value ...).\n"
        f"# Paths of {', '.join(PATH_KEYS)} are relative to this folder; {LAUNCH_FILE} makes them absolute.\n"
        + yaml.safe_dump(overrides, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8")
    script = folder / LAUNCH_FILE
    script.write_text(launch_script(overrides, target), encoding="utf-8")
    script.chmod(0o755)

    export = VerlExport(folder, config, target, overrides, weights, len(train_rows), len(test_rows))
    export.schema_check = check = (validate_overrides(export.absolute_overrides(), deep=deep) if validate
                                   else SchemaCheck(ok=None, skipped="validation not asked for"))
    (folder / README_FILE).write_text(_readme(export, settings, check), encoding="utf-8")
    export.files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
    manifest = {"experiment": config.to_dict(), "target": asdict(target), "reward_weights": list(weights),
                "num_train_rows": export.num_train_rows, "num_test_rows": export.num_test_rows,
                "verl_versions_checked_when_written": list(VERL_CHECKED), "schema_check": asdict(check),
                "files": export.files, "verl_run": "not run by grpo_lab"}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return export


@dataclass
class LoadedExport:
    """An export folder read back: the verl rows, the overrides (absolute paths), the reward function."""

    folder: Path
    train_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]]
    overrides: dict[str, Any]
    manifest: dict[str, Any]
    compute_score: Callable[..., Any]

    def reward_set(self) -> RewardSet:
        """grpo_lab's own rewards with the export's names and weights: what ``compute_score`` scores with."""
        return prepare(self.manifest["experiment"]["rewards"], self.manifest["reward_weights"])


def load_export(folder: str | Path) -> LoadedExport:
    """Read an export back as verl would: both parquet files, the overrides, ``compute_score`` loaded by path."""
    import yaml

    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise MissingFileError(f"{folder} is not a verl export ({MANIFEST_FILE} is missing); write one with "
                               "grpo_lab.verl_export.export_verl(folder, config).")
    overrides = yaml.safe_load((folder / OVERRIDES_FILE).read_text(encoding="utf-8"))
    absolute = absolute_overrides(overrides, folder)
    return LoadedExport(folder, read_parquet(absolute["data.train_files"]), read_parquet(absolute["data.val_files"]),
                        absolute, json.loads(manifest_path.read_text(encoding="utf-8")),
                        load_reward_function(absolute["reward.custom_reward_function.path"],
                                             absolute["reward.custom_reward_function.name"]))


def load_reward_function(path: str | Path, name: str = REWARD_FUNCTION) -> Callable[..., Any]:
    """Load ``name`` from the file at ``path`` the way verl does (a module built from the file location)."""
    path = Path(path)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"verl_reward_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _readme(export: VerlExport, settings: Sequence[Setting], check: SchemaCheck) -> str:
    config, target = export.train_config, export.target
    table = "\n".join(f"| `{s.key}` | `{hydra_value(s.value)}` | {s.source} |" for s in settings)
    rewards = f"rewards {list(config.rewards)} with weights {list(export.reward_weights)}"
    ray_env = " and ".join(f"`{k}={v}`" for k, v in device_module.ray_worker_env("npu").items())
    ascend = ("" if not device_module.is_npu(target.device) else f"""
Ascend: `{LAUNCH_FILE}` sources the CANN and ATB environment scripts, sets `ASCEND_RT_VISIBLE_DEVICES`,
`HCCL_CONNECT_TIMEOUT` and {ray_env} (so that Ray leaves the visible NPUs to verl), passes
`trainer.device=npu` (verl detects the NPU itself when torch_npu is installed) and
`rollout.enable_chunked_prefill=False`. It never sets `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`:
vllm-ascend's sleep-mode allocator refuses it. verl's Ascend docs list optional performance switches
(`TASK_QUEUE_ENABLE`, `CPU_AFFINITY_CONF`, jemalloc).
""")
    return f"""# grpo_lab → verl: GRPO for `{config.model}` ({config.profile} profile)

Generated by `grpo_lab.verl_export` from the same experiment definition `grpo-lab train` uses.
**grpo_lab has not run verl on this export**: the files were generated here, and
{check.summary()}.

| file | what |
|---|---|
| `{TRAIN_FILE}` | {export.num_train_rows} training rows: `data_source`, `prompt`, `ability`, `reward_model`, `extra_info` |
| `{TEST_FILE}` | {export.num_test_rows} rows of the course's eval split (verl's validation) |
| `{REWARD_FILE}` | `{REWARD_FUNCTION}(data_source, solution_str, ground_truth, extra_info=None)`: {rewards} |
| `{REWARDS_SNAPSHOT}` | a verbatim copy of `grpo_lab/rewards.py`, which `{REWARD_FILE}` scores with |
| `{OVERRIDES_FILE}` | the Hydra overrides of verl's `ppo_trainer` config (paths relative to this folder) |
| `{LAUNCH_FILE}` | the launch command with the device variables |
| `{MANIFEST_FILE}` | the experiment, the target, checksums, the schema check |

## Launch

Copy this folder to a machine with verl (keys checked against verl {', '.join(VERL_CHECKED)}) and vLLM
(or vllm-ascend), then:

```bash
bash {LAUNCH_FILE}          # {target.nnodes} node(s) × {target.n_gpus_per_node} {target.device} devices
MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash {LAUNCH_FILE} trainer.logger='["console","wandb"]'
```

More than one node: start a Ray cluster first (`ray start --head` on one node, `ray start --address=…` on the
others) and launch on the head node. Keys are verl ≥ 0.7 names (`reward.custom_reward_function.*`); verl 0.9
no longer reads the old top-level `custom_reward_function.*`.
{ascend}
## Settings (TRL name → verl key)

Per-device sizes stay as in the experiment, so the global batch grows with the device count, as TRL's does when
`accelerate` launches the same config on {target.total_devices} devices. To keep the single-device batch, export with
a smaller `per_device_train_batch_size`.

| verl key | value | from |
|---|---|---|
{table}
"""
