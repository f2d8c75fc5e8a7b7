"""grpo_lab.verl_export: the export round-trips (parquet, overrides, reward module, launch script), bad targets
stop early, and the overrides pass verl's own config schema wherever verl's config files can be found.

verl itself is never run here. The schema tests skip unless verl is installed or ``GRPO_LAB_VERL_SOURCE`` names
a verl wheel or checkout (``pip download verl --no-deps``); no verl file is kept in this repository.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from grpo_lab import rewards as R
from grpo_lab import verl_export as V
from grpo_lab.verl_export import schema
from grpo_lab.data import load_split
from grpo_lab.experiment import TrainConfig, load_train_rows

REWARDS = ("correctness", "format", "repetition_penalty")
WEIGHTS = (1.0, 0.2, 0.5)


@pytest.fixture(scope="module")
def gpu_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl") / "gpu"
    return V.export_verl(folder, TrainConfig(profile="gpu"), V.VerlTarget(device="cuda", n_gpus_per_node=8),
                         validate=False)


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl") / "tiny"
    config = TrainConfig(profile="tiny", rewards=REWARDS, reward_weights=WEIGHTS)
    return V.export_verl(folder, config, V.VerlTarget(n_gpus_per_node=1), validate=False)


@pytest.fixture(scope="module")
def npu_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl") / "npu"
    target = V.VerlTarget(device="npu", n_gpus_per_node=8, rollout_tensor_parallel_size=2)
    return V.export_verl(folder, TrainConfig(profile="npu"), target, validate=False)


# --------------------------------------------------------------------------------------------------
# Round trip: what was written reads back as the experiment
# --------------------------------------------------------------------------------------------------
def test_parquet_reads_back_as_the_experiment_rows_in_verl_format(tiny_export):
    loaded = V.load_export(tiny_export.folder)
    expected = load_train_rows(V.resolve_experiment(TrainConfig(profile="tiny")))
    assert len(loaded.train_rows) == len(expected) == tiny_export.num_train_rows
    assert loaded.train_rows == V.verl_rows(expected, "train")
    row, source = loaded.train_rows[0], expected[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"] == source["prompt"] and row["prompt"][0]["role"] == "user"
    assert row["reward_model"] == {"style": "rule", "ground_truth": source["answer"]}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    assert row["extra_info"]["type"] == source["type"] and row["data_source"] == V.DATA_SOURCE
    assert len(loaded.test_rows) == 200 and loaded.test_rows[5]["reward_model"]["ground_truth"] == \
        load_split("eval")[5]["answer"]


def test_overrides_read_back_with_the_grpo_settings(gpu_export):
    loaded = V.load_export(gpu_export.folder)
    assert loaded.overrides == gpu_export.absolute_overrides()
    o = loaded.overrides
    assert o["algorithm.adv_estimator"] == "grpo"
    assert o["actor_rollout_ref.actor.use_kl_loss"] is True
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert o["actor_rollout_ref.actor.kl_loss_coef"] == 0.04
    assert o["actor_rollout_ref.rollout.n"] == 8
    assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 1
    assert o["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.3
    assert (o["trainer.n_gpus_per_node"], o["trainer.nnodes"], o["trainer.device"]) == (8, 1, "cuda")
    assert o["data.train_batch_size"] == 128 * 8 // 8 == o["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 128
    assert o["actor_rollout_ref.actor.optim.lr"] == 2e-5 and o["trainer.total_training_steps"] == 300
    assert o["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    for key in V.PATH_KEYS:
        assert os.path.isabs(o[key]) and os.path.isfile(o[key])
    manifest = loaded.manifest
    assert manifest["experiment"]["num_generations"] == 8 and manifest["verl_run"] == "not run by grpo_lab"
    assert manifest["schema_check"]["ok"] is None  # validate=False


def test_tiny_profile_has_no_kl_term_and_a_constant_learning_rate(tiny_export):
    o = tiny_export.overrides
    assert o["actor_rollout_ref.actor.use_kl_loss"] is False and o["actor_rollout_ref.actor.kl_loss_coef"] == 0.0
    assert o["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "constant"
    assert o["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"] == 0.0
    assert o["actor_rollout_ref.rollout.n"] == 8 and o["data.train_batch_size"] == 32 // 8
    assert o["trainer.device"] == "cuda"  # the CPU profile's experiment, exported for a GPU


def test_reward_module_scores_like_grpo_lab_in_a_python_without_grpo_lab(tiny_export):
    rows = load_split("eval")[:12]
    cases = []
    for row in rows:
        for text in (row["completion"], "#### 99999", row["completion"].split("####")[0],
                     "7 7 7 7 7 7 7 7 7 7 #### 7 #### 7"):
            cases.append({"text": text, "answer": row["answer"], "extra": {"type": row["type"], "lang": row["lang"],
                                                                           "num_turns": None}})
    script = ("import importlib.util, json, sys\n"
              "spec = importlib.util.spec_from_file_location('reward', sys.argv[1])\n"
              "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
              "print(json.dumps([module.compute_score('grpo_lab/arithmetic', c['text'], c['answer'], c['extra'])\n"
              "                  for c in json.load(sys.stdin)]))\n")
    # -I -S: no site-packages, so neither grpo_lab nor anything else installed can be imported
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script, str(tiny_export.folder / V.REWARD_FILE)],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=60, check=True)
    scored = json.loads(done.stdout)
    funcs = [R.get_reward(name) for name in REWARDS]
    table = R.score_all(funcs, [""] * len(cases), [c["text"] for c in cases], WEIGHTS,
                        answer=[c["answer"] for c in cases])
    assert [s["score"] for s in scored] == pytest.approx(table.totals)
    assert [s["correctness"] for s in scored] == [s["acc"] for s in scored] == [v[0] for v in table.values]
    assert {s["correctness"] for s in scored} == {0.0, 1.0}
    in_process = V.load_export(tiny_export.folder).compute_score
    assert in_process("x", cases[0]["text"], cases[0]["answer"]) == scored[0]


def test_snapshot_is_grpo_labs_reward_module_byte_for_byte(tiny_export):
    snapshot = (tiny_export.folder / V.REWARDS_SNAPSHOT).read_bytes()
    assert snapshot == open(R.__file__, "rb").read()
    manifest = json.loads((tiny_export.folder / V.MANIFEST_FILE).read_text())
    assert set(manifest["files"]) >= {V.TRAIN_FILE, V.TEST_FILE, V.REWARD_FILE, V.REWARDS_SNAPSHOT, V.LAUNCH_FILE}


def _run_launch_script(export, tmp_path, *extra, env=None):
    """Run run_verl.sh with a stand-in python3 that records its arguments and environment."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "python3"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD.args"\nenv > "$RECORD.env"\n')
    stub.chmod(0o755)
    record = tmp_path / "record"
    environment = {**os.environ, **(env or {}), "PATH": f"{stub_dir}:{os.environ['PATH']}", "RECORD": str(record)}
    environment.pop("MODEL_PATH", None)
    subprocess.run(["bash", str(export.folder / V.LAUNCH_FILE), *extra], env=environment, check=True, timeout=30,
                   capture_output=True, text=True)
    args = record.with_suffix(".args").read_text().splitlines()
    variables = dict(line.split("=", 1) for line in record.with_suffix(".env").read_text().splitlines() if "=" in line)
    return args, variables


def test_launch_script_passes_every_override_and_the_ascend_variables(npu_export, tmp_path):
    args, env = _run_launch_script(npu_export, tmp_path, "trainer.total_epochs=1",
                                   env={"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    assert args[:2] == ["-m", "verl.trainer.main_ppo"] and args[-1] == "trainer.total_epochs=1"
    passed = dict(arg.split("=", 1) for arg in args[2:-1])
    absolute = npu_export.absolute_overrides()
    assert list(passed) == list(absolute)
    for key, value in absolute.items():
        expected = f"'{value}'" if key in (*V.PATH_KEYS, V.MODEL_KEY) else V.hydra_value(value)
        assert passed[key] == expected, key
    assert passed["trainer.device"] == "npu" and passed["actor_rollout_ref.rollout.enable_chunked_prefill"] == "False"
    assert passed["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["HCCL_CONNECT_TIMEOUT"] == "1500"
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"  # verl's Ascend quick start and FAQ
    assert "PYTORCH_NPU_ALLOC_CONF" not in env  # vllm-ascend's sleep mode refuses expandable segments
    assert V.parse_launch_overrides((npu_export.folder / V.LAUNCH_FILE).read_text()).keys() == absolute.keys()


def test_launch_script_takes_model_path_and_cuda_devices_from_the_environment(gpu_export, tmp_path):
    args, env = _run_launch_script(gpu_export, tmp_path, env={"MODEL_PATH_UNUSED": "1"})
    assert f"{V.MODEL_KEY}='Qwen/Qwen2.5-0.5B-Instruct'" in args
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and "ASCEND_RT_VISIBLE_DEVICES" not in env
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" not in env  # Ray sets CUDA_VISIBLE_DEVICES per worker
    script = (gpu_export.folder / V.LAUNCH_FILE).read_text()
    assert 'MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}"' in script and "Ascend" not in script


def test_ascend_ray_variable_comes_from_the_device_table_and_yields_to_the_user(npu_export, tmp_path):
    from grpo_lab import device

    assert device.ray_worker_env("npu") == {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}
    assert device.ray_worker_env("cuda") == {} == device.ray_worker_env("cpu")
    _, env = _run_launch_script(npu_export, tmp_path, env={"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "0"
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1" in (npu_export.folder / V.README_FILE).read_text()


def test_loaded_export_gives_the_reward_set_compute_score_uses(tiny_export):
    loaded = V.load_export(tiny_export.folder)
    reward_set = loaded.reward_set()
    assert reward_set.names == list(REWARDS) and reward_set.weights == list(WEIGHTS)
    row = loaded.train_rows[0]
    text = f"... #### {row['reward_model']['ground_truth']}"
    total = reward_set.score([""], [text], answer=[row["reward_model"]["ground_truth"]]).totals[0]
    assert loaded.compute_score(row["data_source"], text, row["reward_model"]["ground_truth"],
                                row["extra_info"])["score"] == total


def test_readme_says_verl_was_not_run_and_explains_each_setting(npu_export):
    readme = (npu_export.folder / V.README_FILE).read_text()
    assert "has not run verl" in readme and "NOT checked" in readme
    assert "ASCEND_RT_VISIBLE_DEVICES" in readme and "PYTORCH_NPU_ALLOC_CONF" in readme
    for key in npu_export.overrides:
        assert f"`{key}`" in readme


@pytest.mark.parametrize("value, text", [(True, "True"), (5e-06, "5e-06"), (8, "8"), (None, "null"),
                                         ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
                                         ("a b", "'a b'"), ("true", "'true'"), ("1e3", "'1e3'"),
                                         (["console", "wandb"], "[console,wandb]")])
def test_hydra_values(value, text):
    assert V.hydra_value(value) == text


# --------------------------------------------------------------------------------------------------
# Bad input stops early, nothing written
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, target, match", [
    (dict(profile="gpu"), dict(n_gpus_per_node=8, rollout_tensor_parallel_size=3), "Use one of"),
    (dict(profile="gpu"), dict(device="cpu"), "verl trains on"),
    (dict(profile="gpu", loss_type="cispo"), dict(n_gpus_per_node=1), "no verl equivalent"),
    (dict(profile="gpu", scale_rewards="batch"), dict(n_gpus_per_node=1), "scale_rewards"),
    (dict(profile="gpu", lr_scheduler_type="linear"), dict(n_gpus_per_node=1), "lr_scheduler_type"),
    (dict(profile="gpu", train_size=3), dict(n_gpus_per_node=8), "fewer than one step"),
    (dict(profile="gpu", num_generations=3), dict(n_gpus_per_node=1), "does not divide"),
    (dict(profile="gpu", rewards=("nope",)), dict(n_gpus_per_node=1), "Unknown reward"),
])
def test_bad_experiments_and_targets_stop_before_writing(tmp_path, config, target, match):
    with pytest.raises(ValueError, match=match):
        V.export_verl(tmp_path / "out", TrainConfig(**config), V.VerlTarget(**target), validate=False)
    assert not (tmp_path / "out").exists()


def test_export_never_overwrites_without_being_asked(tmp_path, gpu_export):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError):
            V.export_verl(foreign, TrainConfig(profile="gpu"), V.VerlTarget(n_gpus_per_node=1), overwrite=overwrite)
    assert (foreign / "mine.txt").read_text() == "keep"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        V.export_verl(gpu_export.folder, TrainConfig(profile="gpu"), V.VerlTarget(n_gpus_per_node=8))
    with pytest.raises(FileNotFoundError, match="not a verl export"):
        V.load_export(foreign)


def test_cli_writes_an_export_and_says_verl_was_not_run(tmp_path, capsys):
    code = V.main(["--out", str(tmp_path / "cli"), "--profile", "gpu", "--gpus", "2", "--max-steps", "10"])
    out = capsys.readouterr().out
    assert code in (0, 1) and "not run here" in out and "schema:" in out
    assert V.load_export(tmp_path / "cli").overrides["trainer.total_training_steps"] == 10
    assert V.main(["--out", str(tmp_path / "bad"), "--profile", "gpu", "--gpus", "2", "--tp", "3"]) == 2
    assert "Use one of" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# verl's own schema
# --------------------------------------------------------------------------------------------------
def test_validator_skips_cleanly_when_verl_is_nowhere(monkeypatch, gpu_export):
    monkeypatch.setattr(schema, "find_verl_config", lambda source=None: None)  # where validate_overrides looks
    check = V.validate_overrides(gpu_export.absolute_overrides())
    assert check.ok is None and V.VERL_SOURCE_ENV in check.skipped and "NOT checked" in check.summary()


def test_validator_lists_every_unknown_key_of_a_config_folder(tmp_path, monkeypatch):
    # a stand-in config folder with verl's file names, not verl's files
    config_dir = tmp_path / "verl" / "trainer" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / "ppo_trainer.yaml").write_text("trainer:\n  nnodes: 1\n")
    (config_dir / "_generated_ppo_trainer.yaml").write_text("trainer:\n  nnodes: 1\n  device: cuda\n")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, _real=importlib.util.find_spec: None if name == "hydra" else _real(name, *a))
    check = V.validate_overrides({"trainer.nnodes": 2, "trainer.devices": "npu", "trainer.x.y": 1},
                                 source=tmp_path)
    assert check.ok is False and check.methods == ["keys of _generated_ppo_trainer.yaml"]
    assert check.problems == ["trainer.devices is not a verl config key", "trainer.x.y is not a verl config key"]
    with pytest.raises(FileNotFoundError, match=V.VERL_SOURCE_ENV):
        V.find_verl_config(tmp_path / "trainer")


verl_config = V.find_verl_config()
needs_verl_config = pytest.mark.skipif(verl_config is None, reason=(
    f"verl's config files not found (install verl, or set {V.VERL_SOURCE_ENV} to a wheel from "
    "`pip download verl --no-deps`)"))


@needs_verl_config
@pytest.mark.parametrize("name", ["gpu_export", "npu_export", "tiny_export"])
def test_every_exported_key_exists_in_verls_config(name, request):
    export = request.getfixturevalue(name)
    check = V.validate_overrides(export.absolute_overrides())
    assert check.ok, check.problems
    assert check.verl_version == verl_config.version


@needs_verl_config
def test_verls_schema_rejects_a_key_it_does_not_have(gpu_export):
    check = V.validate_overrides({**gpu_export.absolute_overrides(), "actor_rollout_ref.rollout.nn": 4})
    assert check.ok is False and any("actor_rollout_ref.rollout.nn" in p for p in check.problems)


# origin None: no verl, or only a folder named verl on the path (benchmarks/verl, with benchmarks/ on PYTHONPATH)
@pytest.mark.skipif(getattr(importlib.util.find_spec("verl"), "origin", None) is None
                    or importlib.util.find_spec("hydra") is None,
                    reason="verl's validate_config needs verl (and hydra-core) importable")
def test_verls_validate_config_accepts_the_batch_arithmetic(npu_export):
    check = V.validate_overrides(npu_export.absolute_overrides(), deep=True)
    assert check.ok, check.problems
    assert "verl.utils.config.validate_config" in check.methods


@needs_verl_config
@pytest.mark.skipif(importlib.util.find_spec("hydra") is None, reason="needs hydra-core to compose verl's config")
def test_launch_script_arguments_compose_in_verls_hydra(npu_export, tmp_path):
    from hydra import compose, initialize_config_dir

    args, _ = _run_launch_script(npu_export, tmp_path)
    with initialize_config_dir(config_dir=str(verl_config.config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=args[2:])
    assert config.data.train_files == str(npu_export.folder.resolve() / V.TRAIN_FILE)
    assert config.actor_rollout_ref.rollout.n == 8 and config.actor_rollout_ref.actor.optim.lr == 2e-5
    assert list(config.trainer.logger) == ["console"] and config.trainer.device == "npu"
