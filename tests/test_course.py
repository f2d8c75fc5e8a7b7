"""grpo_lab.course: notebooks run in order, executed copies and a summary are kept, a failure stops the rest."""

import json
import re

import nbformat
import pytest

from grpo_lab import course, runs


def write_notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_runs_in_order_and_stops_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.delenv(runs.RUN_DIR_ENV, raising=False)  # run_course sets it; restored after the test
    src = tmp_path / "nbs"
    src.mkdir()
    first = write_notebook(src / "00_ok.ipynb",
                           "from grpo_lab import runs\n(runs.workspace('x') / 'result.txt').write_text('42')\n"
                           "(runs.root() / 'grpo-x').mkdir(); runs.record_use(runs.root() / 'grpo-x', 'used')")
    second = write_notebook(src / "01_fail.ipynb",  # the cause first, a log's last lines after it (as a DeployError)
                            "raise ValueError('broken on purpose\\nTraceback of a child\\nRuntimeError: see above')")
    third = write_notebook(src / "02_later.ipynb", "print('never')")
    assert course.course_notebooks(src) == [first, second, third]

    out = tmp_path / "run"
    results = course.run_course(out, course.course_notebooks(src))
    assert [r.status for r in results] == ["ok", "failed", "not run"]
    assert results[1].error == "ValueError: broken on purpose"  # the summary names the cause, not the log's end
    assert (out / "x" / "result.txt").read_text() == "42"  # the notebook saved into the run folder
    executed = nbformat.read(out / "00_ok.ipynb", as_version=4)
    assert executed.cells[0].execution_count == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == ["00_ok.ipynb", "01_fail.ipynb", "02_later.ipynb"]
    table = course.format_summary(results)
    assert "00_ok.ipynb" in table and "failed" in table
    assert results[0].runs == ["used grpo-x"] and "used grpo-x" in table  # the summary names the run it used

    # a course in parts (one GPU call each): --keep-going runs past the failure, the summary keeps the earlier rows
    again = course.run_course(out, [second, third], keep_going=True)
    assert [r.status for r in again] == ["failed", "ok"]
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["notebook"], s["status"]) for s in summary] == [
        ("00_ok.ipynb", "ok"), ("01_fail.ipynb", "failed"), ("02_later.ipynb", "ok")]


def test_a_course_stopped_half_way_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """A GPU session that runs out of time ends the course during a notebook: the summary holds those before it."""
    monkeypatch.delenv(runs.RUN_DIR_ENV, raising=False)
    src = tmp_path / "nbs"
    src.mkdir()
    first = write_notebook(src / "00_ok.ipynb", "print('done')")
    second = write_notebook(src / "01_long.ipynb", "print('never ends')")
    finished = course.run_notebook

    def stopped(path, *args, **kwargs):
        if path == second:
            raise KeyboardInterrupt("the machine went back")
        return finished(path, *args, **kwargs)

    monkeypatch.setattr(course, "run_notebook", stopped)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        course.run_course(out, [first, second])
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["notebook"], s["status"]) for s in summary] == [("00_ok.ipynb", "ok")]


def test_every_course_notebook_is_committed_without_outputs():
    for path in course.course_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs: strip them"


def test_where_next_names_notebooks_and_commands_that_exist():
    from grpo_lab import cli
    from grpo_lab.device import Machine

    names = {path.stem for path in course.course_notebooks()}
    assert {notebook for _, notebook, _ in course.REOPEN} <= names
    for machine in (Machine("cpu", bf16=False, memory_gib=16), Machine("cuda", bf16=True, memory_gib=24),
                    Machine("npu", bf16=True, memory_gib=32)):
        commands = course.next_commands(machine)
        assert commands and all(why for _, why in commands)
        for command, _ in commands:
            words = command.split()
            if "grpo-lab" in words:
                assert words[words.index("grpo-lab") + 1] in cli.SUBCOMMANDS, command
            if "python" in words:
                assert (course.REPO_ROOT / words[words.index("python") + 1]).is_file(), command
    assert any("--profile npu" in c for c, _ in course.next_commands(Machine("cpu", bf16=False, memory_gib=16)))


def test_where_next_recommends_only_what_the_device_can_run(monkeypatch):
    """Hub models anyone can download, the largest the planner fits on the device's memory (LoRA where only LoRA
    fits), never a local folder of the machine the course ran on (the GPU course runs set GRPO_LAB_MODEL to one)."""
    from grpo_lab.device import Machine

    monkeypatch.setenv("GRPO_LAB_MODEL", "/tmp/grpo-smollm2/model")
    small, large = Machine("cuda", bf16=True, memory_gib=16), Machine("cuda", bf16=True, memory_gib=80)
    for machine in (small, large):
        text = "\n".join(command for command, _ in course.next_commands(machine))
        assert "/tmp/" not in text and "--profile gpu" in text and "npu" not in text
        assert all(model in course.LEARNER_MODELS for model in re.findall(r"--model (\S+)", text))
    fits_small = course.largest_fitting_model("gpu", 16, use_peft=True)
    fits_large = course.largest_fitting_model("gpu", 80, use_peft=True)
    assert course.LEARNER_MODELS.index(fits_large.model) > course.LEARNER_MODELS.index(fits_small.model)
    assert fits_small.use_peft and f"--model {fits_small.model} --use-peft true" in fits_small.train_command()
    full = course.largest_fitting_model("gpu", 16)
    assert full is not None and not full.use_peft and full.training_peak_gib < 16
    assert course.largest_fitting_model("gpu", 4) is None  # nothing fits: the commands say so
    assert "no model of" in course.next_commands(Machine("cuda", bf16=True, memory_gib=4))[-1][1]


def test_a_cell_past_its_timeout_fails_the_notebook(tmp_path, monkeypatch):
    """nbclient's per-cell timeout bounds every wait for the kernel: a cell that runs past it is a failure, named."""
    monkeypatch.delenv(runs.RUN_DIR_ENV, raising=False)
    slow = write_notebook(tmp_path / "00_slow.ipynb", "import time\ntime.sleep(30)")
    result = course.run_notebook(slow, tmp_path, timeout_s=2)
    assert result.status == "failed" and "timed out" in result.error.lower() and result.seconds < 30


def test_the_notebooks_are_found_by_name_not_by_number():
    assert course._notebook_stem("grpo_training").endswith("_grpo_training")
    assert course._notebook_stem("no_such_lesson") == "no_such_lesson"
    with pytest.raises(SystemExit) as exit_:
        course.main(["--help"])
    assert exit_.value.code == 0
