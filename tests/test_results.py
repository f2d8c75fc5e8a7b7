"""The committed results the notebooks print are read by one function each of the lab, into records with their
provenance."""

import json
from pathlib import Path

import pytest

from grpo_lab import runs
from lab import results
from lab import scale as lab_scale
from lab.committed import CommittedResultError, Provenance
from lab.rollout import smoke_runs


def test_kl_brake_record_says_where_it_came_from():
    kl = results.kl_brake()
    where = kl.provenance
    assert where.command.startswith("python benchmarks/kl_brake/run.py") and where.date and where.device == "cpu"
    assert where.file == "results.json" and where.line().startswith("measured on cpu, ")
    assert where.line().endswith("(benchmarks/kl_brake/results.json)")
    assert {run.beta for run in kl.runs} >= {0.0} and {run.seed for run in kl.runs} == set(kl.seeds)
    run = kl.runs[0]
    assert run.points("trained", "greedy") == run.changes["trained"]["greedy"]["points"]


def test_smollm2_run_reads_results_and_probe():
    run = results.smollm2_run()
    assert run.provenance.device == "NVIDIA H200" and run.versions["vllm"] and run.prompts_per_step == 16
    assert "command not recorded" in run.provenance.line()  # the file records its device only
    assert set(run.before) == set(run.after) >= {"all", "en", "zh"}
    assert set(run.step_seconds) == {"vllm_colocate", "hf_generate"} and run.base_last_number_pass_at_1
    assert (run.folder / "curves.png").is_file() and [r["step"] for r in run.metrics][:2] == [1, 2]


def test_committed_smoke_runs_rebuild_their_command():
    smoke = smoke_runs()
    assert [run.model for run in smoke] == ["the tiny model", "qwen2.5-0.5b"]
    assert smoke[0].provenance.command.startswith("grpo-lab rollout") and all(run.vllm_over_hf > 1 for run in smoke)
    assert smoke[1].provenance.command.startswith("python -m lab.rollout --shape qwen2.5-0.5b")
    # the files record neither device nor date: the device is the catalogue's for their folder
    assert {run.provenance.device for run in smoke} == {"NVIDIA H200"} and "date not recorded" in smoke[0].provenance.line()


def test_run_record(tmp_path):
    record = {"created": "2026-12-01T10:00:00+00:00", "config": {"profile": "tiny", "device": "cpu"},
              "backend": "HF generate", "versions": {"trl": "1.16.0"}}
    (tmp_path / runs.CONFIG_FILE).write_text(json.dumps(record), encoding="utf-8")
    recorded = runs.Run(tmp_path).recorded
    assert recorded.config["profile"] == "tiny" and recorded.device == "cpu" and recorded.backend == "HF generate"
    assert recorded.versions == {"trl": "1.16.0"} and recorded.resumed_from is None


def test_every_committed_record_dates_its_measurement_by_the_day():
    """Files keep a date or a full timestamp; a record's provenance is the day either way, so notebooks print one
    format (``measured on DEVICE, YYYY-MM-DD[, commit C]: COMMAND (benchmarks/FILE)``)."""
    stamped = Provenance("python x.py", "2026-12-01T16:02:34+00:00", "NVIDIA H200", Path("x.json"), "abc1234")
    assert stamped.date == "2026-12-01" and stamped.line().startswith(
        "measured on NVIDIA H200, 2026-12-01, commit abc1234: python x.py (")
    assert Provenance("c", "2026-11-30", "d", Path("y.json")).date == "2026-11-30"
    assert Provenance("c", "not recorded", "d", Path("y.json")).date == "not recorded"
    kl = results.kl_brake()
    assert len(kl.provenance.date) == 10


def test_scale_out_reader_gives_the_committed_h200_comparison():
    seed = lab_scale.read_scale_out()
    assert (round(seed.colocate.step_s, 2), round(seed.colocate.generation_s, 2)) == (14.78, 9.21)
    assert (round(seed.server.step_s, 2), round(seed.server.generation_s, 2), round(seed.server.update_s, 2)) == (
        13.83, 8.77, 5.04)
    assert round(seed.speedup_server_vs_colocate, 2) == 1.07 and list(seed.layouts()) == ["colocate", "server"]
    # overlap could at best make a step as long as its longer part: generation here
    assert seed.server.overlapped_s == seed.server.generation_s and round(seed.server.overlap_ceiling, 2) == 1.58
    assert seed.provenance.device == "2 × NVIDIA H200" and seed.provenance.date.startswith("2026-11-30")
    server_call, colocate_call = seed.provenance.command.split("; ")  # the two parts were measured by two calls
    assert "--parts server" in server_call and "--parts colocate" in colocate_call


def test_step_split_overlap_is_bounded_by_the_longer_part():
    split = lab_scale.StepSplit(step_s=10.0, generation_s=3.0, reward_s=1.0, update_s=6.0)
    assert split.overlapped_s == 7.0 and split.overlap_ceiling == 10.0 / 7.0


def test_async_reader_is_none_until_measured_then_a_record(tmp_path):
    assert lab_scale.read_async_speed(tmp_path / "results.json") is None
    speed = {"command": "python benchmarks/async_grpo/run.py speed", "created": "2026-12-02T00:00:00+0000",
             "device": {"kind": "cuda", "name": "NVIDIA H200", "count": 2},
             "layouts": {"async": {"completions_per_second": 60.0, "median_step_s": 8.5},
                         "server": {"completions_per_second": 40.0, "median_step_s": 12.8}}}
    (tmp_path / "results.json").write_text(json.dumps({"created": "x", "speed": speed, "speedup_vs_sync_server": 1.5}))
    measured = lab_scale.read_async_speed(tmp_path / "results.json")
    assert measured.layouts["async"] == lab_scale.LayoutSpeed(60.0, 8.5) and measured.speedup_vs_sync_server == 1.5
    assert measured.provenance.line() == ("measured on 2 × NVIDIA H200, 2026-12-02: "
                                          f"python benchmarks/async_grpo/run.py speed ({tmp_path / 'results.json'})")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CommittedResultError, match="broken.json"):
        lab_scale.read_async_speed(tmp_path / "broken.json")
