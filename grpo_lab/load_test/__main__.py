"""``python -m grpo_lab.load_test``: ``grpo-lab load-test``."""

from grpo_lab.load_test.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
