"""``python -m grpo_lab.rollout``: HF generate and vLLM side by side (see :mod:`grpo_lab.rollout.compare`)."""

from grpo_lab.rollout.compare import main

if __name__ == "__main__":
    raise SystemExit(main())
