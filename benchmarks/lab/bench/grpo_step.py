"""The GRPO step benchmark: TRL's ``GRPOTrainer`` with HF generate and with vLLM colocate on the same workload, the
backends interleaved step by step, each step split into generation, reward and update.

**How the backends interleave.** Both trainers are built once and stay alive; each runs ``trainer.train()`` in its own
thread, and a baton (:class:`Turns`) lets exactly one of them run one whole optimizer step at a time, in the order of
:func:`interleaved_turns`: every backend's warm-up steps first, then hf, vllm, hf, vllm, ... The vLLM trainer runs in
the main thread, where its engine was built (CUDA streams and graphs are per thread). The device's memory cache stays
as a step leaves it, as it does between the steps of one run (emptied at every hand-over, every step asked the driver
for its memory again, ~300 times on the H200, which no single run does). Rebuilding a trainer per step would time
start-up, not steps; running the backends one after the other would put any drift of the machine between them into
the ratio. This design runs on the CPU tiny model and on one GPU
when both trainers fit beside vLLM's share (``vllm_gpu_memory_utilization``, which ``--train-option`` can lower).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_lab import device, memory
from grpo_lab.data import write_jsonl
from grpo_lab.device import Machine
from grpo_lab.experiment import DEFAULT_FOR_DEVICE, TrainConfig, plan
from grpo_lab.rollout import encode_prompts, load_tokenizer
from grpo_lab.rollout.vllm_backend import shutdown_engine
from grpo_lab.train import MetricsLogger, StepClock, build_trainer
from lab.bench.profiles import GRPO_WORKLOADS, BenchError, BenchProfile, check_choice
from lab.bench.stats import Spread, median, speedup_range
from lab.bench.workload import ragged_model_dir

OWN_LENGTHS = "the model's own lengths"
"""The GRPO step's workload with real weights: neither fixed nor drawn, whatever the model samples."""


STEP_SPLIT = ("generation_s", "vllm_generate_s", "weight_sync_s", "generation_other_s", "reward_s", "update_s",
              "old_ref_logps_s", "backward_optimizer_s")
"""The parts of a GRPO step the trainer times (grpo_lab.train.MetricsLogger's ``timing/*``)."""


def grpo_step_config(profile: BenchProfile, model: str, dataset: str | Path, max_prompt_length: int, kind: str,
                     **train_overrides) -> TrainConfig:
    """The experiment a bench step runs: the profile's step shape on ``dataset`` (every row, no type filter), the
    device's profile for the rest of the recipe, no checkpoints (server mode in ``benchmarks/scale_out`` runs the
    same one)."""
    return dataclasses.replace(
        profile.step, profile=DEFAULT_FOR_DEVICE[kind], model=model, dataset=str(dataset), train_types=(),
        train_languages=(),
        max_prompt_length=max_prompt_length, max_steps=profile.grpo_warmup_steps + profile.grpo_steps,
        save_steps=10**9, save_total_limit=None, live_plot=False, logging_steps=1, **train_overrides)


def step_memory(profile: BenchProfile, shape: str, device_memory_gib: float,
                vllm_gpu_memory_utilization: float) -> memory.MemoryBudget:
    """The memory planner's budget of one trainer of the bench's GRPO step on a GPU of ``device_memory_gib``: the
    profile's step on the ``shape`` (a :func:`grpo_lab.memory.course_configs` name) in bf16, without gradient
    checkpointing, with the accelerator profile's reference model, colocated vLLM at ``vllm_gpu_memory_utilization``.
    The bench keeps the other backend's trainer (weights, optimizer state, reference model) beside it."""
    machine = Machine("cuda", bf16=True, memory_gib=device_memory_gib)
    config = dataclasses.replace(grpo_step_config(profile, shape, "", profile.prompt_tokens, machine.kind),
                                 gradient_checkpointing=False).with_profile(machine)
    return memory.plan_memory(memory.course_configs()[shape], precision="mixed", shape=config.training_shape(),
                              device_memory_gib=device_memory_gib, device_kind=machine.kind,
                              vllm_gpu_memory_utilization=vllm_gpu_memory_utilization)


def interleaved_turns(backends: Sequence[str], warmup: int, steps: int) -> list[str]:
    """Whose step comes when: each backend's ``warmup`` steps, then ``steps`` rounds of one step per backend.

    >>> interleaved_turns(("hf", "vllm"), 1, 2)
    ['hf', 'vllm', 'hf', 'vllm', 'hf', 'vllm']
    """
    return [b for b in backends for _ in range(warmup)] + [b for _ in range(steps) for b in backends]


class Turns:
    """A baton for trainers in threads: a trainer's step begins only on its turn, and the next turn starts when the
    step (or, after its last step, the trainer) ends. ``log`` records every (backend, "begin"/"end") as it happens.

    One process, one device: accelerate's gradient state is shared by the trainers, and each sets it again within its
    own step before it matters (the optimizer step at the last micro-batch), so whole-step turns keep it consistent."""

    def __init__(self, order: Sequence[str]):
        self.order, self.position = list(order), 0
        self.log: list[tuple[str, str]] = []
        self.failed = False
        self._condition = threading.Condition()

    def callbacks(self, name: str) -> tuple[TrainerCallback, TrainerCallback]:
        """The two callbacks of one trainer: put the first before its step clock and the second after it."""
        turns = self

        class Gate(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                turns.wait(name)

        class Release(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step < state.max_steps:
                    turns.done(name)

            def on_train_end(self, args, state, control, **kwargs):
                turns.done(name)

        return Gate(), Release()

    def wait(self, name: str) -> None:
        with self._condition:
            while not self.failed and self.position < len(self.order) and self.order[self.position] != name:
                self._condition.wait()
            if self.failed or self.position >= len(self.order):
                raise BenchError(f"{name}: no turn left ({'another backend failed' if self.failed else 'extra step'})")
            self.log.append((name, "begin"))

    def done(self, name: str) -> None:
        with self._condition:
            self.log.append((name, "end"))
            self.position += 1
            self._condition.notify_all()

    def fail(self) -> None:
        with self._condition:
            self.failed = True
            self._condition.notify_all()

    def run(self, trainers: dict[str, Any], main: str) -> None:
        """``trainer.train()`` for each, ``main``'s in this thread and the others in their own; re-raise the first
        failure once every thread has stopped."""
        errors: list[BaseException] = []

        def train(name: str) -> None:
            try:
                trainers[name].train()
            except BaseException as error:  # handed to the caller's thread below
                errors.append(error)
                self.fail()

        threads = [threading.Thread(target=train, args=(name,), name=f"bench-{name}", daemon=True)
                   for name in trainers if name != main]
        for thread in threads:
            thread.start()
        train(main)
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]


class HostCounters(TrainerCallback):
    """What the host did during each of one trainer's steps, beside the device's work: Python's garbage-collection
    pauses (``gc_pause_s``), the process's CPU seconds over all its threads (``host_cpu_s``: the trainer, vLLM's
    in-process engine, and anything another trainer left running) and the allocator's requests to the driver
    (``driver_allocations``: memory the step needed beyond what the cache held). Put it inside the step clock's
    window (after the gate, before the release)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.steps: dict[str, list[float]] = {"gc_pause_s": [], "host_cpu_s": [], "driver_allocations": []}
        self._active, self._pause, self._gc_start = False, 0.0, 0.0
        self._start: tuple[float, int] = (0.0, 0)

    def _collecting(self, phase: str, info: dict) -> None:
        if not self._active:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._pause += time.perf_counter() - self._gc_start

    def on_train_begin(self, args, state, control, **kwargs):
        gc.callbacks.append(self._collecting)

    def on_step_begin(self, args, state, control, **kwargs):
        self._pause, self._active = 0.0, True
        self._start = (time.process_time(), device.driver_allocations(kind=self.kind))

    def on_step_end(self, args, state, control, **kwargs):
        self._active = False
        self.steps["gc_pause_s"].append(self._pause)
        self.steps["host_cpu_s"].append(time.process_time() - self._start[0])
        self.steps["driver_allocations"].append(device.driver_allocations(kind=self.kind) - self._start[1])

    def on_train_end(self, args, state, control, **kwargs):
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._collecting)


def grpo_step_bench(model: str, rows: Sequence[dict], profile: BenchProfile, backends: Sequence[str] | None = None,
                    workdir: str | Path | None = None, workload: str = "fixed", stop_ids: bool = True,
                    **train_overrides) -> dict[str, Any]:
    """Run ``grpo_warmup_steps + grpo_steps`` GRPO steps per backend (``"hf"`` generate, ``"vllm"`` colocate)
    with :func:`grpo_lab.train.build_trainer`, interleaved (the module's docstring says how); report each backend's
    steps, their min / median / max and split, and the step ratio's range (:func:`~lab.bench.stats.speedup_range`).

    Each step samples ``n`` completions for all ``num_prompts`` prompts at once (TRL's generation batch) and
    accumulates gradients over micro-batches of ``per_device_train_batch_size``. ``update`` is the step minus
    generation and rewards: log-probabilities (policy and reference), loss, backward and the optimizer step; the trainer
    splits both further (:data:`STEP_SPLIT`). ``workload="ragged"`` ends completions early: with random weights
    (``stop_ids``) through :func:`~lab.bench.workload.ragged_model_dir`, with a real model at its own end token.
    ``train_overrides`` go to :class:`grpo_lab.train.TrainConfig` (e.g. ``beta=0.0``).
    """
    backends = tuple(dict.fromkeys(backends or profile.grpo_backends))
    check_choice("grpo backends", backends, ("hf", "vllm"))
    check_choice("grpo workload", [workload], GRPO_WORKLOADS)
    machine = Machine.detect()
    kind = machine.kind
    longest = max(len(p.token_ids) for p in encode_prompts(load_tokenizer(model), [r["prompt"] for r in rows]))
    if not stop_ids:  # real weights: the bench sets no lengths, so "fixed" and "ragged" are the same workload
        workload, lengths = OWN_LENGTHS, ("each completion ends where the model samples its end token, or at "
                                          "max_completion_length: the lengths are the model's, not set by the bench")
    else:
        lengths = "every completion exactly max_completion_length tokens (random weights never sample the end token)"
    order = interleaved_turns(backends, profile.grpo_warmup_steps, profile.grpo_steps)
    out: dict[str, Any] = {"backends": {}, "steps_timed": profile.grpo_steps, "workload": workload,
                           "warmup_steps": profile.grpo_warmup_steps, "completions_per_step": profile.sequences,
                           "interleaved": len(backends) > 1, "order": order,
                           "method": (f"both trainers alive, {profile.grpo_warmup_steps} warm-up step(s) per backend "
                                      f"thrown away, then {profile.grpo_steps} timed steps per backend, alternating "
                                      "one whole step at a time; min / median / max per backend"
                                      if len(backends) > 1 else f"{profile.grpo_warmup_steps} warm-up step(s) thrown "
                                      f"away, then {profile.grpo_steps} timed steps; min / median / max")}
    with _scratch(workdir) as scratch:
        if workload == "ragged" and stop_ids:
            model, out["ragged"] = ragged_model_dir(model, Path(scratch) / "ragged-model")
            lengths = out["ragged"]["lengths"]
        out["lengths"] = lengths
        dataset = Path(scratch) / "seed_workload.jsonl"
        write_jsonl(rows, dataset)
        step = grpo_step_config(profile, model, dataset, longest, kind, **train_overrides)
        turns = Turns(order)
        trainers, clocks, loggers, configs, hosts = {}, {}, {}, {}, {}
        try:
            for backend in sorted(backends, key=lambda b: b == "vllm"):  # vLLM's engine sizes itself last
                planned = plan(dataclasses.replace(step, output_dir=str(Path(scratch) / f"run-{backend}"),
                                                   use_vllm=backend == "vllm"), machine)
                configs[backend] = planned.config
                loggers[backend] = MetricsLogger(Path(configs[backend].output_dir), live_plot=False)
                clocks[backend] = StepClock(kind, keep_checkpoints=False)
                hosts[backend] = HostCounters(kind)
                gate, release = turns.callbacks(backend)
                trainers[backend] = build_trainer(planned, callbacks=[
                    gate, loggers[backend], clocks[backend], hosts[backend], release])
            turns.run(trainers, main="vllm" if "vllm" in trainers else backends[0])
        finally:
            for trainer in trainers.values():
                _release_trainer(trainer, kind)
        for backend in backends:
            out["backends"][backend] = _step_summary(clocks[backend].seconds, loggers[backend].records, profile,
                                                     trainers[backend].backend_reason, hosts[backend].steps)
            out["backends"][backend]["settings"] = {key: getattr(configs[backend], key) for key in (
                "gradient_checkpointing", "use_liger_kernel", "bf16", "vllm_gpu_memory_utilization", "beta",
                "vllm_importance_sampling_correction")}
            settings = out["backends"][backend]["settings"]
            settings.update(deferred_correction=False, length_grouping=False, pause_collection=False,
                            sampling_logprobs=trainers[backend].sampling_logprobs)  # 0.3.0's trainer: the last only
        del trainers
        out["model_dir"] = str(model)
        out["max_prompt_length"] = longest
    if "hf" in out["backends"] and "vllm" in out["backends"]:
        hf, vllm = out["backends"]["hf"], out["backends"]["vllm"]
        out["speedup_vs_hf"] = hf["median"]["step_s"] / vllm["median"]["step_s"]
        out["speedup_range"] = speedup_range(hf["step_s"], vllm["step_s"], interleaved=True).as_dict()
    return out


def _step_summary(seconds: list[float], records: list[dict], profile: BenchProfile, reason: str,
                  host: dict[str, list[float]] | None = None) -> dict[str, Any]:
    skip = profile.grpo_warmup_steps
    steps = seconds[skip:]
    logged = records[skip:skip + len(steps)]
    split = {name: [r.get(f"timing/{name}", float("nan")) for r in logged] for name in STEP_SPLIT}
    # the update is the step (this clock) less generation and rewards; its own split is the trainer's
    split["update_s"] = [s - g - w for s, g, w in zip(steps, split["generation_s"], split["reward_s"])]
    split["backward_optimizer_s"] = [u - o if o == o else u for u, o in zip(split["update_s"],
                                                                             split["old_ref_logps_s"])]
    split = {name: values for name, values in split.items() if any(v == v for v in values)}  # drop absent (NaN)
    lengths = [r.get("completions/mean_length", float("nan")) for r in logged]
    host = {name: values[skip:skip + len(steps)] for name, values in (host or {}).items()}
    return {"backend": reason, "step_s": steps, **split, "mean_completion_tokens": lengths, "all_steps_s": seconds,
            "host": host,
            "median": {"step_s": median(steps), **{name: median(values) for name, values in split.items()},
                       "mean_completion_tokens": median(lengths)},
            "spread": {"step_s": Spread.of(steps).as_dict()}}


def _release_trainer(trainer, kind: str) -> None:
    """Free a trainer's model, optimizer and colocated vLLM engine."""
    engine = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if engine is not None:
        with contextlib.suppress(Exception):
            shutdown_engine(engine)
    trainer.model = trainer.optimizer = trainer.ref_model = None
    device.release_memory(kind)


@contextlib.contextmanager
def _scratch(folder: str | Path | None) -> Iterator[str]:
    """``folder`` (created), or a temporary folder removed afterwards."""
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        yield str(folder)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-lab-bench-") as scratch:
            yield scratch


def bottleneck(step: dict[str, Any]) -> dict[str, float | str]:
    """The write-up's method on one backend's step: generation tokens/s vs training samples/s, and which one the
    step waits on. ``step`` is ``results["grpo_step"]["backends"][name]``."""
    m = step["median"]
    completions = step.get("completions_per_step") or 0
    tokens = completions * m["mean_completion_tokens"]
    generation_share = m["generation_s"] / m["step_s"]
    return {"generation_tokens_per_s": tokens / m["generation_s"],
            "training_samples_per_s": completions / m["update_s"] if m["update_s"] > 0 else float("nan"),
            "generation_share": generation_share,
            "verdict": "generation-bound" if generation_share > 0.5 else "update-bound"}
