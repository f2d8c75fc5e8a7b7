"""grpo-lab: learn and run GRPO fine-tuning with TRL and vLLM on an Ascend NPU, an NVIDIA GPU or a CPU.

Modules, one concept each: ``device`` (hardware), ``env`` (versions, verified stacks, smoke test),
``profiles`` (one switch for sizes), ``data``, ``models``, ``rollout``, ``rewards``, ``advantages``,
``memory``, ``plots``, ``course`` (runs the notebooks) and ``cli``.
"""

__version__ = "0.1.0"
