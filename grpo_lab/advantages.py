"""Group-relative advantages, computed the way TRL's ``GRPOTrainer`` computes them.

GRPO samples ``num_generations`` completions per prompt (a *group*) and compares each with its own group:
``advantage = (reward - group mean) / (std + 1e-4)``; a group whose completions all score the same teaches nothing.
TRL (``GRPOTrainer._generate_and_score_completions``) works in float32 and:

* combines reward functions per completion as ``nansum(reward_i * weight_i)`` (None counts as NaN); a completion where
  *every* function returned None is left out of the group statistics and gets advantage 0;
* subtracts the **group** mean (also with ``scale_rewards="batch"``);
* divides by ``std + 1e-4``, the **sample** std (``n - 1``) of the group (``scale_rewards="group"``, or ``True``) or
  of the batch (``"batch"``), or not at all (``"none"`` or ``False``, as Dr. GRPO recommends);
* with ``multi_objective_aggregation="normalize_then_sum"`` (GDPO) normalizes each reward within its group first,
  sums with the weights, then normalizes the sum over the batch.

verl's GRPO (``compute_grpo_outcome_advantage``) differs: its epsilon is ``1e-6`` (:data:`VERL_EPSILON`), a group of
one keeps its raw score (TRL gives 0), and "not applicable" becomes 0.0 in the export's ``compute_score``, which counts
in its group's statistics; ``norm_adv_by_std_in_grpo=False`` is ``scale_rewards="none"``.

>>> result = group_advantages([0.6, 0.5, 0.5, 0.2], num_generations=4)
>>> round(result.group_mean[0], 4), [round(a, 4) for a in result.advantages]
(0.45, [0.8655, 0.2885, 0.2885, -1.4425])
"""

from __future__ import annotations

__all__ = ["SEED_EXAMPLE_REWARDS", "describe_zero_std", "explain_group", "group_advantages"]

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from grpo_lab.errors import ConfigError, DataError

ScaleRewards = Literal["group", "batch", "none"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]

EPSILON = 1e-4
"""Added to the std before dividing, as in TRL (a constant there, not a config field)."""
VERL_EPSILON = 1e-6
"""verl's ``compute_grpo_outcome_advantage`` default (no verl caller passes another value)."""

SEED_EXAMPLE_REWARDS = (0.6, 0.5, 0.5, 0.2)
"""The seed write-up's worked example: one prompt, four completions with these rewards."""


def normalize_scale_rewards(scale_rewards: str | bool) -> ScaleRewards:
    """Map TRL's legacy booleans (``True`` → "group", ``False`` → "none") and check the value."""
    value = ("group" if scale_rewards else "none") if isinstance(scale_rewards, bool) else scale_rewards
    if value not in ("group", "batch", "none"):
        raise ConfigError(
            f"scale_rewards must be 'group', 'batch', 'none', True or False (as in GRPOConfig), got {scale_rewards!r}.")
    return value


def nanstd(tensor: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Sample standard deviation (Bessel's ``n - 1``) ignoring NaNs; NaN where fewer than two values remain."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std if keepdim else std.squeeze(dim) if dim is not None else std.reshape(())


@dataclass(frozen=True)
class Advantages:
    """Per-completion numbers behind GRPO's advantages (lists in completion order, groups contiguous)."""

    rewards: list[float]
    """The combined reward per completion (NaN for an unscorable completion)."""
    group_mean: list[float]
    """The mean reward of the completion's group (the baseline that is subtracted)."""
    std: list[float]
    """The std the advantage was divided by (group or batch std; still reported for ``scale_rewards="none"``)."""
    advantages: list[float]
    is_std_zero: list[bool]
    """True where the std is zero: the group carries no learning signal (TRL logs the fraction)."""
    num_generations: int
    scale_rewards: ScaleRewards
    epsilon: float = EPSILON

    @property
    def frac_reward_zero_std(self) -> float:
        """TRL's ``frac_reward_zero_std`` metric for this batch."""
        return sum(self.is_std_zero) / len(self.is_std_zero)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per completion: group, index in group, reward, mean, std, advantage."""
        return [{"group": i // self.num_generations, "completion": i % self.num_generations, "reward": r,
                 "group_mean": m, "std": s, "advantage": a}
                for i, (r, m, s, a) in enumerate(zip(self.rewards, self.group_mean, self.std, self.advantages))]

    def to_frame(self):
        """The rows as a pandas DataFrame (pandas ships with ``datasets``)."""
        import pandas as pd

        return pd.DataFrame(self.rows())


def _as_tensor(values: Sequence[Any]) -> torch.Tensor:
    """Rewards (None allowed) as a float32 tensor with None → NaN, as TRL converts them."""
    return torch.as_tensor(values if isinstance(values, torch.Tensor) else _none_to_nan(values), dtype=torch.float32)


def _none_to_nan(values: Any) -> Any:
    if isinstance(values, (list, tuple)):
        return [_none_to_nan(v) for v in values]
    return math.nan if values is None else float(values)


def compute_advantages(rewards_per_func: Sequence[Sequence[float | None]] | torch.Tensor, num_generations: int, *,
                       reward_weights: Sequence[float] | None = None, scale_rewards: ScaleRewards | bool = "group",
                       multi_objective_aggregation: Aggregation = "sum_then_normalize",
                       epsilon: float = EPSILON) -> Advantages:
    """Advantages from several reward functions, as ``GRPOTrainer`` computes them: ``rewards_per_func[i][j]`` is
    function ``j`` on completion ``i`` (None allowed), the ``num_generations`` completions of a prompt contiguous."""
    table = _as_tensor(rewards_per_func)
    if table.dim() != 2:
        raise DataError(
            f"rewards_per_func must be 2-D (completions × reward functions), got shape {tuple(table.shape)}.")
    n, k = table.shape
    if num_generations < 1 or n % num_generations:
        raise DataError(f"{n} completions do not split into groups of num_generations={num_generations}; a batch must "
                        "hold whole groups (completions of one prompt next to each other).")
    weights = torch.ones(k) if reward_weights is None else torch.tensor([float(w) for w in reward_weights])
    if len(weights) != k:
        raise ConfigError(f"Number of reward weights ({len(weights)}) must match number of reward functions ({k}).")
    scale = normalize_scale_rewards(scale_rewards)
    unscorable = torch.isnan(table).all(dim=1)
    G = num_generations

    if multi_objective_aggregation == "sum_then_normalize":
        rewards = (table * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        group_mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)
        if scale == "batch":
            std = nanstd(rewards).expand_as(rewards) if n > 1 else torch.zeros_like(rewards)
        else:
            std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G) if G > 1 else torch.zeros_like(rewards)
        advantages = rewards - group_mean
        if scale != "none":
            advantages = advantages / (std + epsilon)
    elif multi_objective_aggregation == "normalize_then_sum":
        grouped = table.view(-1, G, k)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if G > 1 else torch.zeros_like(mean_k)
        normalized = ((grouped - mean_k) / (std_k + epsilon)).view(-1, k)
        rewards = (normalized * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        group_mean = torch.nanmean(rewards).expand_as(rewards)  # GDPO's final baseline is the batch mean
        std = nanstd(rewards).expand_as(rewards) if n > 1 else torch.zeros_like(rewards)
        advantages = (rewards - group_mean) / (std + epsilon)
    else:
        raise ConfigError("multi_objective_aggregation must be 'sum_then_normalize' or 'normalize_then_sum', "
                          f"got {multi_objective_aggregation!r}.")

    return Advantages(rewards=rewards.tolist(), group_mean=group_mean.tolist(), std=std.tolist(),
                      advantages=torch.nan_to_num(advantages, nan=0.0).tolist(),
                      is_std_zero=torch.isclose(std, torch.zeros_like(std)).tolist(), num_generations=G,
                      scale_rewards=scale, epsilon=epsilon)


def group_advantages(rewards: Sequence[float | None], num_generations: int | None = None, *,
                     scale_rewards: ScaleRewards | bool = "group", epsilon: float = EPSILON) -> Advantages:
    """Advantages from one combined reward per completion; ``num_generations`` defaults to one group.

    >>> [round(a, 3) for a in group_advantages([1.0, 1.0, 1.0, 1.0]).advantages]  # zero variance: no signal
    [0.0, 0.0, 0.0, 0.0]
    """
    G = len(rewards) if num_generations is None else num_generations
    return compute_advantages([[r] for r in rewards], G, scale_rewards=scale_rewards, epsilon=epsilon)


def explain_group(rewards: Sequence[float] = SEED_EXAMPLE_REWARDS, epsilon: float = EPSILON) -> str:
    """The arithmetic of one group's advantages, step by step, in plain numbers (float64).

    >>> print(explain_group())  # doctest: +NORMALIZE_WHITESPACE
    rewards      : 0.6, 0.5, 0.5, 0.2
    group mean   : (0.6 + 0.5 + 0.5 + 0.2) / 4 = 0.45
    deviations   : +0.15, +0.05, +0.05, -0.25
    sample std   : sqrt((0.0225 + 0.0025 + 0.0025 + 0.0625) / (4 - 1)) = 0.1732
    advantages   : deviation / (0.1732 + 0.0001) = +0.8655, +0.2885, +0.2885, -1.4425
    (dividing by the population std 0.15 instead would give +1, +0.3333, +0.3333, -1.667)
    """
    n = len(rewards)
    if n < 2:
        raise DataError("A group needs at least two completions for a standard deviation.")
    mean = sum(rewards) / n
    deviations = [r - mean for r in rewards]
    squares = [d * d for d in deviations]
    std = math.sqrt(sum(squares) / (n - 1))
    population_std = math.sqrt(sum(squares) / n)
    fmt = lambda values, spec: ", ".join(format(v, spec) for v in values)  # noqa: E731
    scaled = [d / (std + epsilon) for d in deviations]
    lines = [f"rewards      : {fmt(rewards, 'g')}",
             f"group mean   : ({' + '.join(format(r, 'g') for r in rewards)}) / {n} = {mean:.4g}",
             f"deviations   : {fmt(deviations, '+.4g')}",
             f"sample std   : sqrt(({' + '.join(format(s, '.4g') for s in squares)}) / ({n} - 1)) = {std:.4f}",
             f"advantages   : deviation / ({std:.4f} + {epsilon:g}) = {fmt(scaled, '+.4f')}"]
    if population_std > 0:
        lines.append(f"(dividing by the population std {population_std:.4g} instead would give "
                     f"{fmt([d / population_std for d in deviations], '+.4g')})")
    return "\n".join(lines)


def all_right_share(mean_reward: float, frac_reward_zero_std: float, group_size: int) -> tuple[float, float]:
    """Bounds on the share ``a`` of all-right groups for a 1/0 reward, from ``frac_reward_zero_std`` = z and the mean
    reward r: r = a + (1 − z)·m with m in [1/G, (G − 1)/G], so a lies in [r − (1 − z)(G − 1)/G, r − (1 − z)/G]
    within [0, z] (linear: means over steps keep the bounds).

    >>> [round(x, 3) for x in all_right_share(0.8, 0.63, 8)]
    [0.476, 0.63]
    """
    if group_size < 2:
        raise ConfigError(f"group_size={group_size}: a group needs at least 2 completions")
    rest = 1.0 - frac_reward_zero_std
    low = mean_reward - rest * (group_size - 1) / group_size
    high = mean_reward - rest / group_size
    return max(0.0, min(low, frac_reward_zero_std)), max(0.0, min(high, frac_reward_zero_std))


def describe_zero_std(mean_reward: float, frac_reward_zero_std: float, group_size: int, binary: bool) -> str:
    """``frac_reward_zero_std`` in one sentence: for a right/wrong reward (``binary``) how many silent groups were all
    right and how many all wrong (:func:`all_right_share`), otherwise only that they scored the same."""
    z = frac_reward_zero_std
    if not binary:
        return (f"{z:.0%} of groups gave every completion the same total reward (no signal); with several rewards "
                f"combined the logs do not say whether those were all right or all wrong")
    low, high = all_right_share(mean_reward, z, group_size)
    wrong_low, wrong_high = z - high, z - low
    if low == 0 and high == z:
        return (f"{z:.0%} of groups had one reward for all {group_size} completions (no signal); at a mean reward of "
                f"{mean_reward:.3f} they may be all right or all wrong (the logs do not tell)")
    return (f"{z:.0%} of groups had one reward for all {group_size} completions (no signal): by the mean reward "
            f"{mean_reward:.3f}, {_share(low, high)} of all groups were all right (solved every time) and "
            f"{_share(wrong_low, wrong_high)} all wrong")


def _share(low: float, high: float) -> str:
    return f"{low:.0%}" if round(100 * low) == round(100 * high) else f"between {low:.0%} and {high:.0%}"
