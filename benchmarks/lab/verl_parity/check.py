"""A finished verl run checked again from its files, with grpo_lab alone (:func:`check_run`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import MissingFileError
from grpo_lab.rewards import prepare
from lab.verl_parity.metrics import as_course_records, validation_metric, validation_scores
from lab.verl_parity.parity import (
    AdvantageParity,
    RewardParity,
    advantage_parity,
    read_metrics,
    read_rollouts,
    reward_parity,
)


@dataclass
class RunCheck:
    """A verl run of an export, read from its files and checked again with grpo_lab (no verl needed)."""

    records: list[dict[str, Any]]
    """Per training step, under the course's names (:func:`as_course_records`)."""
    validation: dict[int, dict[str, float]]
    rewards: RewardParity
    advantages: dict[int, AdvantageParity]
    """Per dumped step: the course's advantages against the range verl logged for the step."""
    test_rows: int
    """Prompts of the export's ``test.parquet``: what each validation mean is measured on."""

    def accuracy(self) -> dict[int, float]:
        """step -> verl's greedy validation accuracy (``val-core/<data source>/acc/mean@1``; step 0: before training)."""
        return validation_metric(self.validation, "acc")

    @property
    def advantage_max_abs_diff(self) -> float | None:
        """The largest difference from verl's logged advantage range over all steps (None: nothing to compare)."""
        diffs = [a.max_abs_diff_vs_logged_range for a in self.advantages.values()
                 if a.max_abs_diff_vs_logged_range is not None]
        return max(diffs) if diffs else None


def check_run(folder: str | Path, export_manifest: str | Path, export_overrides: str | Path) -> RunCheck:
    """Check a finished verl run again: every dumped completion re-scored with the export's reward set, every dumped
    batch's advantages recomputed against what verl logged.

    ``folder`` holds verl's ``metrics.jsonl`` and ``rollouts/`` (``benchmarks/verl/run.py`` keeps both);
    ``export_manifest`` is the export's ``export.json`` (the rewards and their weights), ``export_overrides`` its
    ``verl_overrides.yaml`` (``algorithm.norm_adv_by_std_in_grpo``).
    """
    import yaml

    folder = Path(folder)
    metrics, rollouts = read_metrics(folder / "metrics.jsonl"), read_rollouts(folder / "rollouts")
    if not metrics or not rollouts:
        raise MissingFileError(f"{folder} has no verl metrics.jsonl or rollouts/ to check; a verl run writes them "
                               "with trainer.logger=[console,file] and trainer.rollout_data_dir=<folder>/rollouts")
    manifest = json.loads(Path(export_manifest).read_text(encoding="utf-8"))
    reward_set = prepare(manifest["experiment"]["rewards"], manifest["reward_weights"])
    every = [record for step in sorted(rollouts) for record in rollouts[step]]
    by_step = {int(m["step"]): m for m in metrics}
    norm = bool(yaml.safe_load(Path(export_overrides).read_text(encoding="utf-8"))["algorithm.norm_adv_by_std_in_grpo"])
    return RunCheck(records=as_course_records(metrics), validation=validation_scores(metrics),
                    rewards=reward_parity(every, reward_set),
                    advantages={step: advantage_parity(records, None, by_step.get(step), norm_by_std=norm)
                                for step, records in sorted(rollouts.items())},
                    test_rows=manifest["num_test_rows"])
