"""The committed load tests of a served model (``benchmarks/serving/results``, one JSON per command of
``benchmarks/serving/run.py``), read back as :class:`ServingRun` records and described: each experiment's table, and
what it measured in sentences."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.load_test import format_table, load_results
from lab.committed import BENCHMARKS_DIR, Provenance

SERVING_RESULTS_DIR = BENCHMARKS_DIR / "serving" / "results"


@dataclass(frozen=True)
class ServingRun:
    """One committed results file: its body (``grpo_lab.load_test.save_results``' JSON) and where it came from."""

    name: str
    body: dict[str, Any]
    provenance: Provenance

    @classmethod
    def read(cls, path: Path) -> ServingRun:
        body = load_results(path)
        machine = body.get("machine", {})
        device = f"{machine.get('device', '')} ({machine.get('cpu_count', '?')} CPU cores)" if machine else ""
        return cls(path.stem, body, Provenance(body["command"], body.get("date", ""), device, path,
                                               body.get("commit", "")))

    def describe(self) -> str:
        return describe_results(self.body)

    def findings(self) -> list[str]:
        return knob_findings(self.body)

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        return experiment_runs(self.body, experiment)


def serving_runs(kind: str, folder: str | Path = SERVING_RESULTS_DIR) -> dict[str, ServingRun]:
    """The committed results files of one device kind (``"cpu"``, ``"cuda"``: the machine each file records), by
    file stem; {} when none has been measured there yet."""
    found = {path.stem: ServingRun.read(path) for path in sorted(Path(folder).glob("*.json"))}
    return {name: run for name, run in found.items() if run.body.get("machine", {}).get("device") == kind}


# How a run is named in each experiment of serving/run.py (its records list their "experiments")
EXPERIMENT_LABELS = {
    "concurrency": lambda r: f"{r['concurrency']} clients",
    "max_num_seqs": lambda r: f"max_num_seqs={r['server']['max_num_seqs']}",
    "max_model_len": lambda r: f"max_model_len={r['server']['max_model_len']}",
    "prefix_caching": lambda r: f"prefix caching {'on' if r['server']['enable_prefix_caching'] else 'off'}",
    "reference": lambda r: r["label"],
}


def experiment_runs(body: dict[str, Any], experiment: str) -> list[dict[str, Any]]:
    """The runs of one experiment in a results file, one row per variant (labelled by what varies): of repeated
    runs, the one with the median requests/s, with ``repeats``, ``requests_per_s_range`` and the errors of all."""
    label = EXPERIMENT_LABELS[experiment]
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in body["runs"]:
        if experiment in run.get("experiments", []):
            groups.setdefault(label(run), []).append(run)
    rows = []
    for name, runs in groups.items():
        ranked = sorted(runs, key=lambda r: r["requests_per_s"])
        rows.append({**ranked[(len(ranked) - 1) // 2], "label": name, "repeats": len(runs),
                     "requests_per_s_range": [ranked[0]["requests_per_s"], ranked[-1]["requests_per_s"]],
                     "errors_all_repeats": sum(r["errors"] for r in runs)})
    return rows


COMPARED_KNOBS = ("max_num_seqs", "max_model_len", "prefix_caching")
"""Experiments that compare settings of one knob: with a single setting they measured that setting, nothing more."""


def single_setting(body: dict[str, Any], experiment: str, row: dict[str, Any]) -> str:
    """One sentence for an experiment that ran at a single setting: what ran, and in which table its numbers are."""
    def key(r: dict[str, Any]) -> tuple:
        return r.get("experiments"), r["concurrency"], r["requests_per_s"], r["workload"]

    same = next((f"the '{other['label']}' row of the {name} table" for name in row.get("experiments", [])
                 if name != experiment and len(experiment_runs(body, name)) > 1
                 for other in experiment_runs(body, name) if key(other) == key(row)), None)
    return (f"only {row['label']} was run (one setting, so nothing to compare); its numbers are "
            + (same or f"{row['requests_per_s']:.1f} requests/s, first token p50 {row['ttft_p50_ms']:.0f} ms") + ".")


def describe_results(body: dict[str, Any]) -> str:
    """A results file as text: its command, then one table per experiment (or one table of all runs)."""
    parts = [f"command: {body['command']}"]
    for experiment in EXPERIMENT_LABELS:
        rows = experiment_runs(body, experiment)
        if len(rows) == 1 and experiment in COMPARED_KNOBS:  # one setting: nothing compared, say so, no table
            parts.append(f"\n{experiment}: {single_setting(body, experiment, rows[0])}")
        elif rows:
            parts += [f"\n{experiment}:", format_table(rows)]
    if len(parts) == 1:
        parts.append(format_table(body["runs"]))
    return "\n".join(parts)


def knob_findings(body: dict[str, Any]) -> list[str]:
    """What each experiment of a results file measured, as sentences of numbers (medians of repeats)."""
    found = []
    sweep = sorted(experiment_runs(body, "concurrency"), key=lambda r: r["concurrency"])
    if len(sweep) > 1:
        a, b = sweep[0], sweep[-1]
        found.append(f"{a['concurrency']} -> {b['concurrency']} clients: {a['requests_per_s']:.1f} -> "
                     f"{b['requests_per_s']:.1f} requests/s ({b['requests_per_s'] / a['requests_per_s']:.1f}x), "
                     f"p99 latency {a['e2e_p99_ms']:.0f} -> {b['e2e_p99_ms']:.0f} ms "
                     f"({b['e2e_p99_ms'] / a['e2e_p99_ms']:.1f}x); at {b['concurrency']} clients the client itself "
                     f"used {b['client_cpu_share']:.0%} of a CPU core.")
    for experiment, knob in (("max_num_seqs", "max_num_seqs"), ("max_model_len", "max_model_len")):
        settings = experiment_runs(body, experiment)
        if len(settings) == 1:
            found.append(f"{experiment}: {single_setting(body, experiment, settings[0])}")
            continue
        for r in sorted(settings, key=lambda r: r["server"][knob]):
            found.append(f"{r['label']} ({r['workload']}, {r['concurrency']} clients): {r['requests_per_s']:.1f} "
                         f"requests/s, first token p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms, "
                         f"{r['errors']} of {r['requests']} refused" + (f" ({', '.join(r['errors_by_kind'])})"
                                                                         if r["errors"] else "") + ".")
    for r in experiment_runs(body, "prefix_caching"):
        hit = r.get("prefix_cache_hit_rate")
        found.append(f"{r['label']} ({r['workload']}, {r['mean_prompt_tokens']:.0f} prompt tokens on average): "
                     + (f"{hit:.0%} of prompt tokens from the cache, " if hit is not None else "")
                     + f"first token p50 {r['ttft_p50_ms']:.0f} ms, {r['requests_per_s']:.1f} requests/s.")
    for r in experiment_runs(body, "reference"):
        ours = next((o for o in experiment_runs(body, "max_num_seqs")
                     if o["server"]["max_num_seqs"] == r["server"]["max_num_seqs"]), None)
        if ours:
            found.append(f"vLLM's own benchmark, same server and load: {r['requests_per_s']:.1f} requests/s, first "
                         f"token p50 {r['ttft_p50_ms']:.0f} ms (this client: {ours['requests_per_s']:.1f}, "
                         f"{ours['ttft_p50_ms']:.0f} ms).")
    return found
