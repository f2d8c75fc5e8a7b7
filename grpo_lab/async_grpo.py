"""Asynchronous GRPO with TRL's ``AsyncGRPOTrainer``: a worker streams completions from a vLLM server into a queue
while the trainer trains on what is queued and pushes its weights every ``weight_sync_steps`` steps, so a step costs
about the longer of generate and update, not their sum. The price is **staleness**: a completion may come from an
older policy than the one it trains. The experiment is a :class:`~grpo_lab.experiment.TrainConfig`, the knobs an
:class:`AsyncConfig`, the server and devices :mod:`grpo_lab.scale`'s; the run folder adds ``trained_samples.jsonl``.

**The staleness promise.** Version 1 is the policy before the first update; every weight sync adds one; a group is
tagged with the version live when its first request went out. *Every completion trained on lags the trainer's version
by at most* ``max_staleness``. TRL checks the lag when a sample leaves the queue, but the dataloader takes one
micro-batch ahead of the step's weight sync, so :class:`~grpo_lab.upstream.async_trainer.StalenessGate` checks against
the version of the step that *will* train it (``staleness/*`` in ``metrics.jsonl``). Because of that look-ahead,
``max_staleness=1`` serialises generation and update again; 2 (the default) is the smallest that overlaps.

The loss is PPO's clipped ratio against the server's log-probabilities (no importance-sampling correction). Weights
go by TRL's NCCL transfer on CUDA, elsewhere by :class:`~grpo_lab.upstream.trl.FileWeightTransfer`.

    >>> from grpo_lab.async_grpo import AsyncConfig, run_async
    >>> from grpo_lab.experiment import TrainConfig
    >>> result = run_async(AsyncConfig(max_staleness=2), train_config=TrainConfig(
    ...     profile="tiny", max_steps=4, per_device_train_batch_size=8, num_generations=4))   # doctest: +SKIP
    >>> max(result.lag_counts) <= 2                                                          # doctest: +SKIP
    True

From a shell: ``grpo-lab async-grpo --max-staleness 2 --max-steps 4`` (``grpo-lab scale`` and ``train`` options too).
"""

from __future__ import annotations

__all__ = [
    "AsyncConfig", "check_experiment", "completion_accounting", "completions_per_step", "describe_accounting",
    "run_async", "step_timeline", "tradeoff_entry",
]

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_lab import experiment, scale, train
from grpo_lab.data import to_dataset
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.rewards import RewardSet, WeightedReward, prepare, reward_name
from grpo_lab.rollout import load_tokenizer
from grpo_lab.scale.cli import run_command
from grpo_lab.scale.runner import serve_and_train, train_against
from grpo_lab.upstream.trl import FileWeightTransfer

RESULT_FILE = "async_grpo.json"
SAMPLES_FILE = "trained_samples.jsonl"
"""One line per trained completion: step, group, its version tag, the version it trained at, the lag, a digest."""
DEFAULT_MAX_STALENESS = 2
TRL_SCORE_QUEUE_GROUPS = 16
"""Whole groups TRL's rollout worker holds between generation and the queue (its ``score_queue_maxsize``)."""


@dataclass(frozen=True)
class AsyncConfig:
    """The asynchronous pipeline under ``AsyncGRPOConfig``'s names, checked when made."""

    max_staleness: int = DEFAULT_MAX_STALENESS
    """Most policy versions a trained completion may lag the trainer's: at least 1; 2 overlaps generation and update
    (see the module docstring), TRL's own default is 4."""
    max_inflight_tasks: int = -1
    """Completion requests in flight at once; -1: TRL's rule, ``max(max_staleness, 1) ×`` completions per step."""
    weight_sync_steps: int = 1
    """Push the trainer's weights to the server (a new policy version) every this many optimizer steps."""
    queue_maxsize: int | None = None
    """Scored completions queued before the worker waits; None: ``(max_staleness + 1) ×`` completions per step (TRL's
    default of 1024 lets a fast server fill the queue with completions that go stale)."""

    def __post_init__(self) -> None:
        for name in ("max_staleness", "max_inflight_tasks", "weight_sync_steps", "queue_maxsize"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name}={value!r} must be an integer.")
        if self.max_staleness < 1:
            raise ConfigError(f"max_staleness={self.max_staleness}: must be at least 1. The dataloader takes one "
                              f"micro-batch ahead of the step's weight sync, so a lag of 0 cannot be met and training "
                              f"would stall. Use 1 (generation waits for each new policy) or 2 (it overlaps the "
                              f"update).")
        if self.max_inflight_tasks != -1 and self.max_inflight_tasks < 1:
            raise ConfigError(f"max_inflight_tasks={self.max_inflight_tasks}: give a positive number of concurrent "
                              f"requests, or -1 for TRL's rule (max(max_staleness, 1) x completions per step).")
        if self.weight_sync_steps < 1:
            raise ConfigError(f"weight_sync_steps={self.weight_sync_steps}: must be at least 1 (1 = push the weights "
                              f"after every optimizer step).")
        if self.queue_maxsize is not None and self.queue_maxsize < 1:
            raise ConfigError(f"queue_maxsize={self.queue_maxsize}: must be at least 1, or None for "
                              f"(max_staleness + 1) x completions per step.")

    def resolved(self, completions_per_step: int) -> AsyncConfig:
        """A copy with ``queue_maxsize`` and ``max_inflight_tasks`` filled in for ``completions_per_step``."""
        return dataclasses.replace(
            self, queue_maxsize=self.queue_maxsize or (self.max_staleness + 1) * completions_per_step,
            max_inflight_tasks=(self.max_inflight_tasks if self.max_inflight_tasks > 0
                                else max(self.max_staleness, 1) * completions_per_step))


SUPPORTED_ONLY = {
    "beta": ((0.0,), "AsyncGRPOTrainer has no reference model and no KL term; set beta=0"),
    "loss_type": (("dapo",), "AsyncGRPOTrainer's loss is the token mean over each micro-batch (DAPO-style); set "
                             "loss_type='dapo'"),
    "scale_rewards": (("group",), "AsyncGRPOTrainer divides advantages by the group's standard deviation; set "
                                  "scale_rewards='group'"),
    "resume_from_checkpoint": ((None, False), "resuming an asynchronous run is not supported by grpo_lab.async_grpo "
                                              "yet; start a fresh run"),
    "use_peft": ((False,), "grpo_lab.async_grpo does not pass a LoRA config to AsyncGRPOTrainer (every weight would "
                           "train); train LoRA with grpo_lab.train"),
    "vllm_enable_sleep_mode": ((False,), "the rollout server of the asynchronous layout runs on its own device and "
                                         "does not sleep; set vllm_enable_sleep_mode=False"),
}
"""TrainConfig fields ``AsyncGRPOTrainer`` cannot honour as described: the values it can run, and why."""


def check_experiment(config: TrainConfig) -> None:
    """Raise :class:`ConfigError` naming every setting ``AsyncGRPOTrainer`` cannot run as described."""
    problems = [f"{name}={getattr(config, name)!r}: {why}" for name, (allowed, why) in SUPPORTED_ONLY.items()
                if getattr(config, name) not in allowed]
    if problems:
        raise ConfigError("this experiment cannot run asynchronously as described:\n  " + "\n  ".join(problems))


def completions_per_step(config: TrainConfig, num_processes: int = 1) -> int:
    """Completions one optimizer step trains (what the synchronous trainer generates per step)."""
    return config.generation_batch_size * num_processes


def fold_reward_weights(reward_set: RewardSet) -> list[Callable]:
    """The rewards, weights folded in (a picklable ``WeightedReward``): ``AsyncGRPOTrainer`` sums them unweighted."""
    return [fn if weight == 1.0 else WeightedReward([fn], [weight], name=reward_name(fn))
            for fn, weight in zip(reward_set.funcs, reward_set.weights)]


def with_response_template(tokenizer: Any) -> Any:
    """Give ``tokenizer`` the response template TRL's rollout worker parses completions with (``add_response_schema``
    knows Qwen, Llama, Gemma …; plain ChatML, as the tiny model and SmolLM2 use, gets the Qwen 3 parser)."""
    from trl.chat_template_utils import add_response_schema, qwen3_template

    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return tokenizer
    try:
        return add_response_schema(tokenizer)
    except ValueError:
        template = tokenizer.chat_template or ""
        if "<|im_start|>" in template and "<|im_end|>" in template:
            tokenizer.response_template = qwen3_template
            return tokenizer
        raise ConfigError(f"{tokenizer.name_or_path}: TRL's AsyncGRPOTrainer parses completions with a response "
                          f"template, and neither TRL nor grpo_lab knows this chat template. Set "
                          f"tokenizer.response_template (transformers' chat response parsing) and pass the "
                          f"tokenizer in.") from None


class StepEndClock(TrainerCallback):
    """Wall time between step ends (the first from train begin), the wait for completions included."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds.append(now - self._last)
        self._last = now


def async_grpo_args(config: TrainConfig, knobs: AsyncConfig, base_url: str):
    """TRL's ``AsyncGRPOConfig``: the ``GRPOConfig`` fields of :meth:`grpo_lab.experiment.Plan.trl_kwargs`,
    micro-batches of ``per_device_train_batch_size`` completions (``token_budget=0``), fp32 weights, Liger off."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    own = {item.name for item in dataclasses.fields(AsyncGRPOConfig)} - {"use_liger_kernel", "vllm_server_base_url"}
    kwargs = experiment.plan(config, Machine.detect()).trl_kwargs(use_vllm=True)
    return AsyncGRPOConfig(
        **{name: value for name, value in kwargs.items() if name in own}, dtype="float32", token_budget=0,
        vllm_server_base_url=base_url, max_staleness=knobs.max_staleness, max_inflight_tasks=knobs.max_inflight_tasks,
        weight_sync_steps=knobs.weight_sync_steps, queue_maxsize=knobs.queue_maxsize)


def build_trainer(config: TrainConfig, knobs: AsyncConfig, base_url: str, sync_dir: str | None = None,
                  callbacks: Sequence[Any] = (), reward_funcs: Sequence[Callable] | None = None):
    """A checked ``AsyncGRPOTrainer`` (our subclass) against the server at ``base_url``; ``sync_dir``: weights go
    through files there, else TRL's NCCL transfer. Build and train inside ``trl_workarounds``."""
    from grpo_lab.upstream.async_trainer import GrpoLabAsyncTrainer  # imports TRL's experimental trainer

    check_experiment(config)
    reward_set = prepare(list(reward_funcs or config.rewards), config.reward_weights, config.reward_errors)
    rows = experiment.load_train_rows(config)
    train.check_dataset(rows, reward_set.funcs, source=config.dataset or "data/train.jsonl")
    tokenizer = with_response_template(load_tokenizer(config.model))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    experiment.check_prompt_lengths(rows, tokenizer, config.max_prompt_length)
    columns = sorted({key for row in rows for key in row} & {"prompt", "answer", "unit", "type", "lang"})
    # the worker walks the rows in order (TRL's synchronous sampler shuffles): shuffle once, with the run's seed
    dataset = to_dataset([{key: row.get(key) for key in columns} for row in rows]).shuffle(seed=config.seed)
    transfer = FileWeightTransfer(base_url, sync_dir, server_timeout=config.vllm_server_timeout) if sync_dir else None
    return GrpoLabAsyncTrainer(model=config.model, reward_funcs=fold_reward_weights(reward_set),
                               args=async_grpo_args(config, knobs, base_url), train_dataset=dataset,
                               processing_class=tokenizer, callbacks=list(callbacks), weight_transfer=transfer,
                               samples_file=Path(config.output_dir) / SAMPLES_FILE)


def run_trainer(spec_path: str | Path) -> int:
    """The ``accelerate launch`` entry: train against the server named in the spec; write the run and the outcome."""
    from grpo_lab.upstream.async_trainer import trl_workarounds  # imports TRL's experimental trainer: only to train

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    config = TrainConfig.from_dict(spec["train_config"])
    knobs = AsyncConfig(**spec["async_config"])
    run_dir = Path(config.output_dir)
    clock = StepEndClock()
    callbacks = [train.MetricsLogger(run_dir, live_plot=False), clock]
    callbacks += [train.TimeBudget(config.max_minutes)] if config.max_minutes else []
    with trl_workarounds(config.device) as workarounds:
        trainer = build_trainer(config, knobs, spec["base_url"], spec["sync_dir"], callbacks)
        main_process = trainer.accelerator.is_main_process
        knobs = dataclasses.replace(knobs, max_inflight_tasks=trainer.args.max_inflight_tasks)  # as TRL resolved it
        if main_process:
            train.write_run_record(run_dir, config,
                                   backend=f"AsyncGRPOTrainer against the vLLM server at {spec['base_url']}",
                                   async_config=dataclasses.asdict(knobs), trl_workarounds=workarounds,
                                   weight_transfer="file (grpo_lab.upstream.trl.FileWeightTransfer)"
                                   if spec["sync_dir"] else "nccl (TRL's WeightTransferClient)")
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    final_dir = train.save_final_model(trainer, config, run_dir, "GRPO-trained asynchronously by grpo_lab.async_grpo")
    if main_process:
        outcome = {"global_step": trainer.state.global_step, "seconds": seconds, "step_seconds": clock.seconds,
                   "final_model_dir": str(final_dir), "async_config": dataclasses.asdict(knobs),
                   "policy_version": trainer.model_version,
                   "lag_counts": {str(k): v for k, v in sorted(trainer.lag_counts.items())},
                   "dropped_stale": trainer.gate.dropped, "trl_workarounds": workarounds}
        Path(spec["result_path"]).write_text(json.dumps(outcome, indent=2) + "\n", encoding="utf-8")
    return 0


@dataclass
class AsyncResult(scale.ServerModeResult):
    """A finished asynchronous run: the server-mode facts plus the pipeline's."""

    async_config: AsyncConfig
    """The knobs as the run used them (resolved)."""
    completions_per_step: int
    lag_counts: dict[int, int]
    """Trained completions by policy-version lag (trainer's version at the step minus the completion's tag)."""
    dropped_stale: int
    """Completions the gate dropped because they would have trained too stale."""
    policy_version: int
    """The trainer's policy version at the end (1 + weight syncs after the first)."""
    trl_workarounds: dict[str, str]

    def completions_per_second(self, skip: int = 1) -> float:
        """Completions trained per second of wall time, from the median step after ``skip`` warm-up steps."""
        return self.completions_per_step / self.median_step_seconds(skip)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "completions_per_second": self.completions_per_second()}

    def summary(self) -> str:
        lags = ", ".join(f"{lag}: {count}" for lag, count in sorted(self.lag_counts.items()))
        return (f", {self.completions_per_second():.1f} completions trained per second (server start "
                f"{self.server_start_seconds:.0f} s); trained completions by policy lag {{{lags}}}, "
                f"{self.dropped_stale} dropped as too stale")


def completion_accounting(result: AsyncResult, num_generations: int) -> dict[str, int]:
    """Where the server's completions went: ``generated`` = ``trained`` + ``dropped`` (too stale) + ``left`` (in the
    pipeline at the end); ``queue``, ``scoring`` and ``inflight``: the most each stage holds."""
    generated = round(result.server_stats.get("requests", 0))
    trained = result.global_step * result.completions_per_step
    return {"generated": generated, "trained": trained, "dropped": result.dropped_stale,
            "left": generated - trained - result.dropped_stale,
            "queue": int(result.async_config.queue_maxsize or 0), "scoring": TRL_SCORE_QUEUE_GROUPS * num_generations,
            "inflight": int(result.async_config.max_inflight_tasks)}


def describe_accounting(counts: dict[str, int]) -> str:
    """:func:`completion_accounting` as sentences: the sum, and where the untrained rest can be."""
    c = counts
    return (f"the server generated {c['generated']} completions = {c['trained']} trained + {c['dropped']} dropped as "
            f"too stale + {c['left']} not yet trained when training stopped. The worker runs ahead of the trainer by "
            f"design: those were in the queue (at most {c['queue']}, queue_maxsize), in TRL's scoring queue (at most "
            f"{c['scoring']}: {TRL_SCORE_QUEUE_GROUPS} whole groups), in flight (at most {c['inflight']}, "
            f"max_inflight_tasks), or in groups still waiting for their last completion (a group is scored only when "
            f"it is whole).")


def async_train_config(train_config: TrainConfig, machine: Any = None) -> TrainConfig:
    """:func:`grpo_lab.scale.server_train_config`, checked for what ``AsyncGRPOTrainer`` supports."""
    config = scale.server_train_config(train_config, machine)
    check_experiment(config)
    return config


def train_async(server: scale.RolloutServer, config: scale.ServerModeConfig, train_config: TrainConfig,
                knobs: AsyncConfig | None = None, base_url: str | None = None) -> AsyncResult:
    """Train a resolved ``train_config`` asynchronously against a running ``server`` (``base_url``: e.g. a proxy)."""
    check_experiment(train_config)
    if not train_config.is_resolved or train_config.output_dir is None:
        raise ConfigError("train_config must be resolved with a run folder: use async_train_config(train_config).")
    per_step = completions_per_step(train_config, server.plan.num_train_processes)
    knobs = (knobs or AsyncConfig()).resolved(per_step)
    trainer, fields = train_against(server, config, train_config, "grpo_lab.async_grpo", base_url,
                                    {"async_config": dataclasses.asdict(knobs)})
    outcome = trainer.outcome
    return AsyncResult(
        **fields, async_config=AsyncConfig(**outcome["async_config"]), completions_per_step=per_step,
        lag_counts={int(k): v for k, v in outcome["lag_counts"].items()}, dropped_stale=outcome["dropped_stale"],
        policy_version=outcome["policy_version"], trl_workarounds=outcome["trl_workarounds"]).save(RESULT_FILE)


def run_async(knobs: AsyncConfig | None = None, config: scale.ServerModeConfig | None = None,
              train_config: TrainConfig | None = None) -> AsyncResult:
    """Asynchronous GRPO end to end (:func:`grpo_lab.scale.runner.serve_and_train`); errors name the log file."""
    knobs = knobs or AsyncConfig()
    return serve_and_train(
        config, train_config, async_train_config, lambda *args: train_async(*args, knobs), "Asynchronous GRPO",
        "the staleness records are kept by one training process", f"; max_staleness={knobs.max_staleness}")


@dataclass(frozen=True)
class Span:
    """One bar of a step timeline: ``seconds`` of ``label`` on ``lane`` (rollout server or trainer) of ``panel``."""

    panel: str
    lane: str
    label: str
    start: float
    seconds: float


ROLLOUT, TRAINER = "rollout server", "trainer"


def step_timeline(sync_records: Sequence[dict], async_records: Sequence[dict], steps: int = 3, skip: int = 1,
                  names: tuple[str, str] = ("synchronous (TRL server mode)", "asynchronous (AsyncGRPOTrainer)")
                  ) -> list[Span]:
    """``steps`` steps after ``skip`` warm-up steps of a synchronous and an asynchronous run (their ``metrics.jsonl``)
    as :class:`Span` bars for :func:`grpo_lab.plots.plot_timeline`: measured parts, in the loop's order."""
    spans: list[Span] = []
    start = 0.0
    for r in [r for r in sync_records if r["step"] > skip and "step_time" in r][:steps]:
        generate = r["timing/generation_s"]
        rest = r["step_time"] - generate
        spans += [Span(names[0], f"step {r['step']}", "step", start, 0.0),
                  Span(names[0], ROLLOUT, "generate (weights pushed meanwhile)", start, generate),
                  Span(names[0], ROLLOUT, "idle", start + generate, rest),
                  Span(names[0], TRAINER, "wait for completions", start, generate),
                  Span(names[0], TRAINER, "update", start + generate, rest)]
        start += r["step_time"]
    start = 0.0
    for r in [r for r in async_records if r["step"] > skip and "perf/step_s" in r][:steps]:
        step = r["perf/step_s"]
        wait, sync = r.get("perf/rollout_wait_s", 0.0), r.get("perf/weight_sync_s", 0.0)
        update = r.get("perf/fwd_bwd_s", 0.0) + r.get("perf/optimizer_s", 0.0)
        other = max(0.0, step - wait - update - sync)
        full = min(r.get("rollout/backpressure_s", 0.0), step - sync)
        spans += [Span(names[1], f"step {r['step']}", "step", start, 0.0),
                  Span(names[1], ROLLOUT, "generate", start, step - sync - full),
                  Span(names[1], ROLLOUT, "queue full: generation waits", start + step - sync - full, full),
                  Span(names[1], ROLLOUT, "paused for the weight sync", start + step - sync, sync)]
        t = start
        for label, seconds in (("wait for completions", wait), ("update", update),
                               ("rewards, batching, logging", other), ("weight sync", sync)):
            spans.append(Span(names[1], TRAINER, label, t, seconds))
            t += seconds
        start += step
    return [s for s in spans if s.seconds > 0 or s.label == "step"]


def tradeoff_entry(records: Sequence[dict], completions_per_step: int, completions_per_second: float,
                   lag_counts: dict | None = None) -> dict[str, Any]:
    """One run for :func:`grpo_lab.plots.plot_async_tradeoff`: throughput, reward against completions trained."""
    steps = [r for r in records if "reward" in r]
    return {"completions_per_second": completions_per_second, "reward": [r["reward"] for r in steps],
            "completions": [r["step"] * completions_per_step for r in steps], "lag_counts": lag_counts or {}}


def build_parser():
    parser = scale.build_parser(
        prog="grpo-lab async-grpo", plans=False,
        description="Asynchronous GRPO with TRL's AsyncGRPOTrainer: a vLLM server keeps generating on the rollout "
                    "device(s) while the trainer updates on the others. Every `grpo-lab scale` layout option and "
                    "every `grpo-lab train` option is accepted too.")
    defaults = AsyncConfig()
    parser.add_argument("--max-staleness", type=int, default=defaults.max_staleness,
                        help="policy versions a trained completion may lag (default: %(default)s)")
    parser.add_argument("--max-inflight-tasks", type=int, default=defaults.max_inflight_tasks,
                        help="concurrent completion requests (-1: TRL's rule)")
    parser.add_argument("--weight-sync-steps", type=int, default=defaults.weight_sync_steps,
                        help="push weights every N optimizer steps (default: %(default)s)")
    parser.add_argument("--queue-maxsize", type=int, default=None,
                        help="completions queued before generation waits (default: (max_staleness + 1) x per step)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab async-grpo [--max-staleness 2] [grpo-lab scale / train options]``."""
    def run(args: Any, config: scale.ServerModeConfig, train_config: TrainConfig) -> AsyncResult:
        knobs = AsyncConfig(**{item.name: getattr(args, item.name) for item in dataclasses.fields(AsyncConfig)})
        return run_async(knobs, config, train_config)

    return run_command(argv, build_parser(), run_trainer, run, RESULT_FILE,
                       (GrpoLabError, ValueError, FileNotFoundError, FileExistsError))


if __name__ == "__main__":
    raise SystemExit(main())
