"""The catalogue of committed bench results and its one reader.

``benchmarks/results/catalogue.json`` names every committed results file by a key (``"rollout 1.5b"``), groups runs of
one command into series, and states the project's targets for them. :func:`read_catalogue` reads it, and every file it
names, into a :class:`Catalogue`: :class:`~lab.bench.committed.CommittedRun` records by key,
:class:`Series` and :class:`~lab.bench.targets.Target` records, and the tables and verdicts notebook 06 prints.
A new measurement is a results file and an entry in the catalogue; the package does not change.

>>> catalogue = read_catalogue()                                   # doctest: +SKIP
>>> catalogue.verdict("fixed step 2x").verdict                     # doctest: +SKIP
'not met (only the high end reaches 2.00x)'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from lab.bench.committed import (
    ROLLOUT_HEADER,
    CommittedRun,
    RolloutHeadline,
    StepRatio,
    engine_profile,
    grpo_header,
)
from lab.bench.targets import MEASURES, Target, Verdict, judge, run_verdicts
from lab.committed import read_committed
from lab.committed import RESULTS_DIR

CATALOGUE_FILE = RESULTS_DIR / "catalogue.json"


class CatalogueError(ConfigError):
    """The catalogue names a run, series or measure it does not hold, or misses a committed file; the message says
    which."""


@dataclass(frozen=True)
class Series:
    """Runs of one command (the same settings), each on its own machine or back to back."""

    name: str
    about: str
    runs: tuple[str, ...]
    """Catalogue keys, in the order they ran."""


@dataclass(frozen=True)
class Catalogue:
    """The committed bench results: every run by key, the series, the targets, and views across a folder's runs."""

    path: Path
    runs: dict[str, CommittedRun]
    series: dict[str, Series]
    targets: tuple[Target, ...]
    engine_profile_file: Path
    engine_profile_run: str
    """The run during which py-spy took :attr:`engine_profile_file`'s samples."""

    def run(self, key: str) -> CommittedRun:
        if key not in self.runs:
            raise CatalogueError(f"{self.path} has no run {key!r}; its keys: {', '.join(self.runs)}")
        return self.runs[key]

    def file(self, key: str, suffix: str = ".json") -> Path:
        """A run's results file (``suffix=".png"``: its plot)."""
        return self.run(key).path.with_suffix(suffix)

    def in_series(self, name: str) -> list[CommittedRun]:
        return [self.runs[key] for key in self.series[name].runs]

    def runs_in(self, folder: str | Path = "h200") -> list[CommittedRun]:
        """The runs whose files are in ``folder`` (a name under the catalogue's folder, or a path), by file name."""
        where = (self.path.parent / folder).resolve()
        return sorted((run for run in self.runs.values() if run.path.parent.resolve() == where), key=lambda r: r.name)

    def rollout_table(self, folder: str | Path = "h200") -> str:
        """Every rollout result in ``folder``: per file, variant and config the new tokens, tokens/s and the ratio over
        HF with its range over the rounds; single ``grpo-lab rollout`` calls as run."""
        return "\n".join([ROLLOUT_HEADER, *(line for run in self.runs_in(folder) for line in run.rollout_lines())])

    def grpo_table(self, folder: str | Path = "h200") -> str:
        """Every GRPO-step result in ``folder``: per backend the median step (min..max), generation and update, and the
        step ratio's range with its caveat."""
        runs = [run for run in self.runs_in(folder) if run.step.get("backends")]
        width = max((len(run.name) + 2 for run in runs), default=41)
        return "\n".join([grpo_header(width), *(line for run in runs for line in run.grpo_lines(width))])

    def rollout_headlines(self, folder: str | Path = "h200") -> list[RolloutHeadline]:
        return [row for run in self.runs_in(folder) for row in run.rollout_headlines()]

    def grpo_steps(self, folder: str | Path = "h200") -> list[StepRatio]:
        """Every GRPO-step comparison in ``folder`` (runs with both backends)."""
        return [step for run in self.runs_in(folder) if (step := run.step_comparison())]

    def grpo_split(self, folder: str | Path = "h200") -> list[dict[str, Any]]:
        """:meth:`CommittedRun.split` of every run in ``folder``: per backend the step, its split and the update MFU."""
        return [row for run in self.runs_in(folder) for row in run.split()]

    def paired_step_ratios(self, folder: str | Path = "h200") -> list[dict[str, Any]]:
        """:meth:`CommittedRun.paired_row` of every run in ``folder`` whose backends alternated."""
        return [row for run in self.runs_in(folder) if (row := run.paired_row())]

    def host_work(self, folder: str | Path = "h200") -> list[dict[str, Any]]:
        """:meth:`CommittedRun.host_work` of every run in ``folder`` that recorded the host beside each step."""
        return [row for run in self.runs_in(folder) for row in run.host_work()]

    def engine_profile(self) -> list[dict[str, Any]]:
        """Where vLLM's generate spent the host's time inside the trainer (:func:`~lab.bench.committed.
        engine_profile` of :attr:`engine_profile_file`)."""
        return engine_profile(self.engine_profile_file)

    def target(self, target_id: str) -> Target:
        found = [t for t in self.targets if t.id == target_id]
        if not found:
            raise CatalogueError(f"{self.path} has no target {target_id!r}; its targets: "
                                 f"{', '.join(t.id for t in self.targets)}")
        return found[0]

    def verdict(self, target_id: str) -> Verdict:
        return judge(self.target(target_id), self.runs)

    def verdicts(self) -> list[Verdict]:
        """Every target with what the runs it reads measured and its verdict, in the catalogue's order."""
        return [judge(target, self.runs) for target in self.targets]

    def run_verdicts(self, target_id: str) -> list[dict[str, str | int]]:
        """One row per run a step target reads, with the run's settings and its own verdict
        (:func:`~lab.bench.targets.run_verdicts`)."""
        return run_verdicts(self.target(target_id), self.runs)

    def targets_markdown(self) -> str:
        """Every target with its measurement and verdict as one Markdown table (``benchmarks/results/README.md``)."""
        return "\n".join(["| target | measured | verdict |", "|---|---|---|",
                          *(f"| {v.target.what} | {v.measured} | {v.verdict} |" for v in self.verdicts())])


def _expand(names: list[str], series: dict[str, list[str]], runs: dict[str, Any], where: str,
            seen: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Run keys and series names -> run keys (a series may name other series), each name checked."""
    keys: list[str] = []
    for name in names:
        if name in series and name in runs:
            raise CatalogueError(f"{where}: {name!r} is both a run and a series")
        if name in seen:
            raise CatalogueError(f"{where}: series {name!r} names itself")
        if name in series:
            keys += _expand(series[name], series, runs, f"series {name!r}", (*seen, name))
        elif name in runs:
            keys.append(name)
        else:
            raise CatalogueError(f"{where} reads {name!r}, which is neither a run nor a series of the catalogue")
    return tuple(keys)


def _target(entry: dict[str, Any], series: dict[str, list[str]], runs: dict[str, Any], folder: Path) -> Target:
    where = f"target {entry.get('id')!r}"
    if entry.get("measure") not in MEASURES:
        raise CatalogueError(f"{where}: measure {entry.get('measure')!r} is not one of {', '.join(MEASURES)}")
    smollm2 = entry.get("smollm2")
    return Target(id=entry["id"], what=entry["what"], measure=entry["measure"],
                  reads=_expand(entry.get("reads", []), series, runs, where), threshold=entry.get("threshold"),
                  compare=entry.get("compare", ">="),
                  groups={label: _expand(names, series, runs, where)
                          for label, names in entry.get("groups", {}).items()},
                  variant=entry.get("variant"), backend=entry.get("backend"),
                  smollm2=(folder / smollm2["folder"], smollm2["first"], smollm2["last"]) if smollm2 else None)


def read_catalogue(path: str | Path = CATALOGUE_FILE) -> Catalogue:
    """The catalogue in ``path`` with every run it names read (paths relative to its folder); a name that is neither
    a run nor a series, an unknown measure, or a results file in its folders that it does not name is an error."""
    path = Path(path)
    data, folder = read_committed(path), path.parent
    devices = data.get("folder_devices", {})
    runs = {key: CommittedRun.read(key, folder / f"{where}.json", devices.get(where.split("/")[0], ""))
            for key, where in data["runs"].items()}
    series_names = {name: entry["runs"] for name, entry in data["series"].items()}
    series = {name: Series(name, entry.get("about", ""), _expand(entry["runs"], series_names, runs, f"series {name!r}"))
              for name, entry in data["series"].items()}
    named = {run.path.resolve() for run in runs.values()}
    unnamed = sorted(str(p.relative_to(folder)) for sub in {run.path.parent for run in runs.values()}
                     for p in sub.glob("*.json") if p.resolve() not in named)
    if unnamed:
        raise CatalogueError(f"{path} does not name {', '.join(unnamed)}: give each results file a key in its runs")
    profile = data["engine_profile"]
    if profile["run"] not in runs:
        raise CatalogueError(f"{path}: the engine profile's run {profile['run']!r} is not a run of the catalogue")
    return Catalogue(path=path, runs=runs, series=series,
                     targets=tuple(_target(entry, series_names, runs, folder) for entry in data["targets"]),
                     engine_profile_file=folder / profile["file"], engine_profile_run=profile["run"])
