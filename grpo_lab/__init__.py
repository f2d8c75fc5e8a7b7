"""grpo-lab: learn and run GRPO fine-tuning with TRL and vLLM on an Ascend NPU, an NVIDIA GPU or a CPU.

One experiment (``experiment.TrainConfig``, TRL's names) flows from the memory plan (``memory``) through training
(``train``) to deployment (``deploy``); README.md's "Architecture" lists every module and what it owns.
"""

__version__ = "0.1.0"
