"""``python -m lab.bench``: the bench's command line (:mod:`lab.bench.cli`)."""

from lab.bench.cli import main

raise SystemExit(main())
