"""``python -m grpo_lab.scale``: ``grpo-lab scale`` (and the trainer entry that ``accelerate launch`` runs)."""

from grpo_lab.scale.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
