"""Faults: a training process killed at any point resumes to the same result; a reward that raises is handled.

The crash tests run the real ``grpo-lab train`` (``python -m grpo_lab.cli train``) on the shipped tiny model
(HF generate, CPU, 6 steps, a checkpoint every 2) and SIGKILL it (a test-only trainer subclass,
``tests/fault_injection.py``) during a generation, while a checkpoint is being written and during an update, one
kill after the other on the same run folder: each kill hits a run resumed from the one before. Resumed with
``--resume-from-checkpoint true``, each run must load only a complete checkpoint, log every step exactly once and end
with the same weights as a run that was never interrupted. The reward tests train in this
process with a reward function that raises at step 3.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpo_lab import runs
from grpo_lab import train as T
from grpo_lab.rewards import RewardValidationError, completion_text, get_reward, prepare

REPO = Path(__file__).resolve().parent.parent
MAX_STEPS = 6
CLI_ARGS = ["--profile", "tiny", "--max-steps", str(MAX_STEPS), "--save-steps", "2", "--per-device-train-batch-size",
            "8", "--num-generations", "4", "--train-size", "16", "--seed", "0"]
SMALL = dict(profile="tiny", per_device_train_batch_size=8, num_generations=4, train_size=16, live_plot=False)


def grpo_lab_train(run: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """``grpo-lab train`` in a fresh process (one thread, offline); with ``fault="point:step"`` its trainer kills
    itself there (``tests/fault_injection.py``)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("GRPO_LAB_MODEL", "GRPO_LAB_PROFILE", runs.RUN_DIR_ENV)}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = [str(REPO / "tests" / "fault_injection.py"), fault] if fault else ["-m", "grpo_lab.cli"]
    return subprocess.run([sys.executable, *command, "train", *CLI_ARGS, "--output-dir", str(run), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def final_weights(run: Path) -> dict:
    return load_file(run / runs.FINAL / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The same run, never killed: what every resumed run must end with."""
    run = tmp_path_factory.mktemp("faults") / "uninterrupted"
    done = grpo_lab_train(run)
    assert done.returncode == 0, done.stdout + done.stderr
    return run


# --------------------------------------------------------------------------------------------------
# SIGKILL at three points, each in a run resumed from the kill before, then resume to the end
# --------------------------------------------------------------------------------------------------
# fault -> (steps in metrics.jsonl after the kill, complete checkpoints left, interrupted save left in .partial/); in
# this order each run starts from the newest complete checkpoint the kill before left (none, 2, 2)
KILLS = {
    "generation:3": ([1, 2], [2], None),
    "checkpoint:4": ([1, 2, 3, 4], [2], "checkpoint-4"),
    "update:5": ([1, 2, 3, 4], [2, 4], None),
}


def check_killed(run: Path, fault: str, killed: subprocess.CompletedProcess) -> None:
    """What a SIGKILL at ``fault`` leaves: only complete checkpoints, each step logged once, no final model."""
    logged, complete, interrupted = KILLS[fault]
    point, step = fault.split(":")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert f"SIGKILL at {point} of step {step}" in killed.stdout
    assert [p.name for p in runs.list_checkpoints(run)] == [f"checkpoint-{n}" for n in complete]
    for checkpoint in runs.list_checkpoints(run):
        runs.check_checkpoint(checkpoint)  # every checkpoint-N in checkpoints/ is complete
    assert [r["step"] for r in runs.read_metrics(run)] == logged
    assert not (run / runs.FINAL).exists()
    if interrupted:  # killed mid-write: weights written, optimizer state not, and kept out of checkpoints/
        partial = run / runs.PARTIAL / interrupted
        assert (partial / "model.safetensors").is_file() and not (partial / "optimizer.pt").exists()
        with pytest.raises(runs.CheckpointError, match="interrupted"):
            runs.resolve_resume(run, str(partial))
    else:
        assert not (run / runs.PARTIAL).exists()


def check_resumed_from(run: Path, before: str, output: str) -> None:
    """The resumed run started from the newest checkpoint the kill ``before`` left, and cleared its interrupted save."""
    _, complete, interrupted = KILLS[before]
    newest = run / runs.CHECKPOINTS / f"checkpoint-{complete[-1]}"
    assert f"Resuming from {newest} (step {complete[-1]}) to step {MAX_STEPS}" in output
    assert json.loads((run / runs.CONFIG_FILE).read_text())["resumed_from"] == str(newest)
    assert (f"Deleting {run / runs.PARTIAL} ({interrupted})" in output) == bool(interrupted)


def test_killed_runs_resume_to_the_same_final_model(uninterrupted, tmp_path):
    run, before = tmp_path / "run", None
    for fault in KILLS:
        killed = grpo_lab_train(run, *(("--resume-from-checkpoint", "true") if before else ()), fault=fault)
        if before:
            check_resumed_from(run, before, killed.stdout)
        check_killed(run, fault, killed)
        before = fault

    resumed = grpo_lab_train(run, "--resume-from-checkpoint", "true")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    check_resumed_from(run, before, resumed.stdout)
    assert not (run / runs.PARTIAL).exists()
    assert [p.name for p in runs.list_checkpoints(run)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]

    records, reference = runs.read_metrics(run), runs.read_metrics(uninterrupted)
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))  # each step once, no gap
    assert [(r["reward"], r["loss"]) for r in records] == [(r["reward"], r["loss"]) for r in reference]
    manifest = json.loads((run / runs.FINAL / "manifest.json").read_text())
    assert manifest["global_step"] == MAX_STEPS
    weights, expected = final_weights(run), final_weights(uninterrupted)
    assert all(weights[name].equal(expected[name]) for name in expected)  # resumed = never interrupted


# --------------------------------------------------------------------------------------------------
# The pieces: atomic publish, interrupted saves, metrics log
# --------------------------------------------------------------------------------------------------
def fake_checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        (folder / name).write_bytes(b"x")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_publish_replaces_a_checkpoint_saved_again_and_removes_the_staging_folder(tmp_path):
    target = fake_checkpoint(tmp_path / runs.CHECKPOINTS / "checkpoint-4", 4)
    (target / "stale.txt").write_text("from the first attempt")
    staged = fake_checkpoint(tmp_path / runs.PARTIAL / "checkpoint-4", 4)
    assert runs.publish_folder(staged, target) == target
    assert not (target / "stale.txt").exists() and (target / "optimizer.pt").is_file()
    assert not (tmp_path / runs.PARTIAL).exists()


def test_resume_never_picks_an_interrupted_save(tmp_path):
    fake_checkpoint(tmp_path / runs.PARTIAL / "checkpoint-4", 4)
    with pytest.raises(runs.CheckpointError, match=r"holds no checkpoint \(only .partial/checkpoint-4"):
        runs.resolve_resume(tmp_path, True)
    older = fake_checkpoint(tmp_path / runs.CHECKPOINTS / "checkpoint-2", 2)
    assert runs.resolve_resume(tmp_path, True) == older
    runs.discard_interrupted_saves(tmp_path)
    assert not (tmp_path / runs.PARTIAL).exists() and older.is_dir()


def test_metrics_log_survives_a_line_cut_short(tmp_path):
    lines = [json.dumps({"step": s, "reward": 0.5}) for s in (1, 2, 3)] + ['{"step": 4, "rew']
    (tmp_path / runs.METRICS_FILE).write_text("\n".join(lines))
    assert [r["step"] for r in runs.read_metrics(tmp_path)] == [1, 2, 3]
    logger = T.MetricsLogger(tmp_path, live_plot=False,
                             previous=[r for r in runs.read_metrics(tmp_path) if r["step"] <= 2])
    assert [r["step"] for r in logger.records] == [1, 2]
    assert [r["step"] for r in runs.read_metrics(tmp_path)] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [runs.METRICS_FILE]  # no temporary file left


def test_reward_errors_is_an_option_with_two_modes():
    assert T.build_parser().parse_args(["--reward-errors", "skip"]).reward_errors == "skip"
    with pytest.raises(ValueError, match=r"reward_errors='ignore': use 'raise' .* or 'skip'"):
        prepare(["correctness"], errors="ignore")
    with pytest.raises(ValueError, match=r"reward_errors='ignore': use 'raise' .* or 'skip'"):
        T.TrainConfig(reward_errors="ignore")


# --------------------------------------------------------------------------------------------------
# A reward function that raises mid-run
# --------------------------------------------------------------------------------------------------
class FragileCorrectness:
    """The correctness reward, except that at ``step`` it raises on the batch's first completion (and on any
    completion identical to it), as a parser that chokes on one odd text would."""

    def __init__(self, step: int | None):
        self.step = step
        self.bad: str | None = None
        self.__name__ = "fragile_correctness"
        self.correctness = get_reward("correctness")

    def __call__(self, prompts, completions, trainer_state, **kwargs):
        if trainer_state.global_step + 1 == self.step:
            if len(completions) > 1:
                self.bad = completion_text(completions[0])
            if any(completion_text(c) == self.bad for c in completions):
                raise ValueError("cannot parse this completion")
        return self.correctness(prompts=prompts, completions=completions, **kwargs)


def test_raising_reward_stops_the_run_with_a_message_and_the_run_resumes_after_the_fix(tmp_path):
    run = tmp_path / "run"
    config = dict(SMALL, output_dir=str(run), max_steps=4, save_steps=2)
    with pytest.raises(RewardValidationError, match=r"(?s)Reward function 'fragile_correctness' failed on sample \d+: "
                       r"it raised ValueError: cannot parse.*Fix: .*at step 3, before its update.*"
                       r"resume_from_checkpoint=True.*reward_errors='skip'"):
        T.train(T.TrainConfig(**config), reward_funcs=[FragileCorrectness(step=3)])
    assert [p.name for p in runs.list_checkpoints(run)] == ["checkpoint-2"]
    runs.check_checkpoint(run / runs.CHECKPOINTS / "checkpoint-2")
    assert [r["step"] for r in runs.read_metrics(run)] == [1, 2]

    fixed = T.train(T.TrainConfig(**config, resume_from_checkpoint=True), reward_funcs=[FragileCorrectness(step=None)])
    assert fixed.global_step == 4 and (run / runs.FINAL / "model.safetensors").is_file()
    assert [r["step"] for r in runs.read_metrics(run)] == [1, 2, 3, 4]


def test_raising_reward_skips_the_sample_when_configured(tmp_path, caplog):
    run = tmp_path / "run"
    config = T.TrainConfig(**SMALL, output_dir=str(run), max_steps=4, save_steps=100, reward_errors="skip")
    result = T.train(config, reward_funcs=[FragileCorrectness(step=3)])
    assert result.global_step == 4 and (run / runs.FINAL / "model.safetensors").is_file()
    issues = result.trainer.reward_funcs[0].issues
    assert issues and all("raised ValueError: cannot parse" in issue.message for issue in issues)
    assert "Recorded None for it and went on" in caplog.text
    skipped = {r["step"]: r["rewards/fragile_correctness/skipped"] for r in runs.read_metrics(run)}
    assert skipped == {1: 0.0, 2: 0.0, 3: float(len(issues)), 4: 0.0}
