"""What an export folder holds, by name: its files, the overrides that name them, the verl releases checked."""

from __future__ import annotations

TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
REWARD_FILE = "reward_fn.py"
REWARD_FUNCTION = "compute_score"
REWARDS_SNAPSHOT = "grpo_lab_rewards.py"
OVERRIDES_FILE = "verl_overrides.yaml"
LAUNCH_FILE = "run_verl.sh"
README_FILE = "README.md"
MANIFEST_FILE = "export.json"
PATH_KEYS = ("data.train_files", "data.val_files", "reward.custom_reward_function.path")
"""Overrides holding a file of the export folder: stored relative, made absolute at launch."""
MODEL_KEY = "actor_rollout_ref.model.path"
VERL_CHECKED = ("0.7.1", "0.8.0", "0.9.1")
"""verl releases whose config schema accepted every exported key (Hydra composition) when this was written."""
