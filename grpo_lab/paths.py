"""Where things live in the repository: shipped data, the tiny model, caches. One place for all."""

from __future__ import annotations

__all__ = ["TINY_MODEL_DIR"]

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
TINY_MODEL_DIR = DATA_DIR / "models" / "tiny-qwen2"
"""The tiny Qwen2 model the repository builds and ships (the ``tiny`` profile's)."""
MODEL_CONFIGS_DIR = DATA_DIR / "configs"
"""``config.json`` files of the model shapes the course plans for (no weights)."""
CACHE_DIR = REPO_ROOT / ".cache"
"""Caches this checkout owns (vLLM's compiled graphs, matplotlib, Hugging Face)."""
