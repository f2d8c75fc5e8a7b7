"""benchmarks/gsm8k/run.py on the CPU: its split of GSM8K, its record, and the whole script in its smoke mode (the
tiny model, 2 steps, 16 held-out problems), read back by lab.results.gsm8k_run as notebook 08 reads the committed run."""

import importlib.util
import json
from pathlib import Path

from grpo_lab import data
from lab import results

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE = Path(__file__).parent / "fixtures" / "gsm8k_train_sample.jsonl"


def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_gsm8k_run", REPO_ROOT / "benchmarks" / "gsm8k" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_split_holds_out_first_then_drops_long_prompts():
    run = bench()
    rows = data.load_gsm8k("train", path=SAMPLE)
    too_long = {rows[3]["id"], rows[7]["id"]}

    def fits(part):
        return [row["id"] not in too_long for row in part]

    parts = run.split_rows(rows, eval_size=4, train_rows=5, fits=fits)
    _, held = data.hold_out(rows, size=4)  # the held-out problems do not depend on the model's tokenizer
    assert [r["id"] for r in parts["held_out"]] == [r["id"] for r in held if r["id"] not in too_long]
    assert len(parts["train"]) == 5 and not {r["id"] for r in parts["train"]} & {r["id"] for r in held}
    dropped = parts["dropped_long_prompts"]
    assert dropped["train"] + dropped["held_out"] == 2 and not too_long & {r["id"] for r in parts["train"]}


def test_training_summary_reads_the_first_and_last_steps():
    metrics = [{"step": i, "reward": i / 10, "frac_reward_zero_std": 1 - i / 10, "step_time": 1.0 + i,
                "completions/mean_length": 100.0} for i in range(1, 11)]
    summary = bench().training_summary(metrics, window=2)
    assert summary["reward_first"] == 0.15 and summary["reward_last"] == 0.95
    assert summary["frac_reward_zero_std_last"] == 0.05 and summary["step_s_median"] == 7.5  # steps 3-10


def test_the_smoke_run_writes_the_record_notebook_08_reads(tmp_path):
    assert bench().main(["--smoke", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["smoke"] and record["steps"] == 2 and record["data"]["held_out"] == 16
    assert record["data"]["file"] == "benchmarks/gsm8k/train.jsonl.xz" and record["recipe"]["rewards"] == ["correctness"]
    rows = data.load_jsonl(tmp_path / "gsm8k_train.jsonl")
    assert len(rows) == record["data"]["train_rows"] == 32 and {r["type"] for r in rows} == {"gsm8k"}
    run = results.gsm8k_run(tmp_path / "results.json")
    assert run.steps == 2 and run.held_out == 16 and run.accuracy["count"] == 16 and run.provenance.device
    assert run.accuracy["describe"].startswith("greedy accuracy ") and "standard errors" in run.format["describe"]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert results.gsm8k_run(tmp_path / "missing.json") is None
