"""grpo_lab.course: notebooks run in order, executed copies and a summary are kept, a failure stops the rest."""

import json

import nbformat

from grpo_lab import course


def write_notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_runs_in_order_and_stops_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.delenv(course.RUN_DIR_VAR, raising=False)  # run_course sets it; restored after the test
    src = tmp_path / "nbs"
    src.mkdir()
    first = write_notebook(src / "00_ok.ipynb",
                           "from grpo_lab.course import run_dir\n(run_dir('x') / 'result.txt').write_text('42')")
    second = write_notebook(src / "01_fail.ipynb", "raise ValueError('broken on purpose')")
    third = write_notebook(src / "02_later.ipynb", "print('never')")
    assert course.course_notebooks(src) == [first, second, third]

    out = tmp_path / "run"
    results = course.run_course(out, course.course_notebooks(src))
    assert [r.status for r in results] == ["ok", "failed", "not run"]
    assert "broken on purpose" in results[1].error
    assert (out / "x" / "result.txt").read_text() == "42"  # the notebook saved into the run folder
    executed = nbformat.read(out / "00_ok.ipynb", as_version=4)
    assert executed.cells[0].execution_count == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == ["00_ok.ipynb", "01_fail.ipynb", "02_later.ipynb"]
    table = course.format_summary(results)
    assert "00_ok.ipynb" in table and "failed" in table


def test_every_course_notebook_is_committed_without_outputs():
    for path in course.course_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs: strip them"
