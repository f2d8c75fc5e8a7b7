"""``python -m grpo_lab.verl_export``: ``grpo-lab verl-export``."""

from grpo_lab.verl_export.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
