"""``python -m grpo_lab.bench``: the bench's command line (:mod:`grpo_lab.bench.cli`)."""

from grpo_lab.bench.cli import main

raise SystemExit(main())
