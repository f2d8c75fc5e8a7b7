"""Bad-input corpus (issue 9, part 2) and safe defaults (issue 9, part 4).

Corpus: every case builds its inputs under ``tmp_path``, then feeds one bad input to ``grpo_lab`` and checks
that the exception has the expected type, that its message names the problem AND the fix, and that no file
was changed: every file under ``tmp_path`` and the shipped data are hashed before and after. A guard turns
any rollout engine start or server process into a failure, so each refusal is shown to come before an
engine would start.

Safe defaults: servers bind to 127.0.0.1 and take an API key, remote code is never trusted, and weights are
read only from safetensors (a pickle "canary" proves a ``pytorch_model.bin`` is never unpickled).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import pickle
import re
import shutil
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_lab import (
    data,
    deploy,
    device,
    env,
    experiment,
    memory,
    models,
    rewards,
    runs,
    servers,
    train,
)
from grpo_lab.errors import ConfigError, DataError, ExistingFileError, MissingFileError
from grpo_lab.rollout import (
    RolloutConfig,
    Sampling,
    TokenizerMismatchError,
    check_tokenizers,
    encode_prompts,
    open_engine,
)
from grpo_lab.rollout.engine import RolloutEngine
from grpo_lab.rollout.vllm_backend import child_processes, engine_arguments

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY = models.TINY_MODEL_DIR
SHIPPED = (TINY, data.DATA_DIR / "train.jsonl", data.DATA_DIR / "eval.jsonl")
CHAT = [{"role": "user", "content": "A car travels 120 km in 2 hours. What is its average speed in km/h? " * 3}]
ROW = {"id": "r-1", "type": "average", "lang": "en", "prompt": [{"role": "user", "content": "1 + 1 = ?"}],
       "answer": "2", "unit": "", "completion": "1 + 1 = 2\n#### 2"}
# Small model shapes for the memory planner (config.json fields), written inline so the corpus needs no file.
SMALL_SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen2"}
SEVEN_B_SHAPE = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "vocab_size": 32000}


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------
def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (files or folders), keyed by path: the state of the inputs."""
    digests = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


class Inputs:
    """What a case may use to build its bad input: a scratch folder, monkeypatch, and a few builders."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch):
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        self.sockets: list[socket.socket] = []

    def write(self, name: str, text: str) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def jsonl(self, name: str, *rows: dict) -> Path:
        return self.write(name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def model_copy(self, name: str = "model", drop: tuple[str, ...] = ()) -> Path:
        """A copy of the shipped tiny model (with its manifest), without the files in ``drop``."""
        folder = self.tmp / name
        shutil.copytree(TINY, folder)
        for file in drop:
            (folder / file).unlink()
        return folder

    def pickle_only_model(self, name: str = "pickled") -> Path:
        """A model folder whose only weights are a pickle that would create ``CANARY`` if it were ever loaded."""
        folder = self.model_copy(name, drop=("model.safetensors", models.MANIFEST_NAME))
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": Canary(folder / "CANARY")}))
        return folder

    def checkpoint(self, run: Path, step: int, complete: bool = True) -> Path:
        """A fake ``checkpoint-N`` folder; an incomplete one lacks the optimizer and scheduler state."""
        folder = run / runs.CHECKPOINTS / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        if complete:
            (folder / "optimizer.pt").write_bytes(b"adam")
            (folder / "scheduler.pt").write_bytes(b"lr")
        return folder

    def finished_run(self, name: str = "run") -> Path:
        """A run folder with finished work in it (config, metrics up to step 10)."""
        run = self.tmp / name
        self.write(f"{name}/{runs.CONFIG_FILE}", json.dumps({"config": {"max_steps": 20}}))
        self.write(f"{name}/{runs.METRICS_FILE}", "".join(json.dumps({"step": s, "reward": 0.5}) + "\n"
                                                            for s in range(1, 11)))
        return run

    def busy_port(self) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        self.sockets.append(listener)
        return listener.getsockname()[1]


class Canary:
    """Unpickling this object creates a file: proof that a pickle was (or was not) loaded."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def reward_fn(body: Callable) -> Callable:
    """A reward in TRL's signature whose per-batch result is ``body(completions)``."""

    def my_reward(prompts, completions, **kwargs):
        return body(completions)

    return my_reward


@dataclass(frozen=True)
class Case:
    id: str
    error: type[BaseException]
    problem: str
    """Regular expression (case-insensitive) the message must match: what was wrong."""
    fix: str
    """Regular expression the message must also match: what to do about it."""
    build: Callable[[Inputs], Callable[[], object]]
    """Builds the inputs and returns the call that must be refused."""


CASES: list[Case] = []


def case(case_id: str, error: type[BaseException], problem: str, fix: str):
    def register(build: Callable[[Inputs], Callable[[], object]]):
        CASES.append(Case(case_id, error, problem, fix, build))
        return build

    return register


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------
@case("data/missing-file", MissingFileError, r"no data file at .*missing\.jsonl", "check the path")
def _(x: Inputs):
    return lambda: data.load_jsonl(x.tmp / "missing.jsonl")


@case("data/bad-json-line", DataError, r"line 2: not valid JSON", "each line must be one JSON object")
def _(x: Inputs):
    path = x.write("bad.jsonl", json.dumps(ROW) + "\n" + '{"prompt": "2 + 2", "answer": 4,\n')
    return lambda: data.load_jsonl(path)


@case("data/line-is-not-an-object", DataError,
      r"line 1: expected a JSON object, got list", "write each row as one object")
def _(x: Inputs):
    path = x.write("list.jsonl", '["1 + 1", "2"]\n')
    return lambda: data.load_jsonl(path)


@case("data/missing-prompt-column", DataError,
      r"missing column\(s\) \['prompt'\]", r"every row needs \['prompt', 'answer'\]")
def _(x: Inputs):
    path = x.jsonl("no_prompt.jsonl", {"question": "1 + 1 = ?", "answer": "2"})
    return lambda: data.load_jsonl(path)


@case("data/missing-answer-column", DataError, r"line 2: missing column\(s\) \['answer'\]", "every row needs")
def _(x: Inputs):
    path = x.jsonl("no_answer.jsonl", ROW, {"prompt": "2 + 2 = ?"})
    return lambda: data.load_jsonl(path)


@case("data/prompt-wrong-type", DataError, r"'prompt' must be a string or a list of chat messages",
      r"\[\{'role': 'user', 'content'")
def _(x: Inputs):
    path = x.jsonl("number_prompt.jsonl", {"prompt": 42, "answer": "2"})
    return lambda: data.load_jsonl(path)


@case("data/gsm8k-without-marker", DataError,
      r"does not end with '#### <number>'", r"End the solution with a last line")
def _(x: Inputs):
    path = x.jsonl("gsm8k.jsonl", {"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = 5 apples"})
    return lambda: data.load_gsm8k("train", path=path)


@case("data/gsm8k-missing-question", DataError, r"missing column\(s\) \['question'\]", "every row needs")
def _(x: Inputs):
    path = x.jsonl("gsm8k_q.jsonl", {"problem": "Tom has 3 apples.", "answer": "#### 3"})
    return lambda: data.load_gsm8k("train", path=path)


@case("data/unknown-split", ConfigError, r"unknown split 'test'", r"use 'train' or 'eval'")
def _(x: Inputs):
    return lambda: data.load_split("test")


@case("data/unknown-problem-type", ConfigError, r"unknown or empty problem types: \['geometry'\]", "choose from")
def _(x: Inputs):
    return lambda: data.generate_problems(4, seed=0, types=["geometry"])


@case("data/empty-dataset", DataError, "no rows to turn into a dataset", "check the data file")
def _(x: Inputs):
    return lambda: data.to_dataset([])


# --------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------
def _call_validated(fn: Callable, completions=("#### 2", "#### 3"), **columns):
    columns.setdefault("answer", ["2"] * len(completions))
    safe = rewards.validate_reward(fn, mode="raise")
    return lambda: safe(prompts=["q"] * len(completions), completions=list(completions), **columns)


@case("rewards/wrong-return-length", rewards.RewardValidationError, r"returned 1 values for 2 completions",
      "return exactly one float")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: [1.0]))


@case("rewards/nan", rewards.RewardValidationError, r"sample 1: it returned nan", "guard divisions")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: [1.0, math.nan]))


@case("rewards/inf", rewards.RewardValidationError,
      r"sample 0: it returned inf", "return None for samples it cannot score")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: [math.inf, 0.0]))


@case("rewards/non-number", rewards.RewardValidationError, r"returned 'high' \(str\), not a number",
      "return a float per completion")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: ["high", 0.0]))


@case("rewards/not-a-list", rewards.RewardValidationError, r"returned 1\.0 \(float\) instead of a list",
      "return a list of floats, one per completion")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: 1.0))


@case("rewards/raising-function", rewards.RewardValidationError, r"sample 1: it raised ZeroDivisionError",
      "handle this input inside the function")
def _(x: Inputs):
    return _call_validated(reward_fn(lambda completions: [1 / len(c) for c in completions]), completions=("ok", ""))


@case("rewards/bad-signature", rewards.RewardSignatureError, r"'two_args' does not accept \*\*kwargs",
      r"def two_args\(prompts, completions, \*\*kwargs\)")
def _(x: Inputs):
    def two_args(prompts, completions):
        return [0.0] * len(completions)

    return lambda: rewards.validate_reward(two_args)


@case("rewards/unknown-registry-name", ConfigError, r"Unknown reward 'corectness'", r"Use one of these names")
def _(x: Inputs):
    return lambda: rewards.get_reward("corectness")


@case("rewards/missing-answer-column", DataError, r"needs the dataset column 'answer'", r"Add a 'answer' column")
def _(x: Inputs):
    return lambda: rewards.get_reward("correctness")(prompts=["q"], completions=["#### 2"], unit=["m"])


@case("rewards/answer-without-number", DataError,
      r"reference answer 'two' holds no number", r"Fix the dataset's `answer`")
def _(x: Inputs):
    return lambda: rewards.get_reward("correctness")(prompts=["q"], completions=["#### 2"], answer=["two"])


@case("rewards/weights-mismatch", ConfigError, r"weights \(1\) must match number of reward functions \(2\)",
      "give one weight per function")
def _(x: Inputs):
    return lambda: rewards.WeightedReward([rewards.get_reward("correctness"), rewards.get_reward("format")], [1.0])


@case("rewards/bad-validation-mode", rewards.RewardValidationError, r"reward_errors='ignore'",
      r"use 'raise' \(stop at a broken reward.*or 'skip'")
def _(x: Inputs):
    return lambda: rewards.validate_reward(rewards.get_reward("format"), mode="ignore")


# --------------------------------------------------------------------------------------------------
# Rollout (open_engine refuses before any engine starts; the guard below proves it)
# --------------------------------------------------------------------------------------------------
@case("rollout/prompt-longer-than-max-model-len", ConfigError,
      r"prompt 0 has \d+ tokens and is longer than max_model_len=16",
      "Shorten the prompt")
def _(x: Inputs):
    model = x.model_copy()
    return lambda: open_engine(str(model), backend="hf", max_model_len=16, max_tokens=8, prompts=[CHAT])


@case("rollout/no-room-for-completion", ConfigError, r"leaves no room for max_tokens=64 within max_model_len=64",
      "lower max_tokens")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", max_model_len=64, max_tokens=64, prompts=["1 + 1 ="])


@case("rollout/gpu-memory-utilization-above-1", memory.MemoryPlanError, r"gpu_memory_utilization=1\.5: must be in \(0, 1\]",
      r"e\.g\. 0\.3 next to a trainer")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", gpu_memory_utilization=1.5)


@case("rollout/gpu-memory-utilization-zero", memory.MemoryPlanError, r"gpu_memory_utilization=0: must be in \(0, 1\]",
      r"0\.9 for a device of its own")
def _(x: Inputs):
    return lambda: RolloutConfig(gpu_memory_utilization=0)


@case("rollout/n-below-1", ConfigError, r"n=0: the number of completions per prompt", r"must be an integer >= 1")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", n=0)


@case("rollout/negative-temperature", ConfigError, r"temperature=-0\.5", r"must be >= 0 \(0 means greedy\)")
def _(x: Inputs):
    return lambda: Sampling(temperature=-0.5)


@case("rollout/unknown-backend", ConfigError, r"unknown backend 'tensorrt'", "use one of auto, vllm, hf")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="tensorrt")


@case("rollout/missing-model-path", MissingFileError, r"model folder .*no-such-model does not exist", "check the path")
def _(x: Inputs):
    return lambda: open_engine(str(x.tmp / "no-such-model"), backend="hf")


@case("rollout/model-env-var-missing-path", MissingFileError, r"model folder .*gone does not exist", "check the path")
def _(x: Inputs):
    x.monkeypatch.setenv(models.MODEL_ENV_VAR, str(x.tmp / "gone"))
    return lambda: open_engine(backend="hf")


@case("rollout/model-folder-without-config", MissingFileError, r"has no config\.json",
      "pass the folder that holds the model")
def _(x: Inputs):
    model = x.model_copy(drop=("config.json", models.MANIFEST_NAME))
    return lambda: open_engine(str(model), backend="hf")


@case("rollout/model-path-is-a-file", ConfigError, r"model path .*config\.json is a file", "pass the folder that holds")
def _(x: Inputs):
    model = x.model_copy()
    return lambda: open_engine(str(model / "config.json"), backend="hf")


@case("rollout/pickle-only-weights", MissingFileError, r"has no \*\.safetensors weights \(only pickle weights: "
      r"pytorch_model\.bin\)", "Pass the folder that holds model.safetensors")
def _(x: Inputs):
    model = x.pickle_only_model()
    return lambda: open_engine(str(model), backend="hf")


@case("rollout/unknown-setting", ConfigError, r"unknown setting\(s\) \['num_generations'\]", "RolloutConfig has")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", num_generations=4)


@case("rollout/unknown-load-format", ConfigError, r"load_format='pt'", "use one of auto, dummy")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", load_format="pt")


@case("rollout/vllm-options-trust-remote-code", ConfigError, r"vllm_options sets trust_remote_code",
      "pick a model whose architecture transformers and vLLM support natively")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", vllm_options={"trust_remote_code": True})


@case("rollout/vllm-options-load-format", ConfigError, r"vllm_options sets \['load_format'\]",
      "use the RolloutConfig field of that name")
def _(x: Inputs):
    return lambda: RolloutConfig(vllm_options={"load_format": "pt"})


@case("rollout/unknown-device", device.DeviceError, r"Unknown device 'tpu'", "use one of")
def _(x: Inputs):
    return lambda: open_engine(str(TINY), backend="hf", device_kind="tpu")


@case("rollout/no-prompts", DataError, "no prompts given", "pass at least one prompt")
def _(x: Inputs):
    return lambda: encode_prompts(None, [])


@case("rollout/single-prompt-not-in-a-list", DataError, "pass a list of prompts", "wrap a single prompt in a list")
def _(x: Inputs):
    return lambda: encode_prompts(None, CHAT)


@case("rollout/tokenizer-mismatch", TokenizerMismatchError,
      r"rollout and trainer tokenizers differ.*chat template differs",
      "load both from the same model folder")
def _(x: Inputs):
    other = x.model_copy("other")
    template = other / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>", "<|start|>"))
    return lambda: check_tokenizers(str(TINY), str(other))


# --------------------------------------------------------------------------------------------------
# Training configuration and checkpoints (what grpo_lab.train checks today)
# --------------------------------------------------------------------------------------------------
@case("train/num-generations-not-dividing-batch", ConfigError, r"num_generations=4 does not divide the generation batch",
      r"Use num_generations in \[2, 3, 6\]")
def _(x: Inputs):
    return lambda: train.TrainConfig(num_generations=4, per_device_train_batch_size=6)


@case("train/num-generations-1", ConfigError, r"num_generations=1", "needs at least 2")
def _(x: Inputs):
    return lambda: train.TrainConfig(num_generations=1, per_device_train_batch_size=8)


@case("train/completion-beyond-max-model-len", ConfigError, r"= 656 exceeds the model's max_model_len \(128\)",
      "Lower max_completion_length to at most 20")
def _(x: Inputs):
    return lambda: experiment.check_lengths(train.TrainConfig(max_prompt_length=96, max_completion_length=500), 128)


@case("train/dataset-without-prompt", ConfigError, r"1 of 2 rows have no 'prompt' column", "Add it")
def _(x: Inputs):
    rows = [ROW, {"answer": "3"}]
    return lambda: train.check_dataset(rows, rewards.prepare(["correctness"]).funcs)


@case("train/dataset-without-answer", ConfigError, r"rows have no 'answer' column \(the reward 'correctness'", "Add it")
def _(x: Inputs):
    rows = [{"prompt": ROW["prompt"]}]
    return lambda: train.check_dataset(rows, rewards.prepare(["correctness"]).funcs)


@case("train/empty-dataset", ConfigError, "has no rows to train on", "check the path and the train_types and")
def _(x: Inputs):
    return lambda: train.check_dataset([], [])


@case("train/fewer-rows-than-a-step", ConfigError, r"1 training rows .* a step needs 4 prompts",
      "fewer prompts per step")
def _(x: Inputs):
    path = x.jsonl("train.jsonl", ROW)
    config = train.TrainConfig(profile="tiny", dataset=str(path), train_types=(), output_dir=str(x.tmp / "run"))
    return lambda: train.build_trainer(experiment.plan(config, device.Machine("cpu", bf16=False, memory_gib=24)))


@case("train/dataset-file-missing-answer", ConfigError, r"no 'answer' column", "answer_column=")
def _(x: Inputs):
    path = x.jsonl("train.jsonl", {"prompt": "1 + 1 = ?", "solution": "2"})
    config = train.TrainConfig(profile="tiny", dataset=str(path), train_types=(), train_languages=())
    return lambda: train.build_trainer(experiment.plan(config, device.Machine("cpu", bf16=False, memory_gib=24)))


@case("train/named-answer-column-missing", DataError, r"missing column\(s\) \['result'\]", "every row needs")
def _(x: Inputs):
    path = x.jsonl("train.jsonl", {"prompt": "1 + 1 = ?", "solution": "2"})
    return lambda: experiment.load_train_rows(train.TrainConfig(dataset=str(path), answer_column="result"))


@case("train/unknown-train-type", ConfigError,
      r"train_types \['geometry'\] do not occur", r"its types are \['average'\]")
def _(x: Inputs):
    path = x.jsonl("train.jsonl", ROW)
    return lambda: experiment.load_train_rows(train.TrainConfig(dataset=str(path), train_types=("geometry",)))


@case("train/unknown-reward-name", ConfigError, r"Unknown reward 'accuracy'", "Use one of these names")
def _(x: Inputs):
    return lambda: rewards.prepare(["accuracy"])


@case("train/resume-missing-checkpoint", runs.CheckpointError, r"no checkpoint at .*checkpoint-7",
      r"available: checkpoint-5")
def _(x: Inputs):
    run = x.finished_run()
    x.checkpoint(run, 5)
    return lambda: runs.resolve_resume(run, str(run / runs.CHECKPOINTS / "checkpoint-7"))


@case("train/resume-with-no-checkpoints", runs.CheckpointError,
      r"resume_from_checkpoint=True but .* holds no checkpoint",
      "start a fresh run")
def _(x: Inputs):
    run = x.finished_run()
    return lambda: runs.resolve_resume(run, True)


@case("train/resume-partial-checkpoint", runs.CheckpointError, r"checkpoint-10 is incomplete \(missing optimizer\.pt, "
      r"scheduler\.pt\)", "resume from the previous checkpoint")
def _(x: Inputs):
    run = x.finished_run()
    x.checkpoint(run, 5)
    x.checkpoint(run, 10, complete=False)
    return lambda: runs.resolve_resume(run, True)


@case("train/run-resume-partial-checkpoint", runs.CheckpointError, r"checkpoint-10 is incomplete",
      "Delete that folder and resume from the previous checkpoint")
def _(x: Inputs):
    run = x.finished_run()
    x.checkpoint(run, 10, complete=False)
    return lambda: train.train(train.TrainConfig(profile="tiny", output_dir=str(run), resume_from_checkpoint=True,
                                                 live_plot=False))


@case("train/run-into-finished-run", ExistingFileError, r"already holds a run", "resume_from_checkpoint=True, or choose "
      "another output_dir")
def _(x: Inputs):
    run = x.finished_run()
    return lambda: train.train(train.TrainConfig(profile="tiny", output_dir=str(run), live_plot=False))


@case("train/reward-weights-mismatch", ConfigError, r"has 2 weight\(s\) for 1 reward\(s\)", "give one weight per reward")
def _(x: Inputs):
    config = train.TrainConfig(profile="tiny", reward_weights=(1.0, 0.5), output_dir=str(x.tmp / "run"))
    return lambda: train.build_trainer(experiment.plan(config, device.Machine.detect()))


# --------------------------------------------------------------------------------------------------
# Memory planner
# --------------------------------------------------------------------------------------------------
def _plan(model=SMALL_SHAPE, **overrides):
    kwargs = {"device_memory_gib": 32, "device_kind": "npu", "per_device_train_batch_size": 8, "num_generations": 8}
    return lambda: memory.plan_memory(model, **{**kwargs, **overrides})


@case("memory/zero-batch", memory.MemoryPlanError, r"per_device_train_batch_size .*got 0", "must be a positive integer")
def _(x: Inputs):
    return _plan(per_device_train_batch_size=0)


@case("memory/negative-completion-length", memory.MemoryPlanError, r"max_completion_length .* got -16",
      "must be a positive integer")
def _(x: Inputs):
    return _plan(max_completion_length=-16)


@case("memory/negative-device-memory", memory.MemoryPlanError, r"device_memory_gib .* got -8",
      "must be a positive number of GiB")
def _(x: Inputs):
    return _plan(device_memory_gib=-8)


@case("memory/utilization-out-of-range", memory.MemoryPlanError, r"got 1\.2", r"fraction of the device's total memory "
      r"vLLM may take")
def _(x: Inputs):
    return _plan(vllm_gpu_memory_utilization=1.2)


@case("memory/config-missing-fields", memory.MemoryPlanError, r"lacks hidden_size, vocab_size",
      "the planner needs hidden_size")
def _(x: Inputs):
    config = {k: v for k, v in SMALL_SHAPE.items() if k not in ("hidden_size", "vocab_size")}
    return _plan(config)


@case("memory/config-file-missing", MissingFileError, r"No config\.json at", "pass a model folder, a config.json path")
def _(x: Inputs):
    return _plan(x.tmp / "no-model")


@case("memory/unknown-precision", memory.MemoryPlanError, r"Unknown precision 'int4'", "use one of bf16, mixed, fp32")
def _(x: Inputs):
    return _plan(precision="int4")


@case("memory/unknown-field", memory.MemoryPlanError, r"Unknown training field\(s\) \['batch'\]", "known:")
def _(x: Inputs):
    return _plan(batch=8)


@case("memory/plan-cannot-fit", memory.DoesNotFitError, r"Cannot fit at any batch size on 8 GiB", "It would fit with")
def _(x: Inputs):
    plan = _plan(SEVEN_B_SHAPE, device_memory_gib=8, device_kind="cuda")
    return lambda: plan().check()


@case("memory/utilization-leaves-trainer-too-little", memory.DoesNotFitError, r"0\.95 leaves the trainer",
      r"Turn vllm_gpu_memory_utilization down first.*use at most 0\.\d+")
def _(x: Inputs):
    plan = _plan(vllm_gpu_memory_utilization=0.95)
    return lambda: plan().check()


# --------------------------------------------------------------------------------------------------
# Checkpoints and model folders
# --------------------------------------------------------------------------------------------------
@case("models/missing-file", models.ModelIntegrityError,
      "missing file: tokenizer.json", "restore or re-export the model")
def _(x: Inputs):
    folder = x.model_copy(drop=("tokenizer.json",))
    return lambda: models.verify_model_dir(folder)


@case("models/altered-file", models.ModelIntegrityError,
      r"altered file \(sha256 differs from the manifest\): config\.json",
      "rewrite its manifest with grpo_lab.models.write_manifest")
def _(x: Inputs):
    folder = x.model_copy()
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers"', '"num_hidden_layers" ', 1))
    return lambda: models.verify_model_dir(folder)


@case("models/extra-weights", models.ModelIntegrityError,
      "unexpected weights file not in the manifest: pytorch_model.bin",
      "restore or re-export")
def _(x: Inputs):
    folder = x.model_copy()
    (folder / "pytorch_model.bin").write_bytes(b"not listed")
    return lambda: models.verify_model_dir(folder)


@case("models/missing-manifest", models.ModelIntegrityError, r"has no manifest\.json", "restore or re-export")
def _(x: Inputs):
    folder = x.model_copy(drop=(models.MANIFEST_NAME,))
    return lambda: models.verify_model_dir(folder)


@case("models/corrupt-manifest", models.ModelIntegrityError, r"manifest\.json is not a valid manifest",
      "restore or re-export")
def _(x: Inputs):
    folder = x.model_copy()
    (folder / models.MANIFEST_NAME).write_text('{"files": ')
    return lambda: models.verify_model_dir(folder)


@case("models/missing-folder", models.ModelIntegrityError,
      r"model folder .*nowhere does not exist", "restore or re-export")
def _(x: Inputs):
    return lambda: models.verify_model_dir(x.tmp / "nowhere")


@case("models/load-altered-model", models.ModelIntegrityError, "altered file .*model.safetensors",
      "restore or re-export")
def _(x: Inputs):
    folder = x.model_copy()
    with (folder / "model.safetensors").open("r+b") as handle:  # flip one byte of the weights
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    return lambda: models.load_model_and_tokenizer(folder)


@case("models/unknown-dtype", ConfigError, "unknown dtype 'float8x'", "use e.g. 'float32', 'bfloat16'")
def _(x: Inputs):
    return lambda: models.load_model_and_tokenizer(TINY, dtype="float8x")


# --------------------------------------------------------------------------------------------------
# Serving (no server process starts: VLLMServer.start validates first)
# --------------------------------------------------------------------------------------------------
@case("serve/missing-tokenizer", deploy.DeployError,
      "missing tokenizer.json", "re-export the model with grpo_lab.deploy.export_model")
def _(x: Inputs):
    folder = x.model_copy(drop=("tokenizer.json",))
    return lambda: deploy.verify_export(folder, load_weights=False).raise_if_bad()


@case("serve/missing-weights", deploy.DeployError, r"missing weights: no \*\.safetensors file", "re-export the model")
def _(x: Inputs):
    folder = x.model_copy(drop=("model.safetensors",))
    return lambda: deploy.main([str(folder)])


@case("serve/pickle-weights-beside-safetensors", deploy.DeployError, r"pickle weights \['pytorch_model\.bin'\]",
      "serve only safetensors")
def _(x: Inputs):
    folder = x.model_copy()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    return lambda: deploy.verify_export(folder, load_weights=False).raise_if_bad()


@case("serve/pickle-only-folder", deploy.DeployError,
      r"has no \*\.safetensors weights", "Export the model with export_model")
def _(x: Inputs):
    folder = x.pickle_only_model()
    return lambda: deploy.VLLMServer(folder).start()


@case("serve/missing-model-folder", deploy.DeployError, r"model folder .*not-exported does not exist",
      "export one with export_model first")
def _(x: Inputs):
    return lambda: deploy.VLLMServer(x.tmp / "not-exported").start()


@case("serve/occupied-port", ConfigError, r"port=\d+ on 127\.0\.0\.1 is already in use", "pick another port")
def _(x: Inputs):
    port = x.busy_port()
    return lambda: deploy.VLLMServer(TINY, port=port).start()


@case("serve/utilization-above-1", memory.MemoryPlanError, r"gpu_memory_utilization=1\.3: must be in \(0, 1\]",
      r"0\.9 for a device of its own")
def _(x: Inputs):
    return lambda: deploy.VLLMServer(TINY, gpu_memory_utilization=1.3).start()


@case("serve/max-model-len-too-small", deploy.DeployError, r"max_model_len=8 is too small", "suggest_max_model_len")
def _(x: Inputs):
    return lambda: deploy.VLLMServer(TINY, max_model_len=8).start()


@case("serve/export-into-non-empty-folder", deploy.DeployError,
      "is not empty", "choose a new folder or pass overwrite=True")
def _(x: Inputs):
    x.write("export/keep.txt", "finished work")
    return lambda: deploy.export_model(TINY, x.tmp / "export")


@case("serve/export-model-without-tokenizer", deploy.DeployError, "needs the tokenizer too", r"tokenizer=tok")
def _(x: Inputs):
    return lambda: deploy.export_model(object(), x.tmp / "export")


# --------------------------------------------------------------------------------------------------
# Profiles, stacks, devices
# --------------------------------------------------------------------------------------------------
@case("profile/unknown-name", experiment.ProfileError, r"Unknown profile 'huge'", "use one of tiny, gpu, npu")
def _(x: Inputs):
    return lambda: experiment.get_profile("huge")


@case("profile/unknown-name-from-env", experiment.ProfileError, r"Unknown profile 'cpu'", "set GRPO_LAB_PROFILE")
def _(x: Inputs):
    x.monkeypatch.setenv("GRPO_LAB_PROFILE", "cpu")
    return lambda: experiment.get_profile()


@case("profile/unknown-field", experiment.ProfileError, r"Unknown profile field\(s\) \['batch_size'\]", "known:")
def _(x: Inputs):
    return lambda: experiment.get_profile("tiny", batch_size=4)


@case("stack/range-instead-of-pin", env.StackFileError, r"cpu\.txt:2: expected 'package==version', got 'torch>=2\.0'",
      "Every pin in a stack file is exact")
def _(x: Inputs):
    path = x.write("stacks/cpu.txt", "# status: verified\ntorch>=2.0\n")
    return lambda: env.parse_stack(path.read_text(), "cpu", path)


@case("stack/missing-status", env.StackFileError,
      r"missing '# status: verified\|documented' header", "add it above the pins")
def _(x: Inputs):
    path = x.write("stacks/cpu.txt", "torch==2.13.0\n")
    return lambda: env.parse_stack(path.read_text(), "cpu", path)


@case("stack/no-pins", env.StackFileError, "no 'package==version' pins found", "one exact pin per line")
def _(x: Inputs):
    path = x.write("stacks/cpu.txt", "# status: verified\n# only prose here\n")
    return lambda: env.parse_stack(path.read_text(), "cpu", path)


@case("stack/unknown-name", env.StackFileError, r"No stack named 'rocm'", r"Use STACK=cpu\|cuda\|npu")
def _(x: Inputs):
    return lambda: env.load_stack("rocm")


@case("device/unknown-kind", device.DeviceError, r"Unknown device 'tpu'", "use one of")
def _(x: Inputs):
    return lambda: device.check_kind("tpu")


# --------------------------------------------------------------------------------------------------
# The corpus test
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_engine_start(monkeypatch):
    """Any rollout engine start or server process is a failure: bad input must be refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("an engine or server was started although the input was bad")

    monkeypatch.setattr(RolloutEngine, "start", refuse)
    monkeypatch.setattr(servers.subprocess, "Popen", refuse)
    children = set(child_processes())
    yield
    assert set(child_processes()) <= children, "a child process was left running"


@pytest.fixture
def clean_env(monkeypatch):
    for name in (models.MODEL_ENV_VAR, "GRPO_LAB_PROFILE", "GRPO_LAB_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_corpus_is_large_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "two cases share an id"
    assert len(ids) >= 30
    areas = {i.split("/")[0] for i in ids}
    assert {"data", "rewards", "rollout", "train", "memory", "models", "serve", "profile", "stack", "device"} <= areas


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_harmlessly(bad: Case, tmp_path, monkeypatch, no_engine_start, clean_env):
    inputs = Inputs(tmp_path, monkeypatch)
    try:
        call = bad.build(inputs)
        before = snapshot(tmp_path, *SHIPPED)
        with pytest.raises(BaseException) as caught:
            call()
        after = snapshot(tmp_path, *SHIPPED)
    finally:
        for listener in inputs.sockets:
            listener.close()
    error, message = caught.value, str(caught.value)
    assert type(error) is bad.error, f"raised {type(error).__name__}: {message}"
    assert re.search(bad.problem, message, re.IGNORECASE | re.DOTALL), f"problem not named in: {message}"
    assert re.search(bad.fix, message, re.IGNORECASE | re.DOTALL), f"fix not named in: {message}"
    assert after == before, "an input file was changed, added or removed"


# --------------------------------------------------------------------------------------------------
# Safe defaults (issue 9, part 4)
# --------------------------------------------------------------------------------------------------
def test_server_binds_loopback_by_default_and_takes_an_api_key():
    config = deploy.ServeConfig(model=str(TINY))
    assert config.host == "127.0.0.1"
    command = config.command(8000)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert "--api-key" not in command
    keyed = deploy.ServeConfig(model=str(TINY), api_key="s3cret").command(8000)
    assert keyed[keyed.index("--api-key") + 1] == "s3cret"
    server = deploy.VLLMServer(TINY, api_key="s3cret")
    server.port = 8000  # as start() would set it; nothing is started here
    assert server.client().api_key == "s3cret"
    assert 'Authorization: Bearer $GRPO_LAB_API_KEY' in deploy.curl_command(server, [{"role": "user", "content": "hi"}])


def test_serve_cli_binds_loopback_and_reads_the_api_key_from_the_environment(monkeypatch, no_engine_start):
    seen = {}

    class Stop(Exception):
        pass

    class Recorder:
        """Stands in for VLLMServer: records the knobs `grpo-lab serve` passes, then stops before any start."""

        def __init__(self, model, **knobs):
            seen.update(knobs)

        def __enter__(self):
            raise Stop

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(deploy.cli, "VLLMServer", Recorder)
    monkeypatch.setenv("GRPO_LAB_API_KEY", "from-env")
    with pytest.raises(Stop):
        deploy.main([str(TINY)])
    assert seen["host"] == "127.0.0.1" and seen["api_key"] == "from-env"


def test_serving_beyond_loopback_without_a_key_warns(no_engine_start):
    with pytest.warns(UserWarning, match="without an api_key.*Pass api_key"):
        deploy.ServeConfig(model=str(TINY), host="0.0.0.0").validate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        deploy.ServeConfig(model=str(TINY), host="0.0.0.0", api_key="k").validate()
        deploy.ServeConfig(model=str(TINY), host="::1").validate()


@functools.cache
def _package_trees() -> tuple[tuple[Path, ast.Module], ...]:
    return tuple((path.relative_to(REPO_ROOT), ast.parse(path.read_text(encoding="utf-8")))
                 for path in sorted((REPO_ROOT / "grpo_lab").rglob("*.py")))


def _package_nodes():
    """Every syntax node of the package's source, with the file it is in."""
    for path, tree in _package_trees():
        for node in ast.walk(tree):
            yield path, node


def _calls(name: str):
    """Every call of a method named ``name`` in the package's source: (where, receiver, keywords)."""
    for path, node in _package_nodes():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
            yield f"{path}:{node.lineno}", ast.unparse(node.func.value), {k.arg: k.value for k in node.keywords}


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def test_remote_code_is_never_trusted_unless_asked():
    loads = list(_calls("from_pretrained"))
    assert loads, "expected from_pretrained calls in grpo_lab"
    for where, _, keywords in loads:
        assert "trust_remote_code" in keywords, f"{where} leaves trust_remote_code to the library default"
    trusting = [f"{path}:{node.value.lineno}" for path, node in _package_nodes()
                if isinstance(node, ast.keyword) and node.arg == "trust_remote_code" and _is_true(node.value)]
    assert not trusting, f"remote code trusted at {trusting}"
    assert inspect.signature(models.load_model_and_tokenizer).parameters["trust_remote_code"].default is False
    config = RolloutConfig(max_model_len=128).resolve("cpu", model_path=str(TINY))
    assert engine_arguments(config, str(TINY))["trust_remote_code"] is False
    assert "--trust-remote-code" not in deploy.ServeConfig(model=str(TINY)).command(8000)


def test_trainer_config_does_not_trust_remote_code():
    from trl import GRPOConfig

    assert GRPOConfig.__dataclass_fields__["trust_remote_code"].default is False


def test_weights_come_only_from_safetensors():
    config = RolloutConfig(max_model_len=128).resolve("cpu", model_path=str(TINY))
    assert engine_arguments(config, str(TINY))["load_format"] == "safetensors"  # vLLM's "auto" falls back to *.bin
    dummy = RolloutConfig(max_model_len=128, load_format="dummy").resolve("cpu", model_path=str(TINY))
    assert engine_arguments(dummy, str(TINY))["load_format"] == "dummy"
    command = deploy.ServeConfig(model=str(TINY)).command(8000)
    assert command[command.index("--load-format") + 1] == "safetensors"
    model_loads = [(where, keywords) for where, receiver, keywords in _calls("from_pretrained")
                   if receiver.startswith("AutoModel")]
    assert model_loads, "expected AutoModel*.from_pretrained calls in grpo_lab"
    for where, keywords in model_loads:
        assert _is_true(keywords.get("use_safetensors")), f"{where} may load pickle weights"


def test_vllm_has_the_safetensors_only_load_format():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here")
    loader = Path(spec.submodule_search_locations[0]) / "model_executor" / "model_loader" / "default_loader.py"
    source = loader.read_text(encoding="utf-8")
    assert 'load_format == "safetensors"' in source and 'allow_patterns = ["*.safetensors"]' in source


@pytest.mark.parametrize("load", ["models", "rollout", "serve"])
def test_pickle_weights_are_never_unpickled(load, tmp_path, monkeypatch, no_engine_start, clean_env):
    folder = Inputs(tmp_path, monkeypatch).pickle_only_model()
    expected = {"models": FileNotFoundError, "rollout": FileNotFoundError, "serve": deploy.DeployError}[load]
    with pytest.raises(expected, match=r"safetensors"):
        if load == "models":
            models.load_model_and_tokenizer(folder)
        elif load == "rollout":
            open_engine(str(folder), backend="hf")
        else:
            deploy.VLLMServer(folder).start()
    assert not (folder / "CANARY").exists(), "the pickle was loaded"
    with pytest.raises(OSError):  # and transformers alone refuses it too, with use_safetensors=True
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    assert not (folder / "CANARY").exists()


def test_the_canary_fires_when_unpickled(tmp_path):
    """The canary really creates its file when unpickled, so its absence above means something."""
    pickle.loads(pickle.dumps(Canary(tmp_path / "CANARY")))
    assert (tmp_path / "CANARY").exists()
