"""What a load test measured: one record per request, the run's summary (:class:`LoadResult`), error kinds, and the
results file (:func:`save_results`, :func:`load_results`)."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openai

from grpo_lab.errors import ConfigError
from grpo_lab.load_test.config import LoadTest

PERCENTILES = (50, 90, 99)
ERROR_KINDS = {
    "http_400": "the server refused the request: longer than max_model_len, or malformed (the body says which)",
    "http_401": "wrong or missing API key",
    "connection": "no answer: connection refused, reset, or closed in the middle of a stream",
    "timeout": "no complete answer within request_timeout_s",
    "stream_error": "the server sent an error event inside the stream",
    "server_died": "in flight when the server process ended",
}
"""What each error kind a load test counts means."""


@dataclass
class RequestRecord:
    """One request: when it started (seconds into the run), its latencies, tokens, and its error if it failed."""

    conversation: int
    turn: int
    start_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error_kind: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` in milliseconds of values in seconds (NaN when there are none)."""
    if not values:
        return {f"p{p}": math.nan for p in PERCENTILES}
    return {f"p{p}": float(v) * 1000 for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))}


@dataclass
class LoadResult:
    """What one load test measured; :meth:`record` is the flat JSON row the benchmarks and plots read."""

    config: LoadTest
    records: list[RequestRecord]
    seconds: float
    server: dict[str, Any] = field(default_factory=dict)
    server_counters: dict[str, float] = field(default_factory=dict)
    client_cpu_s: float = 0.0
    stopped: str = "done"  # or why it stopped early
    label: str = ""

    @property
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def errors(self) -> dict[str, int]:
        return dict(Counter(r.error_kind for r in self.records if not r.ok))

    def record(self) -> dict[str, Any]:
        done = self.completed
        output_tokens = sum(r.output_tokens for r in done)
        ttft = percentiles([r.ttft_s for r in done if r.ttft_s is not None])
        e2e = percentiles([r.e2e_s for r in done])
        hits, queries = (self.server_counters.get(f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
        return {
            "label": self.label, "concurrency": self.config.concurrency, "requests": len(self.records),
            "completed": len(done), "errors": len(self.records) - len(done), "errors_by_kind": self.errors,
            "requests_per_s": len(done) / self.seconds if self.seconds else math.nan,
            "output_tokens_per_s": output_tokens / self.seconds if self.seconds else math.nan,
            "mean_output_tokens": output_tokens / len(done) if done else math.nan,
            "mean_prompt_tokens": sum(r.prompt_tokens for r in done) / len(done) if done else math.nan,
            **{f"ttft_{k}_ms": v for k, v in ttft.items()}, **{f"e2e_{k}_ms": v for k, v in e2e.items()},
            "seconds": self.seconds, "client_cpu_share": self.client_cpu_s / self.seconds if self.seconds else 0.0,
            "prefix_cache_hit_rate": hits / queries if queries else None,
            "preemptions": self.server_counters.get("vllm:num_preemptions_total"),
            "stopped": self.stopped, "workload": self.config.workload,
            "turns": self.config.turns if self.config.workload == "chat" else 1,
            "max_tokens": self.config.max_tokens, "request_limit": self.config.requests,
            "max_seconds": self.config.max_seconds, "server": self.server,
        }

    def __str__(self) -> str:
        return format_table([self.record()])

    def first_errors(self, count: int = 3) -> list[str]:
        """One example message per error kind (the first ``count`` kinds)."""
        seen: dict[str, str] = {}
        for r in self.records:
            if not r.ok and r.error_kind not in seen:
                seen[r.error_kind] = f"{r.error_kind}: {r.error}"
        return list(seen.values())[:count]


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """The records as a text table: one row per run."""
    head = (f"{'run':<22}{'clients':>8}{'requests':>9}{'errors':>7}{'req/s':>8}{'tok/s':>8}"
            f"{'TTFT p50/p99 ms':>18}{'e2e p50/p90/p99 ms':>22}")
    rows = [head, "-" * len(head)]
    for r in records:
        notes = ", ".join(f"{k} {n}" for k, n in r["errors_by_kind"].items())
        notes = f"   ({notes})" if notes else ""
        if r.get("repeats", 1) > 1:  # a row of experiment_runs: the median of repeated runs
            low, high = r["requests_per_s_range"]
            notes += f"   [median of {r['repeats']}: {low:.1f}-{high:.1f} req/s, {r['errors_all_repeats']} errors in all]"
        rows.append(f"{r['label'] or r['workload']:<22.22}{r['concurrency']:>8}{r['requests']:>9}{r['errors']:>7}"
                    f"{r['requests_per_s']:>8.1f}{r['output_tokens_per_s']:>8.0f}"
                    f"{r['ttft_p50_ms']:>9.0f}/{r['ttft_p99_ms']:<8.0f}"
                    f"{r['e2e_p50_ms']:>9.0f}/{r['e2e_p90_ms']:.0f}/{r['e2e_p99_ms']:.0f}{notes}")
    return "\n".join(rows)


def error_kind(exc: BaseException) -> str:
    """The kind an exception counts as (see the module docstring); subclasses are matched before their bases."""
    if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError)):
        return "timeout"
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIError):
        return "stream_error"
    # a connection that breaks mid-stream reaches us as the HTTP library's own error (httpx or httpx2)
    if any(base.__name__ in ("TransportError", "NetworkError") for base in type(exc).__mro__):
        return "connection"
    return type(exc).__name__


SCHEMA = "grpo-lab.load-test/1"


def save_results(records: Sequence[dict[str, Any]], path: str | Path, command: str, **extra) -> Path:
    """One JSON file: the command that made it and one record per run (each with ``concurrency`` and ``errors``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"schema": SCHEMA, "command": command, **extra, "runs": list(records)}
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    return path


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file written by :func:`save_results`, checked."""
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if body.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not a load-test results file (schema {body.get('schema')!r}, want {SCHEMA}).")
    return body
