"""grpo_lab.advantages: the seed's worked example, edge cases, and equality with TRL's own numbers.

How the equality with TRL is obtained (no formula is re-typed here): TRL 1.16 computes advantages inline in
``GRPOTrainer._generate_and_score_completions`` and exposes no helper for it. So the test builds a real
``GRPOTrainer`` around a randomly initialised 1-layer Qwen2 (a few thousand parameters, made in memory, no
hub) and an in-memory word-level tokenizer, and gives it reward functions that ignore the generated text
and return a per-row column of the input batch (``r0``, ``r1``). Calling the trainer's own
``_generate_and_score_completions`` on that batch runs TRL's real path: generation, the reward call,
None → NaN, ``reward_weights`` with nansum, the unscorable mask, group mean, ``scale_rewards``, the 1e-4
epsilon, ``nan_to_num``. Its ``"advantages"`` output is compared with ``grpo_lab.advantages`` on the same
reward table, for every ``scale_rewards`` value and both ``multi_objective_aggregation`` modes, by setting
the attributes the method reads (``trainer.scale_rewards``, ``trainer.multi_objective_aggregation``).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_lab import advantages as A
from grpo_lab.rewards import validate_reward


def test_seed_worked_example():
    result = A.group_advantages(A.SEED_EXAMPLE_REWARDS)
    assert result.group_mean == pytest.approx([0.45] * 4)
    std = math.sqrt((0.15**2 + 0.05**2 + 0.05**2 + 0.25**2) / 3)  # Bessel: divide by n - 1
    assert result.std == pytest.approx([std] * 4)
    expected = [d / (std + 1e-4) for d in (0.15, 0.05, 0.05, -0.25)]
    assert result.advantages == pytest.approx(expected, rel=1e-5)
    assert [round(a, 4) for a in result.advantages] == [0.8655, 0.2885, 0.2885, -1.4425]
    assert "group mean   : (0.6 + 0.5 + 0.5 + 0.2) / 4 = 0.45" in A.explain_group()


def test_zero_variance_group_has_no_signal():
    result = A.group_advantages([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], num_generations=4)
    assert result.advantages[4:] == [0.0] * 4
    assert result.is_std_zero == [False] * 4 + [True] * 4 and result.frac_reward_zero_std == 0.5


def test_scale_rewards_values_and_legacy_booleans():
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    none = A.group_advantages(rewards, 4, scale_rewards="none")
    assert none.advantages == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    assert A.group_advantages(rewards, 4, scale_rewards=False).advantages == none.advantages
    assert A.group_advantages(rewards, 4, scale_rewards=True).advantages == A.group_advantages(rewards, 4).advantages
    batch = A.group_advantages(rewards, 4, scale_rewards="batch")
    batch_std = torch.tensor(rewards).std().item()  # sample std over the whole batch, group mean kept
    assert batch.advantages == pytest.approx([a / (batch_std + 1e-4) for a in none.advantages], rel=1e-5)
    with pytest.raises(ValueError, match="scale_rewards must be"):
        A.group_advantages(rewards, 4, scale_rewards="global")


def test_unscorable_completion_gets_zero_and_is_left_out_of_the_mean():
    result = A.compute_advantages([[1.0, None], [None, None], [0.0, 0.5], [0.0, None]], 4, reward_weights=[1.0, 2.0])
    assert math.isnan(result.rewards[1]) and result.advantages[1] == 0.0
    assert result.group_mean[0] == pytest.approx((1.0 + 1.0 + 0.0) / 3)


def test_bad_shapes_are_reported():
    with pytest.raises(ValueError, match="do not split into groups of num_generations=4"):
        A.group_advantages([1.0] * 6, num_generations=4)
    with pytest.raises(ValueError, match="Number of reward weights"):
        A.compute_advantages([[1.0, 0.0]] * 4, 4, reward_weights=[1.0])


# ------------------------------------------------------------------------------------------ equality with TRL


def r0(prompts, completions, **kwargs):
    return kwargs["r0"]


def r1(prompts, completions, **kwargs):
    return kwargs["r1"]


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("abcdefgh ")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=2, reward_weights=[1.0, 0.5], report_to="none", use_cpu=True, bf16=False,
        save_strategy="no",
    )
    dataset = Dataset.from_list([{"prompt": "abc", "r0": 0.0, "r1": 0.0}] * 8)
    reward_funcs = [validate_reward(r0), validate_reward(r1)]  # our wrapper, as a user would pass it
    trainer = GRPOTrainer(
        model=Qwen2ForCausalLM(config), reward_funcs=reward_funcs, args=args, train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.model.train()
    return trainer


def trl_advantages(trainer, table, scale_rewards, aggregation):
    """TRL's advantages for the reward table ``table`` (rows: completions; columns: r0, r1)."""
    trainer.scale_rewards, trainer.multi_objective_aggregation = scale_rewards, aggregation
    batch = [{"prompt": "abc", "r0": a, "r1": b} for a, b in table]
    return trainer._generate_and_score_completions(batch)["advantages"].tolist()


def reward_tables():
    rng = random.Random(4)
    varied = [[round(rng.uniform(-1, 2), 3), rng.choice([0.0, 1.0, None])] for _ in range(8)]
    seed_group = [[r, None] for r in A.SEED_EXAMPLE_REWARDS]
    special = [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0],  # zero-variance group
               [None, None], [0.5, None], [0.0, 1.0], [2.0, 0.0]]  # an unscorable completion
    return {"varied": varied, "seed+zero-variance": seed_group + special[:4], "unscorable": special}


def test_trl_sees_the_validated_reward_names(trl_trainer):
    assert trl_trainer.reward_func_names == ["r0", "r1"]  # validate_reward keeps __name__ for TRL's metrics


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("table_name", list(reward_tables()))
def test_advantages_equal_trl(trl_trainer, table_name, scale_rewards, aggregation):
    table = reward_tables()[table_name]
    theirs = trl_advantages(trl_trainer, table, scale_rewards, aggregation)
    ours = A.compute_advantages(
        table, num_generations=4, reward_weights=[1.0, 0.5], scale_rewards=scale_rewards,
        multi_objective_aggregation=aggregation,
    ).advantages
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-6)


def test_seed_example_equals_trl(trl_trainer):
    table = [[r, None] for r in A.SEED_EXAMPLE_REWARDS] * 2
    theirs = trl_advantages(trl_trainer, table, "group", "sum_then_normalize")
    assert [round(a, 4) for a in theirs[:4]] == [0.8655, 0.2885, 0.2885, -1.4425]
    assert A.group_advantages(A.SEED_EXAMPLE_REWARDS).advantages == pytest.approx(theirs[:4], rel=1e-6)


def test_plots_return_figures():
    from matplotlib.figure import Figure

    from grpo_lab.plots import plot_group_advantages, plot_reward_components
    from grpo_lab.rewards import get_reward, score_all

    result = A.compute_advantages([[0.6], [0.5], [None], [0.2]], 4)
    assert isinstance(plot_group_advantages(result, title="t"), Figure)
    table = score_all([get_reward("correctness"), get_reward("format")], [""] * 2, ["#### 1", "2"], answer=["1", "2"])
    assert isinstance(plot_reward_components(table), Figure)


@pytest.mark.parametrize("table_name", list(reward_tables()))
def test_rewards_weighted_sum_matches_trl_combination(trl_trainer, table_name):
    """grpo_lab.rewards.weighted_sum (one combined reward per completion) feeds the same advantages as TRL's own
    nansum over reward_weights=[1.0, 0.5] with separate reward functions."""
    from grpo_lab.rewards import weighted_sum

    table = reward_tables()[table_name]
    theirs = trl_advantages(trl_trainer, table, "group", "sum_then_normalize")
    ours = A.group_advantages([weighted_sum(row, [1.0, 0.5]) for row in table], num_generations=4).advantages
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-6)


def test_zero_std_groups_are_split_into_all_right_and_all_wrong():
    low, high = A.all_right_share(0.8, 0.63, 8)
    assert math.isclose(low, 0.8 - 0.37 * 7 / 8) and high == 0.63
    # a made-up batch: 5 groups all right, 2 all wrong, 3 mixed; the bounds hold the true all-right share
    rng = random.Random(0)
    groups = [[1.0] * 8] * 5 + [[0.0] * 8] * 2 + [[1.0] * k + [0.0] * (8 - k) for k in (1, 3, 7)]
    rewards = [r for group in rng.sample(groups, len(groups)) for r in group]
    result = A.group_advantages(rewards, num_generations=8)
    low, high = A.all_right_share(sum(rewards) / len(rewards), result.frac_reward_zero_std, 8)
    assert math.isclose(result.frac_reward_zero_std, 0.7) and low <= 0.5 <= high
    assert "between 48% and 63% of all groups were all right" in A.describe_zero_std(0.8, 0.63, 8, binary=True)
    assert "may be all right or all wrong" in A.describe_zero_std(0.5, 0.2, 8, binary=True)
    assert "do not say" in A.describe_zero_std(0.5, 0.2, 8, binary=False)
    with pytest.raises(ValueError):
        A.all_right_share(0.5, 0.5, 1)
