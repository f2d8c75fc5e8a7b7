"""The lab beside ``grpo_lab``: the harnesses that measure the course and the one reader of each committed result.

``grpo_lab`` is the product and holds code only; what was measured, on which card, when and with which command lives
under ``benchmarks/``, and this package reads it. It may import ``grpo_lab``; ``grpo_lab`` never imports it. A new
measurement changes files under ``benchmarks/`` only.

Modules, each reading its benchmark's files into small typed records that carry a
:class:`~lab.committed.Provenance` (card, date, commit, command, as the file records them):

* :mod:`lab.committed`: where committed results live, :func:`~lab.committed.read_committed`, :class:`Provenance`;
* :mod:`lab.bench`: the performance harness (``python -m lab.bench``) and the catalogue of its committed runs;
* :mod:`lab.rollout`: the committed rollout smoke runs (``python -m lab.rollout`` on random weights of a shape);
* :mod:`lab.results`: the committed GRPO experiments (KL brake, SmolLM2, GSM8K);
* :mod:`lab.memory` and :mod:`lab.capped`: the planner against measured peaks, and runs under a device memory cap;
* :mod:`lab.serving`: the committed load tests of a served model;
* :mod:`lab.scale`: server mode and asynchronous GRPO against colocate;
* :mod:`lab.tool_lesson`: the tool lesson in one call, and its committed GPU run;
* :mod:`lab.verl_parity`: a verl run read back and checked with ``grpo_lab``, and the committed verl runs.

``make install`` installs it editable beside ``grpo_lab`` (``benchmarks/pyproject.toml``); ``pip install .`` of
``grpo_lab`` does not.
"""
