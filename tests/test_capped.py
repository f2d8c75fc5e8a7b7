"""benchmarks/capped, on the CPU: the jobs' plans say what each row expects, the jobs fit side by side, a row's JSON
round-trips through the lab's reader (``lab.capped.capped_rows``), the capped course becomes a row, the
command line parses, and the course runner's peak fields exist."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import pytest

from grpo_lab import course, memory
from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig
from grpo_lab.paths import REPO_ROOT, TINY_MODEL_DIR
from lab import capped

CAPPED = REPO_ROOT / "benchmarks" / "capped"
sys.path.insert(0, str(CAPPED))

import course_row  # noqa: E402
import jobs  # noqa: E402
import measure  # noqa: E402

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _run_module():
    spec = importlib.util.spec_from_file_location("capped_run", CAPPED / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def seed_prompt_length():
    from transformers import AutoTokenizer

    import runners

    return runners.longest_rows(AutoTokenizer.from_pretrained(TINY_MODEL_DIR))[1]


def test_each_row_is_planned_as_it_expects(seed_prompt_length):
    for job in jobs.JOBS.values():
        for row in job.rows:
            if row.kind == "serve":  # a finished run of the same job, served from a process of its own
                assert row.settings["run_of"] in [r.name for r in job.rows if r.kind == "course"]
                continue
            if row.kind == "trl":
                budget = measure.trl_plan(row, job.cap_gib, seed_prompt_length)
            else:
                machine = Machine("cuda", bf16=True, memory_gib=job.cap_gib)
                config = TrainConfig(model=SMOLLM2, profile="gpu", **row.settings, max_steps=row.steps).resolve(machine)
                budget = memory.plan_memory(memory.model_config(SMOLLM2), precision=config.precision,
                                            shape=config.training_shape(), device_memory_gib=job.cap_gib,
                                            device_kind="cuda",
                                            vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization)
            assert budget.fits == (row.expect == "fits"), (job.name, row.name, budget.advice)


def test_the_headline_rows_tell_the_write_ups_story(seed_prompt_length):
    rows = {row.name: measure.trl_plan(row, 32, seed_prompt_length) for row in jobs.JOBS["seed-2b"].rows}
    at_06, planner, with_lora, asleep = rows.values()
    assert at_06.vllm_gpu_memory_utilization == with_lora.vllm_gpu_memory_utilization == 0.6
    assert not at_06.fits and planner.fits and with_lora.fits and asleep.fits
    assert planner.vllm_gpu_memory_utilization < asleep.vllm_gpu_memory_utilization < 0.6
    awake_at_055 = memory.plan_memory(memory.course_configs()[jobs.SEED_SHAPE], device_memory_gib=32, device_kind="cuda",
                                      vllm_gpu_memory_utilization=0.55, **jobs.SEED_RECIPE)
    assert not awake_at_055.fits  # sleep mode is the lever that makes 0.55 fit


def test_jobs_fit_side_by_side_and_within_the_time():
    assert jobs.SIDE_BY_SIDE_GIB + 0.3 * 16 < 135  # the caps plus the served model's share, under one H200
    assert max(jobs.JOBS[name].minutes for name in jobs.SIDE_BY_SIDE) <= 7
    ids = [jobs.row_id(name, row) for name, job in jobs.JOBS.items() for row in job.rows]
    assert len(ids) == len(set(ids)) and all("__" in i and " " not in i for i in ids)


def test_a_job_runs_under_its_cap_with_its_own_compile_cache():
    run = _run_module()
    env = run.job_environment("lengths-24", {"PATH": "/usr/bin", "PYTHONPATH": "/x"})
    assert env["GRPO_LAB_DEVICE_MEMORY_GIB"] == "24" and env["GRPO_LAB_MODEL"] == run.SMOLLM2
    assert env["PYTHONPATH"].startswith("/tmp/grpo-gpu-site:") and env["PYTHONPATH"].endswith(":/x")
    assert env["VLLM_CACHE_ROOT"].endswith("vllm-cache/lengths-24")
    assert run.job_environment("bench-80", {})["GRPO_LAB_DEVICE_MEMORY_GIB"] == "80"
    assert run.job_environment("bench-80", {}, device_gib=139.8)["GRPO_LAB_DEVICE_MEMORY_GIB"] == "80"
    on_an_h100 = run.job_environment("bench-80", {"GRPO_LAB_DEVICE_MEMORY_GIB": "24"}, device_gib=79.6)
    assert "GRPO_LAB_DEVICE_MEMORY_GIB" not in on_an_h100  # an 80 GB card is the card the row is about
    assert run.bench_command(32, None)[-1].endswith("_80gb_card")
    assert run.bench_micro_batch() in (128, 64, 32, 16)
    assert "--per-device-train-batch-size" in run.bench_command(32)


def test_sleep_mode_is_stood_in_for_by_ballast_not_by_the_fraction(seed_prompt_length):
    """The fraction counts a sleeping engine's released memory (probes/sleep_probe.json); ballast.py leaves the driver
    only the cap free instead, and sleep mode is then the lever between the two rows of one share."""
    import ballast

    asleep, awake = jobs.JOBS["seed-2b-sleep"].rows
    assert awake.stand_in == asleep.stand_in == "ballast" and jobs.JOBS["seed-2b-sleep"].cap_gib == 32
    assert {r.stand_in for r in jobs.JOBS["seed-2b"].rows} == {"fraction"}
    share = {r.settings["vllm_gpu_memory_utilization"] for r in (awake, asleep)}
    assert share == {0.55} and asleep.settings["vllm_enable_sleep_mode"]
    assert "vllm_enable_sleep_mode" not in awake.settings
    plans = [measure.trl_plan(row, 32, seed_prompt_length) for row in (awake, asleep)]
    assert not plans[0].fits and plans[1].fits
    gib = ballast.GIB
    assert ballast.ballast_bytes(78 * gib, 32 * gib) == 46 * gib
    assert ballast.chunks(int(2.5 * gib)) == [gib, gib, gib // 2] and sum(ballast.chunks(46 * gib)) == 46 * gib
    with pytest.raises(ValueError, match="only 20.00 GiB are free"):
        ballast.ballast_bytes(20 * gib, 32 * gib)
    with pytest.raises(ValueError, match="positive"):
        ballast.ballast_bytes(20 * gib, 0)


def test_a_ballast_that_cannot_hold_lets_the_row_say_so(tmp_path, monkeypatch, capsys):
    """Here (no CUDA) ballast.py fails at once: the context ends it, its log says why, and no ready file claims a
    held device (the row's own check, runners.ballast_check, then refuses to run as a 32 GiB card)."""
    run = _run_module()
    monkeypatch.setattr(run, "WORK", tmp_path)
    (tmp_path / "logs").mkdir()
    with run.ballast("seed-2b-sleep", "row", 32, ready_s=60):
        pass
    assert "ballast not ready" in capsys.readouterr().out
    assert not (tmp_path / "logs" / "row.ballast.json").exists()
    assert "Error" in (tmp_path / "logs" / "row.ballast.log").read_text()


def test_a_job_that_fails_fails_the_jobs_command(tmp_path, monkeypatch):
    """2026-12-07: bench-80 exited 2 (no model folder) and `run.py jobs` still reported 0 to chain.sh's progress."""
    run = _run_module()

    class Child:
        def __init__(self, command, **_):
            self.code = 2 if command[-1] == "qlora" else 0

        def wait(self):
            return self.code

    monkeypatch.setattr(run, "WORK", tmp_path)
    monkeypatch.setattr(run, "START_STAGGER_S", 0)
    monkeypatch.setattr(run.subprocess, "Popen", Child)
    assert run.run_jobs(["seed-2b", "qlora"]) == 1
    assert json.loads((tmp_path / "done").read_text()) == {"seed-2b": 0, "qlora": 2}
    assert run.run_jobs(["seed-2b"]) == 0


def test_the_command_line(capsys):
    run = _run_module()
    assert run.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in jobs.JOBS) and "side by side" in listed and "bench-80" in listed
    with pytest.raises(SystemExit):
        run.main(["start", "no-such-job"])
    with pytest.raises(SystemExit):
        run.main(["job", "bench-80"])


def test_an_out_of_memory_row_round_trips_through_the_reader(tmp_path):
    row = jobs.JOBS["seed-2b"].rows[0]
    record = measure.base_record("seed-2b", row, 32, jobs.SEED_SHAPE)
    budget = measure.trl_plan(row, 32, 120)
    record["planned"] = measure.planned_fields(budget, 8, 1, 0.1373)
    clock = measure.PhaseClock()
    clock.step, clock.phase = 1, "optimizer step"
    clock.seconds, clock.update_peaks, clock.tokens = [3.0], [30 * 2**30], [2048.0]

    class Sampler:
        def stop(self):
            return 31 * 2**30

    error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    done = measure.finish(record, clock, {"vllm_resident": 14 * 2**30, "gpu_memory_utilization": 0.1373}, Sampler(),
                          error)
    measure.write(done, tmp_path / "a.json")
    failed = measure.finish(measure.base_record("qlora", jobs.JOBS["qlora"].rows[0], 16, "model"), measure.PhaseClock(),
                            {}, Sampler(), ValueError("a bug"))
    measure.write(failed, tmp_path / "b.json")
    rows = capped.capped_rows(tmp_path)
    oom = next(r for r in rows if r.job == "seed-2b")
    assert oom.oom == capped.OutOfMemory(1, "optimizer step", "RuntimeError: CUDA out of memory. Tried to allocate "
                                                              "2.00 GiB")
    assert oom.measured["training_peak_gib"] == 16.0 and oom.measured["device_used_gib"] == 31.0
    assert "max_allocated_at_failure_gib" in oom.measured
    assert oom.planner_error == pytest.approx((budget.training_peak_bytes / 2**30 - 16) / 16, abs=1e-3)
    assert "OOM at step 1 (optimizer step)" in oom.line()
    bug = next(r for r in rows if r.job == "qlora")
    assert bug.error == "ValueError: a bug" and bug.oom is None and "failed" in bug.line()
    assert capped.capped_rows(tmp_path / "none") == [] and capped.capped_rows(tmp_path, job="course") == []


def test_a_row_says_how_its_accuracy_moved_and_where_it_was_measured():
    gain = {"before": 0.0025, "after": 0.0025, "points": 0.0, "standard_errors": 0.0, "problems": 400}
    row = capped.CappedRow("qlora", "QLoRA r=16, learns", 16, "model", "qlora", steps=50,
                           extra={"greedy_accuracy": gain, "greedy_accuracy_hf": {**gain, "after": 0.05,
                                                                                   "standard_errors": 4.2}})
    assert "greedy accuracy on the trainer's engine 0.2% → 0.2% (+0.0 standard errors)" in row.line()
    assert "greedy accuracy on HF generate 0.2% → 5.0% (+4.2 standard errors)" in row.line()
    assert "greedy" not in capped.CappedRow("seed-2b", "x", 32, "m", "r").line()


def test_a_served_row_says_how_each_way_started_and_answered():
    """The shape ``runners.serve_both`` writes (a way that failed keeps its error; the next way is still tried)."""
    served = {"adapter on its 4-bit base": {"start_seconds": 61.1, "quantization": "bitsandbytes", "accuracy": 0.0625,
                                            "problems": 16},
              "merged final/": {"error": "ServerDied: exit 1"}, "same_greedy_text": 0.0625}
    row = capped.CappedRow("qlora-adapter", "served", 16, "model", "{}", measured={"device_used_gib": 5.8},
                           extra={"served": served})
    assert row.outcome == ("served adapter on its 4-bit base (started in 61 s, 1 of 16 held-out problems right); "
                           "merged final/ (failed: ServerDied: exit 1)")
    assert row.line().endswith(f"{row.outcome}; device used 5.8 GiB")
    assert capped.CappedRow("qlora", "x", 16, "m", "r", steps=50).outcome == "50 steps"
    assert "device used" not in capped.CappedRow("qlora", "x", 16, "m", "r", error="killed").line()


def test_the_capped_course_becomes_a_row(tmp_path):
    run_dir = tmp_path / "grpo-gpu-20261203-120000"
    run_dir.mkdir()
    config = TrainConfig(profile="gpu", model=SMOLLM2).resolve(Machine("cuda", True, 24))
    (run_dir / "config.json").write_text(json.dumps({
        "config": dataclasses.asdict(config), "memory_plan": {"fits": True, "training_peak_gib": 8.8},
        "memory_cap": {"memory_gib": 24, "device_gib": 139.8, "kind": "cuda"}}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "step_time": t, "completions/mean_length": 100})
                                                   + "\n" for i, t in enumerate((5.0, 1.5, 1.3), 1)))
    summary = [{"notebook": "03_grpo_training.ipynb", "status": "ok", "seconds": 240.0, "runs": [f"trained {run_dir.name}"],
                "max_allocated_gib": 12.5, "device_used_gib": 15.1},
               {"notebook": "05_deployment.ipynb", "status": "ok", "seconds": 200.0, "runs": [],
                "max_allocated_gib": 1.0, "device_used_gib": 19.0}]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "run.json").write_text(json.dumps({"commit": "abc1234", "device": "NVIDIA H200, 143771 MiB",
                                                  "model": "/tmp/grpo-smollm2/model"}))
    path = course_row.write_course_row(tmp_path, 24, tmp_path / "rows")
    row, = capped.capped_rows(tmp_path / "rows")
    assert path.name.startswith("course__") and row.job == "course" and row.commit == "abc1234"
    assert row.name == "notebooks 03-05 under 24 GiB"  # a subset's row never reads as the whole course
    assert row.planned["vllm_gpu_memory_utilization"] == config.vllm_gpu_memory_utilization
    assert row.measured == {"max_allocated_gib": 12.5, "device_used_gib": 19.0} and row.error is None
    assert row.step_seconds == (5.0, 1.5, 1.3) and row.median_step_seconds == 1.4
    assert row.tokens_per_second == pytest.approx(2 * 100 * 128 / 2.8, abs=0.1)
    assert row.extra["notebook_seconds"] == 440.0
    assert "about 1.4 s per step" in capped.expectation(24, [row]) and "4 minutes" in capped.expectation(32, [row])
    assert "no course run" in capped.expectation(16, [row])
    assert capped.speed_table([row])[0]["notebook 03 (s)"] == 240.0


def test_a_course_cut_short_gives_the_notebooks_that_finished(tmp_path):
    """The machine went back in 05 (2026-12-05): no summary.json; course.log and course_runs.jsonl still say what ran."""
    run_dir = tmp_path / "grpo-gpu-20261205-121747"
    run_dir.mkdir()
    config = TrainConfig(profile="gpu", model=SMOLLM2).resolve(Machine("cuda", True, 16))
    (run_dir / "config.json").write_text(json.dumps({"config": dataclasses.asdict(config), "memory_plan": {}}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "step_time": t}) + "\n"
                                                   for i, t in enumerate((6.0, 2.0, 1.8), 1)))
    (tmp_path / "course.log").write_text("running 03_grpo_training.ipynb ...\n[IPKernelApp] WARNING | Kernel\n"
                                         "  ok in 307 s\nrunning 04_memory_budget.ipynb ...\n  ok in 9 s\n"
                                         "running 05_deployment.ipynb ...\n[IPKernelApp] WARNING | Kernel\n")
    (tmp_path / "course_runs.jsonl").write_text(json.dumps({"notebook": "03_grpo_training.ipynb", "run": run_dir.name,
                                                            "how": "trained"}) + "\n")
    path = course_row.write_course_row(tmp_path, 16, tmp_path / "rows")
    row, = capped.capped_rows(tmp_path / "rows")
    assert path.name == "course__notebooks-03-04-under-16-gib.json" and row.error is None
    assert [(nb.notebook[:2], nb.status, nb.seconds) for nb in row.notebooks] == [("03", "ok", 307.0), ("04", "ok", 9.0)]
    assert row.extra["did_not_finish"] == ["05_deployment.ipynb"] and row.step_seconds == (6.0, 2.0, 1.8)
    assert "notebook 03 about 5 minutes" in capped.expectation(16, [row])


def test_a_row_of_notebook_05_alone_neither_hides_the_step_time_nor_reads_as_zero_steps(tmp_path):
    """05 under 16 GiB ran alone on 2026-12-07 (deploying the base model) beside the committed 03-04 row of that cap."""
    summary = [{"notebook": "05_deployment.ipynb", "status": "ok", "seconds": 156.1, "runs": ["trained lora-run"],
                "max_allocated_gib": 1.12, "device_used_gib": 15.432}]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "run.json").write_text(json.dumps({"commit": "5b06a61", "device": "NVIDIA H100 80GB HBM3, 81559 MiB"}))
    course_row.write_course_row(tmp_path, 16, tmp_path / "rows")
    alone, = capped.capped_rows(tmp_path / "rows")
    assert alone.name == "notebook 05 under 16 GiB" and alone.steps == 0 and alone.outcome == "05 ok in 156 s"
    assert alone.measured == {"max_allocated_gib": 1.12, "device_used_gib": 15.432}
    trained = dataclasses.replace(alone, name="notebooks 03-04 under 16 GiB", steps=3, step_seconds=(6.0, 2.0, 1.8),
                                  notebooks=(capped.NotebookPeak("03_grpo_training.ipynb", "ok", 307.0),))
    assert "about 1.9 s per step, notebook 03 about 5 minutes" in capped.expectation(16, [alone, trained])
    assert "an unrecorded step time" in capped.expectation(16, [alone])  # only where no row timed a step


def test_the_course_runner_records_peaks():
    fields = {f.name for f in dataclasses.fields(course.NotebookResult)}
    assert {"max_allocated_gib", "device_used_gib"} <= fields
    import torch

    assert eval(course.KERNEL_PEAK_EXPRESSION) in (None, torch.cuda.max_memory_allocated() if torch.cuda.is_initialized()
                                                   else None)
    assert issubclass(course.MeasuredClient, course.NotebookClient)
