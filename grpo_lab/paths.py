"""Where things live in the repository: shipped data, the tiny model, benchmarks, caches. One place for all."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
TINY_MODEL_DIR = DATA_DIR / "models" / "tiny-qwen2"
MODEL_CONFIGS_DIR = DATA_DIR / "configs"
"""``config.json`` files of the model shapes the course plans for (no weights)."""
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"
RESULTS_DIR = BENCHMARKS_DIR / "results"
"""Committed benchmark results (``cpu/``, ``h200/``)."""
SERVING_RESULTS_DIR = BENCHMARKS_DIR / "serving" / "results"
"""Committed load tests of the served model (``benchmarks/serving/run.py``): ``cpu_*.json``, ``h200_*.json``."""
CACHE_DIR = REPO_ROOT / ".cache"
"""Caches this checkout owns (vLLM's compiled graphs, matplotlib, Hugging Face)."""
