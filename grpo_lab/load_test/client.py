"""The clients: ``concurrency`` streaming chat clients against a running server, bounded in time, errors by kind."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai

from grpo_lab import device
from grpo_lab.deploy import ServerDied, VLLMServer
from grpo_lab.errors import ConfigError
from grpo_lab.load_test.config import LoadTest
from grpo_lab.load_test.records import LoadResult, RequestRecord, error_kind, format_table
from grpo_lab.load_test.workloads import Conversation
from grpo_lab.servers import metric_totals

WATCH_INTERVAL_S = 0.25  # how often the run checks that the server process still runs
SERVER_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
"""Prometheus counters of vLLM's ``/metrics`` read before and after a run."""


class ServerDiedDuringLoad(ServerDied):
    """The server process ended during a load test; ``result`` holds what was measured until then."""

    def __init__(self, message: str, result: LoadResult):
        super().__init__(message)
        self.result = result


def server_counters(base_url: str) -> dict[str, float]:
    """The totals of :data:`SERVER_COUNTERS` (no API key needed); {} if unreadable."""
    try:
        return metric_totals(base_url, SERVER_COUNTERS)
    except OSError:
        return {}


def server_settings(server: VLLMServer) -> dict[str, Any]:
    """The knobs a result was measured with (no paths: the model is named by its folder)."""
    c = server.config
    return {"model": Path(c.model).name, "device": device.detect(), "max_num_seqs": c.max_num_seqs,
            "max_model_len": c.max_model_len, "enable_prefix_caching": c.enable_prefix_caching,
            "block_size": c.block_size, "enforce_eager": c.eager(), "dtype": c.dtype,
            "gpu_memory_utilization": None if device.is_cpu() else c.gpu_memory_utilization,
            "start_seconds": server.start_seconds}


class _Run:
    """The state one load test shares between its clients."""

    def __init__(self, server: VLLMServer, config: LoadTest, conversations: Sequence[Conversation]):
        self.server, self.config, self.conversations = server, config, conversations
        self.next_conversation = self.sent = 0
        self.records: list[RequestRecord] = []
        self.start = time.perf_counter()
        self.died = False
        self.client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.config.api_key or "EMPTY",
                                         max_retries=0, timeout=config.request_timeout_s)

    def may_send(self) -> bool:
        in_time = time.perf_counter() - self.start < self.config.max_seconds
        return not self.died and in_time and (self.config.requests is None or self.sent < self.config.requests)

    async def client_loop(self) -> None:
        """One client: the turns of one conversation after the other, then the next conversation."""
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
        # the raw events, parsed with json.loads: cheaper than the SDK's object per chunk; error statuses still raise
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
    """One load test against a started ``server``; :class:`ServerDiedDuringLoad` (with the partial result) if the
    server process ends during it. Works in a notebook too (its event loop is left alone)."""
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
    """One server setting measured: a server with ``knobs`` (:class:`~grpo_lab.deploy.ServeConfig` fields), warmed
    up, each named load run (its name is the result's label), then ``then(server)`` if given; stopped after."""
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
