"""benchmarks/verl/run.py on the CPU, before any GPU call: its overrides compose in verl's own config, and every
phase around verl works end to end with a stand-in for verl.

The stand-in is a ``python3`` early on PATH that the export's real ``run_verl.sh`` calls: it reads the Hydra
overrides, scores sampled answers with the export's ``reward_fn.py``, and writes what verl 0.9.1 writes (the file
logger's JSONL, ``rollout_data_dir/<step>.jsonl`` with V1 uids, ``global_step_N/actor`` checkpoints and
``latest_checkpointed_iteration.txt``). The merger's stand-in writes a Hugging Face folder in bfloat16 without a
manifest, as verl's merger does. The deploy phase then runs for real: export, verify, a vLLM server on the CPU.
What runs on the GPU (verl, its merger) is not tested here; benchmarks/verl/README.md says what did.
"""

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_lab import verl_export as V
from grpo_lab.experiment import TrainConfig

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "verl" / "run.py"


def unpacked(out: Path, tmp_path: Path) -> Path:
    """$OUT holds two files, as the device tool brings back at most 8: results.json and the archive of the rest."""
    import tarfile

    assert sorted(p.name for p in out.iterdir()) == ["results.json", "verl-files.tgz"]
    with tarfile.open(out / "verl-files.tgz") as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    return tmp_path / "unpacked" / "verl-files"


def load_run_script(monkeypatch, tmp_path):
    site, work = tmp_path / "site", tmp_path / "work"
    (site / "trl").mkdir(parents=True)
    (site / "trl" / "__init__.py").write_text("")
    monkeypatch.setenv("GRPO_GPU_SITE", str(site))
    monkeypatch.setenv("GRPO_VERL_WORK", str(work))
    spec = importlib.util.spec_from_file_location("verl_run_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------
# The overrides compose in verl's config
# --------------------------------------------------------------------------------------------------
verl_config = V.find_verl_config()


@pytest.mark.skipif(verl_config is None or importlib.util.find_spec("hydra") is None,
                    reason=f"needs verl's config ({V.VERL_SOURCE_ENV}=a verl wheel) and hydra-core")
def test_forced_overrides_and_remedies_compose_after_the_export_in_verls_hydra(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir

    run = load_run_script(monkeypatch, tmp_path)
    export = V.export_verl(tmp_path / "export", TrainConfig(profile="tiny"),
                           V.VerlTarget(device="cuda", n_gpus_per_node=1), validate=False)
    forced = run.forced_overrides(tmp_path / "w", steps=40, save_freq=20) + [r for _, r in run.REMEDIES]
    assert len({o["key"] for o in forced}) == len(forced) and all(o["reason"] for o in forced)
    args = V.override_args(export.absolute_overrides()) + run.hydra_args(forced)
    with initialize_config_dir(config_dir=str(verl_config.config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=args)
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert list(config.trainer.logger) == ["console", "file"]
    assert (config.trainer.total_training_steps, config.trainer.save_freq, config.trainer.test_freq) == (40, 20, 40)
    assert config.trainer.rollout_data_dir == str(tmp_path / "w" / "rollouts")
    assert config.trainer.resume_mode == "disable" and config.trainer.use_v1 is False
    assert config.actor_rollout_ref.rollout.agent.num_workers == 1 and config.reward.num_workers == 1
    assert config.actor_rollout_ref.rollout.enforce_eager is True
    assert config.actor_rollout_ref.model.use_remove_padding is False
    # the export's own settings are untouched by the forced ones
    assert config.trainer.n_gpus_per_node == 1 and config.actor_rollout_ref.rollout.n == 8
    assert config.data.train_batch_size == 4 and config.actor_rollout_ref.rollout.name == "vllm"
    assert config.reward.custom_reward_function.path == str(export.folder.resolve() / V.REWARD_FILE)
    overridden = {o["key"].lstrip("+") for o in forced} & set(export.overrides)
    assert overridden == {"trainer.logger", "trainer.total_training_steps", "trainer.save_freq", "trainer.test_freq"}


# --------------------------------------------------------------------------------------------------
# The phases around verl, with stand-ins for verl and its merger
# --------------------------------------------------------------------------------------------------
FAKE_VERL = textwrap.dedent('''
    """Stand-in for `python3 -m verl.trainer.main_ppo k=v ...`: writes the files verl 0.9.1 writes."""
    import importlib.util, json, os, random, struct, sys, uuid
    from pathlib import Path
    import pyarrow.parquet as pq
    import torch

    assert sys.argv[1:3] == ["-m", "verl.trainer.main_ppo"], sys.argv
    kv = {}
    for arg in sys.argv[3:]:
        key, value = arg.split("=", 1)
        kv[key.lstrip("+")] = value.strip("'")
    site = Path(os.environ["GRPO_GPU_SITE"])
    assert not (site / "trl").exists() and (site / "trl.off").is_dir(), "TRL must be aside while verl runs"
    assert kv["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    spec = importlib.util.spec_from_file_location("reward", kv["reward.custom_reward_function.path"])
    reward = importlib.util.module_from_spec(spec); spec.loader.exec_module(reward)
    compute_score = getattr(reward, kv["reward.custom_reward_function.name"])
    rows = pq.read_table(kv["data.train_files"]).to_pylist()
    steps, save = int(kv["trainer.total_training_steps"]), int(kv["trainer.save_freq"])
    n, prompts = int(kv["actor_rollout_ref.rollout.n"]), int(kv["data.train_batch_size"])
    dumps, ckpt = Path(kv["trainer.rollout_data_dir"]), Path(kv["trainer.default_local_dir"])
    logger = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)
    log = lambda step, data: logger.write((json.dumps({"step": step, "data": data}) + "\\n").encode())
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
    rng = random.Random(0)
    log(0, {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.1})
    for step in range(1, steps + 1):
        lines = []
        for row in rng.sample(rows, prompts):
            uid, gt = str(uuid.UUID(int=rng.getrandbits(128))), row["reward_model"]["ground_truth"]
            for session in range(n):
                text = rng.choice([f"#### {gt}", "#### 0", "", "答案 #### ７"]) if step > 1 else "#### 0"
                score = f32(compute_score(row["data_source"], text, gt, row["extra_info"])["score"])
                lines.append({"input": row["prompt"][0]["content"], "output": text, "gts": gt, "score": score,
                              "step": step, "uid": f"{uid}_{session}_0"})
        lines.sort(key=lambda r: r["uid"])
        groups = {}
        for r in lines:
            groups.setdefault(r["uid"].rsplit("_", 2)[0], []).append(r["score"])
        advantages = []
        for scores in groups.values():
            t = torch.tensor(scores)
            advantages += ((t - t.mean()) / (t.std() + 1e-6)).tolist()
        dumps.mkdir(parents=True, exist_ok=True)
        (dumps / f"{step}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\\n" for r in lines))
        log(step, {"critic/score/mean": sum(r["score"] for r in lines) / len(lines),
                   "critic/advantages/max": max(advantages), "critic/advantages/min": min(advantages),
                   "timing_s/gen": 0.5, "timing_s/reward": 0.01, "timing_s/update_actor": 0.2,
                   "timing_s/old_log_prob": 0.05, "timing_s/update_weights": 0.1, "timing_s/step": 1.0})
        if step % save == 0 or step == steps:
            actor = ckpt / f"global_step_{step}" / "actor"
            (actor / "huggingface").mkdir(parents=True, exist_ok=True)
            (actor / "model_world_size_1_rank_0.pt").write_bytes(b"stand-in")
            (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))
    log(steps, {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.2})
    print("stand-in verl: done")
''')

FAKE_MERGER = textwrap.dedent('''
    """Stand-in for verl's model merger: the tiny model with moved weights, in bfloat16, without a manifest."""
    import json, shutil, sys
    from pathlib import Path
    import torch
    from safetensors.torch import load_file, save_file

    actor, target, base = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    assert (actor / "model_world_size_1_rank_0.pt").is_file()
    target.mkdir(parents=True)
    weights = load_file(str(base / "model.safetensors"))
    moved = {k: (v.float() + 0.01 * torch.sign(v.float())).to(torch.bfloat16).contiguous() for k, v in weights.items()}
    save_file(moved, str(target / "model.safetensors"), metadata={"format": "pt"})
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(base / name, target / name)
    config = json.loads((base / "config.json").read_text())
    config["dtype"] = "bfloat16"  # as verl's merger writes it
    (target / "config.json").write_text(json.dumps(config, indent=2))
''')


def install_stand_ins(monkeypatch, tmp_path, run) -> None:
    """The stand-ins for verl (a ``python3`` first on PATH) and for its model merger."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "fake_verl.py").write_text(FAKE_VERL)
    (stubs / "fake_merger.py").write_text(FAKE_MERGER)
    (stubs / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} {stubs / "fake_verl.py"} "$@"\n')
    (stubs / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GRPO_GPU_SITE", str(run.SITE))  # the stand-in checks that TRL is aside
    base = REPO / "data" / "models" / "tiny-qwen2"
    monkeypatch.setattr(run, "merge_command", lambda actor, target: [
        sys.executable, str(stubs / "fake_merger.py"), str(actor), str(target), str(base)])


@pytest.mark.slow
def test_every_phase_around_verl_runs_and_reports(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    install_stand_ins(monkeypatch, tmp_path, run)
    out = tmp_path / "out"

    code = run.main(["tiny", "merge", "deploy", "--out", str(out), "--steps", "4", "--budget-s", "900"])

    results = json.loads((out / "results.json").read_text())
    phases = {name: record["status"] for name, record in results["phases"].items()}
    assert phases == {"tiny": "ok", "merge": "ok", "deploy": "ok"}, results["phases"]
    assert code == 0 and (run.SITE / "trl").is_dir() and not (run.SITE / "trl.off").exists()
    assert results["steps_completed"] == 4 and results["reward_parity_max_abs_diff"] == 0.0
    assert results["advantage_parity_max_abs_diff"] < 1e-5 and results["merged_checkpoint_verified"] is True
    tiny = results["tiny"]
    assert tiny["checkpoint"]["step"] == 4 and tiny["checkpoint"]["latest_checkpointed_iteration"] == "4"
    assert tiny["parity"]["reward"]["completions"] == 4 * 4 * 8 and tiny["parity"]["reward"]["equal"] is True
    assert tiny["parity"]["advantage_last_batch"]["agrees"] is True and tiny["parity"]["reward"]["mismatches"] == []
    assert tiny["validation"] == {"0": {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.1},
                                  "4": {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.2}}
    assert tiny["timings"]["median"]["update_like"] == pytest.approx(0.49)
    assert [o["key"] for o in tiny["attempts"][0]["forced_overrides"]] == [
        o["key"] for o in run.forced_overrides(tmp_path, 4, 2)]
    files = unpacked(out, tmp_path)
    assert (files / "tiny" / "metrics.jsonl").is_file()
    assert len(list((files / "tiny" / "rollouts").glob("*.jsonl"))) == 4
    assert (files / "tiny" / "export_run_verl.sh").is_file() and (files / "tiny" / "verl_attempt1.log").is_file()
    deploy = results["deploy"]
    assert deploy["verify_export"]["ok"] and deploy["same_tensors"] and deploy["answered"]
    assert "manifest.json" in deploy["verify_merged_as_written"]  # verl's merger writes no manifest: export first
    assert deploy["change_from_base"]["tensors_changed_beyond_bf16_rounding"] > 0
    assert (files / "deploy" / "server.log").is_file() and (files / "results.json").is_file()



def test_smollm2_runs_the_trl_recipe_through_the_export(monkeypatch, tmp_path):
    import shutil

    state = tmp_path / "smollm2"
    shutil.copytree(REPO / "data" / "models" / "tiny-qwen2", state / "model")  # stands in for the converted SmolLM2
    (state / "model" / "manifest.json").unlink()  # which, like any outside model, has no course manifest
    monkeypatch.setenv("GRPO_SMOLLM2_STATE", str(state))
    run = load_run_script(monkeypatch, tmp_path)
    install_stand_ins(monkeypatch, tmp_path, run)
    out = tmp_path / "out"

    code = run.main(["smollm2", "--out", str(out), "--smollm2-steps", "2", "--budget-s", "900", "--skip-val-before"])

    results = json.loads((out / "results.json").read_text())
    assert code == 0 and results["phases"]["smollm2"]["status"] == "ok", results["phases"]
    smollm2 = results["smollm2"]
    assert smollm2["steps_completed"] == 2 and smollm2["checkpoint"]["step"] == 2
    assert smollm2["reward_parity_max_abs_diff"] == 0.0 and smollm2["parity"]["reward"]["completions"] == 2 * 16 * 8
    assert smollm2["attempts"][0]["forced_overrides"][-1] == {
        "key": "trainer.val_before_train", "value": False,
        "reason": "time: the validation before training was measured in an earlier call"}
    overrides = smollm2["export"]["overrides"]
    assert overrides["data.train_batch_size"] == 16 and overrides["actor_rollout_ref.rollout.n"] == 8
    assert overrides["data.max_response_length"] == 256 and overrides["actor_rollout_ref.actor.optim.lr"] == 2e-5
    rows = [json.loads(line) for line in (state / "train_en.jsonl").read_text().splitlines()]
    assert rows and {row["lang"] for row in rows} == {"en"}
    assert smollm2["export"]["train_rows"] == len(rows)
    assert (run.SITE / "trl").is_dir() and not (run.SITE / "trl.off").exists()


def test_smollm2_at_verls_best_settings_overrides_the_constrained_ones(monkeypatch, tmp_path):
    """Issue 26: the same SmolLM2 export with verl's own performance settings, each after the constrained value it
    replaces (Hydra: the later value wins), every one with its reason; padding removal stays verl's default (on) with or
    without flash-attn; the start is reported apart from the steps."""
    import shutil

    state = tmp_path / "smollm2"
    shutil.copytree(REPO / "data" / "models" / "tiny-qwen2", state / "model")
    (state / "model" / "manifest.json").unlink()
    monkeypatch.setenv("GRPO_SMOLLM2_STATE", str(state))
    run = load_run_script(monkeypatch, tmp_path)
    install_stand_ins(monkeypatch, tmp_path, run)
    out = tmp_path / "out"

    code = run.main(["smollm2-best", "--out", str(out), "--smollm2-steps", "2", "--budget-s", "900"])

    results = json.loads((out / "results.json").read_text())
    assert code == 0 and results["phases"]["smollm2-best"]["status"] == "ok", results["phases"]
    best = results["smollm2_best"]
    forced = best["attempts"][0]["forced_overrides"]
    keys = [o["key"] for o in forced]
    assert all(o["reason"] for o in forced)
    for key, value in (("actor_rollout_ref.rollout.enforce_eager", False), ("reward.num_workers", 8),
                       ("actor_rollout_ref.rollout.agent.num_workers", 8),
                       ("actor_rollout_ref.actor.use_torch_compile", True)):
        constrained, chosen = keys.index(key), len(keys) - 1 - keys[::-1].index(key)
        assert constrained < chosen and forced[chosen]["value"] == value, key
    # padding removal stays verl's default (on): verl 0.9.1 has pure-torch fallbacks where flash-attn is missing
    assert "actor_rollout_ref.model.use_remove_padding" not in keys
    assert best["steps_completed"] == 2 and best["startup_s"] is not None and best["startup_s"] >= 0


def test_a_failing_verl_is_recorded_with_its_log_and_the_call_goes_on(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python3").write_text("#!/bin/sh\necho 'ImportError: cannot import name X from transfer_queue' >&2\n"
                                   "exit 3\n")
    (stubs / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    code = run.main(["tiny", "merge", "--out", str(out), "--steps", "2", "--budget-s", "900"])
    results = json.loads((out / "results.json").read_text())
    assert code == 1 and results["phases"]["tiny"]["status"] == "failed"
    assert "transfer_queue" in results["phases"]["tiny"]["log_tail"]
    attempts = results["tiny"]["attempts"]
    assert len(attempts) == 2 and attempts[0]["next"] == "retry with trainer.use_v1=False"
    assert attempts[1]["forced_overrides"][-1]["key"] == "trainer.use_v1"
    merge = results["phases"]["merge"]
    assert merge["status"] == "failed" and "no verl checkpoint" in merge["error"]
    assert results["steps_completed"] == 0 and results["merged_checkpoint_verified"] is False
    assert (run.SITE / "trl").is_dir() and not (run.SITE / "trl.off").exists()


def test_a_verl_that_hangs_is_stopped_with_everything_it_started(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    log = tmp_path / "hang.log"
    pid_file = tmp_path / "grandchild.pid"
    script = (f"import subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              f"time.sleep(600)\n")
    done = run.run_logged([sys.executable, "-c", script], log, timeout_s=4, env=dict(os.environ))
    assert done["timed_out"] and done["seconds"] < 60
    grandchild = int(pid_file.read_text())
    import psutil

    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_served_weights_count_as_the_merged_ones_when_only_the_dtype_differs(monkeypatch, tmp_path):
    import torch
    from safetensors.torch import save_file

    run = load_run_script(monkeypatch, tmp_path)
    weights = {"w": torch.tensor([0.1, -2.5, 3.0]).to(torch.bfloat16)}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        (tmp_path / name).mkdir()
        save_file({k: v.to(dtype) for k, v in weights.items()}, str(tmp_path / name / "model.safetensors"))
    (tmp_path / "other").mkdir()
    save_file({"w": torch.tensor([0.1, -2.5, 3.5])}, str(tmp_path / "other" / "model.safetensors"))
    assert run.same_values(tmp_path / "bf16", tmp_path / "fp32")
    assert not run.same_values(tmp_path / "bf16", tmp_path / "other")
    change = run.weight_change(tmp_path / "fp32", tmp_path / "other")
    assert change["max_abs_change"] == pytest.approx(0.5) and change["tensors_changed_beyond_bf16_rounding"] == 1


def _fake_transformers_wheel(folder: Path, body: str) -> None:
    import hashlib
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "transformers-5.10.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("transformers/__init__.py", body)
        archive.writestr("transformers-5.10.4.dist-info/METADATA", "Name: transformers\nVersion: 5.10.4\n")
    (folder / "SHA256").write_text(f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  ./{wheel.name}\n")


@pytest.mark.parametrize("body, chosen", [('__version__ = "5.10.4-carried"\n', "verl-transformers ahead"),
                                          ("raise ImportError('broken on purpose')\n", "image transformers")])
def test_env_puts_the_carried_transformers_ahead_only_when_they_import(monkeypatch, tmp_path, body, chosen):
    import transformers

    monkeypatch.setenv("GRPO_VERL_TRANSFORMERS", str(tmp_path / "verl-transformers"))
    run = load_run_script(monkeypatch, tmp_path)
    monkeypatch.setattr(run, "IMPORT_CHECK", 'import json, transformers\nprint("IMPORT-CHECK " + json.dumps('
                        '{m: transformers.__version__ for m in ("transformers", "vllm", "verl", "ray")}))\n')
    _fake_transformers_wheel(tmp_path / "carried", body)
    out = tmp_path / "out"
    code = run.main(["env", "--out", str(out), "--verl-transformers", str(tmp_path / "carried")])
    results = json.loads((out / "results.json").read_text())
    choice = results["verl_transformers"]
    assert code == 0 and choice["label"] == chosen and choice["carried"]["found"]
    expected = "5.10.4-carried" if chosen.startswith("verl") else transformers.__version__
    assert choice["versions"]["transformers"] == expected and choice["ahead"] is chosen.startswith("verl")
    assert (unpacked(out, tmp_path) / "env" / "distributions.txt").read_text().count("==") > 50
    env = run.verl_env(run.Run(out, 100, fresh=False))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == (str(run.VERL_TRANSFORMERS) if choice["ahead"] else str(run.SITE))


def test_env_refuses_carried_wheels_whose_checksum_is_wrong(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_VERL_TRANSFORMERS", str(tmp_path / "verl-transformers"))
    run = load_run_script(monkeypatch, tmp_path)
    _fake_transformers_wheel(tmp_path / "carried", "__version__ = 'x'\n")
    (tmp_path / "carried" / "SHA256").write_text("0" * 64 + "  ./transformers-5.10.4-py3-none-any.whl\n")
    found = run.unpack_transformers(tmp_path / "carried")
    assert not found["found"] and "sha256" in found["why"]
    assert not run.unpack_transformers(tmp_path / "nothing")["found"]


def test_an_archive_over_the_cap_keeps_the_tails_of_the_logs(monkeypatch, tmp_path):
    import tarfile

    run = load_run_script(monkeypatch, tmp_path)
    monkeypatch.setattr(run, "ARCHIVE_CAP_BYTES", 1000)
    state = run.Run(tmp_path / "out", 60, fresh=True)
    (state.files / "tiny").mkdir()
    (state.files / "tiny" / "verl.log").write_text("".join(f"line {i} {os.urandom(8).hex()}\n" for i in range(5000)))
    state.save()
    with tarfile.open(tmp_path / "out" / run.FILES_ARCHIVE) as archive:
        names = archive.getnames()
        last = archive.extractfile("verl-files/tiny/verl.log.tail").read().decode().splitlines()[-1]
    assert "verl-files/tiny/verl.log" not in names and "verl-files/results.json" in names
    assert last.startswith("line 4999 ")


def test_the_readme_names_every_forced_override_and_the_call_sequence(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    readme = (REPO / "benchmarks" / "verl" / "README.md").read_text()
    for override in run.forced_overrides(Path("<work>"), steps=30, save_freq=15):
        assert f"`{override['key']}=" in readme, override["key"]
    assert "python3 benchmarks/verl/run.py --out $OUT" in readme and "B/verl-transformers" in readme


def test_no_phases_named_runs_the_default_ones(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    ran = []
    for name in run.DEFAULT_PHASES:
        monkeypatch.setattr(run, f"phase_{name}", lambda r, args, name=name: ran.append(name))
    code = run.main(["--out", str(tmp_path / "out")])
    assert ran == list(run.DEFAULT_PHASES) and code == 0


def test_a_fresh_machine_continues_from_the_committed_results(monkeypatch, tmp_path):
    run = load_run_script(monkeypatch, tmp_path)
    committed = REPO / "benchmarks" / "verl" / "results.json"
    state = run.Run(tmp_path / "out", 60, fresh=False, earlier=committed)
    assert state.results["tiny"] == json.loads(committed.read_text())["tiny"]
    assert len(state.results["calls"]) == len(json.loads(committed.read_text())["calls"]) + 1
    state.results["trl"] = {"median_after_2_warmup_steps": {"step_s": 1.0, "generation_s": 0.5, "reward_s": 0.01,
                                                            "update_s": 0.4}}
    run.summarise(state)
    rows = state.results["comparison"]["rows"]
    assert rows["step"]["trl_colocate_s"] == 1.0 and rows["step"]["verl_s"] == state.results["tiny"]["timings"][
        "median"]["step_s"]
    state.save()
    again = run.Run(tmp_path / "out", 60, fresh=False, earlier=None)  # the same machine: its own file wins
    assert again.results["comparison"] == state.results["comparison"]
