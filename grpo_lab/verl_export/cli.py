"""``grpo-lab verl-export`` (``python -m grpo_lab.verl_export``): ``grpo-lab train``'s options plus where verl runs."""

from __future__ import annotations

import argparse
import dataclasses

from grpo_lab.errors import GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.train import build_parser as train_parser
from grpo_lab.verl_export.export import export_verl
from grpo_lab.verl_export.folder import LAUNCH_FILE, MODEL_KEY, OVERRIDES_FILE, REWARD_FILE
from grpo_lab.verl_export.target import VerlTarget


def build_parser() -> argparse.ArgumentParser:
    """``grpo-lab train``'s options (the experiment) plus where verl runs."""
    parser = train_parser()
    parser.prog = "grpo-lab verl-export"
    parser.description = ("Write verl's GRPO inputs (parquet, compute_score module, Hydra overrides, launch script) "
                          "from the same options `grpo-lab train` takes. verl itself is not run.")
    group = parser.add_argument_group("verl target")
    group.add_argument("--out", required=True, help="the export folder")
    group.add_argument("--gpus", type=int, default=None, help="devices per node (default: visible ones, else 1)")
    group.add_argument("--nodes", type=int, default=1)
    group.add_argument("--tp", type=int, default=1, help="rollout tensor parallel size")
    group.add_argument("--device", choices=("cuda", "npu"), default=None, help="default: the profile's")
    group.add_argument("--val-size", type=int, default=None, help="rows of test.parquet")
    group.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    group.add_argument("--deep", action="store_true", help="also run verl's validate_config (needs verl importable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab verl-export --out DIR [--profile gpu] [--gpus 8] [--tp 1] [--device npu] …``."""
    args = vars(build_parser().parse_args(argv))
    target = VerlTarget(device=args.pop("device"), n_gpus_per_node=args.pop("gpus"), nnodes=args.pop("nodes"),
                        rollout_tensor_parallel_size=args.pop("tp"), val_size=args.pop("val_size"))
    out, overwrite, deep = args.pop("out"), args.pop("overwrite"), args.pop("deep")
    experiment = {k: v for k, v in args.items() if v is not dataclasses.MISSING}
    try:
        export = export_verl(out, TrainConfig(**experiment), target, overwrite=overwrite, deep=deep)
    except GrpoLabError as error:
        print(f"grpo-lab verl-export: {error}")
        return 2
    o = export.overrides
    print(f"verl export in {export.folder}: {export.num_train_rows} train / {export.num_test_rows} test rows, "
          f"{REWARD_FILE}, {OVERRIDES_FILE}, {LAUNCH_FILE}")
    print(f"  {o[MODEL_KEY]}: {o['data.train_batch_size']} prompts × n={o['actor_rollout_ref.rollout.n']} per step, "
          f"{o['trainer.total_training_steps']} steps, kl_loss_coef={o['actor_rollout_ref.actor.kl_loss_coef']:g}, "
          f"{export.target.nnodes}×{export.target.n_gpus_per_node} {export.target.device}, "
          f"rollout TP={o['actor_rollout_ref.rollout.tensor_model_parallel_size']}")
    print(f"  schema: {export.schema_check.summary()}")
    print(f"  not run here; on the verl machine: {export.launch_command}")
    return 0 if export.schema_check.ok is not False else 1
