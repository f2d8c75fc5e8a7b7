"""The committed results the notebooks print are read by one function each, into records with their provenance."""

import json

from grpo_lab import results, runs
from grpo_lab.rollout import committed_smoke_runs


def test_kl_brake_record_says_where_it_came_from():
    kl = results.kl_brake()
    where = kl.provenance
    assert where.command.startswith("python benchmarks/kl_brake/run.py") and where.date and where.device == "cpu"
    assert where.file == "results.json" and where.line().startswith("measured on cpu, ")
    assert {run.beta for run in kl.runs} >= {0.0} and {run.seed for run in kl.runs} == set(kl.seeds)
    run = kl.runs[0]
    assert run.points("trained", "greedy") == run.changes["trained"]["greedy"]["points"]


def test_smollm2_run_reads_results_and_probe():
    run = results.smollm2_run()
    assert run.device == "NVIDIA H200" and run.versions["vllm"] and run.prompts_per_step == 16
    assert set(run.before) == set(run.after) >= {"all", "en", "zh"}
    assert set(run.step_seconds) == {"vllm_colocate", "hf_generate"} and run.base_last_number_pass_at_1
    assert (run.folder / "curves.png").is_file() and [r["step"] for r in run.metrics][:2] == [1, 2]


def test_committed_smoke_runs_rebuild_their_command():
    smoke = committed_smoke_runs()
    assert [run.model for run in smoke] == ["the tiny model", "qwen2.5-0.5b"]
    assert all(run.command.startswith("python -m grpo_lab.rollout") and run.vllm_over_hf > 1 for run in smoke)
    assert "--shape qwen2.5-0.5b" in smoke[1].command


def test_run_record(tmp_path):
    record = {"created": "2026-12-01T10:00:00+00:00", "config": {"profile": "tiny", "device": "cpu"},
              "backend": "HF generate", "versions": {"trl": "1.16.0"}}
    (tmp_path / runs.CONFIG_FILE).write_text(json.dumps(record), encoding="utf-8")
    recorded = runs.Run(tmp_path).recorded
    assert recorded.config["profile"] == "tiny" and recorded.device == "cpu" and recorded.backend == "HF generate"
    assert recorded.versions == {"trl": "1.16.0"} and recorded.resumed_from is None


def test_every_committed_record_dates_its_measurement_by_the_day():
    """Files keep a date or a full timestamp; a record's provenance is the day either way, so notebooks print one
    format (``measured on DEVICE, YYYY-MM-DD: COMMAND``)."""
    from pathlib import Path

    from grpo_lab.committed import Provenance

    stamped = Provenance("python x.py", "2026-12-01T16:02:34+00:00", "NVIDIA H200", Path("x.json"))
    assert stamped.date == "2026-12-01" and stamped.line() == "measured on NVIDIA H200, 2026-12-01: python x.py"
    assert Provenance("c", "2026-11-30", "d", Path("y.json")).date == "2026-11-30"
    assert Provenance("c", "not recorded", "d", Path("y.json")).date == "not recorded"
    kl = results.kl_brake()
    assert len(kl.provenance.date) == 10
