"""verl's GRPO trainer on the course's exported experiment, on one GPU (issue 17), in one device call.

Runs on the lent GPU machine once the combined bundle (``build.sh``) is assembled into ``/tmp/grpo-gpu-site``:

    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/verl/run.py --out $OUT
    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/verl/run.py trl --out $OUT --budget-s 400   # optional

Phases (default ``env tiny merge deploy``; ``report`` always runs last). Each is recorded in ``results.json`` with
its status, seconds and, on failure, the error and the log's tail; a failed phase does not stop the phases that do
not need it. Every child process runs in a session of its own under a hard timeout and is stopped with everything
it started (Ray, vLLM) before the next phase; nothing is left running.

    env      versions, the image's distributions, and which transformers verl runs with: the wheels carried in
             ``verl-transformers/`` (5.10.4, inside verl's declared range) ahead of the image's on PYTHONPATH when
             verl, vLLM and the merger import with them, else the image's 5.17
    tiny     ``grpo_lab.verl_export`` of the tiny profile for 1 GPU, then verl ``main_ppo`` with the export's
             overrides plus ``forced_overrides()`` (each with its reason); metrics, rollouts, reward and advantage
             parity on every logged batch. TRL is moved aside while verl runs (verl 0.9.1's FSDP worker cannot
             import TRL 1.16's value-head class) and put back afterwards.
    merge    verl's model merger (``python -m verl.model_merger merge --backend fsdp``) on the last checkpoint
    deploy   the course's path for a model trained elsewhere: ``deploy.export_model`` of the merged folder,
             ``verify_export``, the tensor digest, and a vLLM server (``deploy.VLLMServer``) answering a chat
    trl      TRL colocate (``grpo_lab.train``) on the same tiny workload and GPU: per-step times, side by side
    smollm2  verl on SmolLM2-135M-Instruct (the folder ``../grpo_smollm2/stage_model.sh`` converts), if staged
    smollm2-best  the same with verl's own performance settings (``best_settings``: CUDA graphs, torch.compile, its
             default workers, dynamic batch sizes, no checkpointing, padding removal left on; flash-attn's attention
             where it imports), its start reported apart from its steps
    report   ``results.json`` and ``verl-files.tgz`` (logs, metrics, rollout dumps, export files) in ``--out``, after
             every phase; the results of earlier calls on the same machine are kept (``/tmp/grpo-verl``)

Time: ``--budget-s`` (default 530 s) bounds the whole call; every phase gets a hard timeout from what is left.
``tests/test_verl_run_script.py`` runs this script on a CPU with a stand-in for verl that writes verl's files
(metrics, rollout dumps, checkpoint layout), so everything around verl is exercised before a GPU call.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from grpo_lab import verl_export as V  # noqa: E402 - after the path setup above
from grpo_lab.experiment import TrainConfig  # noqa: E402
from grpo_lab.servers import stop_process_group  # noqa: E402
from lab import verl_parity as P  # noqa: E402

SITE = Path(os.environ.get("GRPO_GPU_SITE", "/tmp/grpo-gpu-site"))
WORK = Path(os.environ.get("GRPO_VERL_WORK", "/tmp/grpo-verl"))
VERL_TRANSFORMERS = Path(os.environ.get("GRPO_VERL_TRANSFORMERS", "/tmp/verl-transformers"))
CARRIED_TRANSFORMERS = REPO / ".wheels" / "gpu-verl-bundle" / "verl-transformers"
TINY_MODEL = REPO / "data" / "models" / "tiny-qwen2"
SMOLLM2_MODEL = Path(os.environ.get("GRPO_SMOLLM2_STATE", "/tmp/grpo-smollm2")) / "model"
PHASES = ("env", "tiny", "merge", "deploy", "trl", "smollm2", "smollm2-best", "report")
DEFAULT_PHASES = ("env", "tiny", "merge", "deploy")
LOG_CAP_BYTES = 6 * 2**20
FILES_ARCHIVE = "verl-files.tgz"
ARCHIVE_CAP_BYTES = 15 * 2**20
TAIL_LINES = 60

# What verl needs to import in its processes (checked before the first run, per transformers choice).
IMPORT_CHECK = r"""
import importlib, importlib.util, json
mods = ["transformers", "tokenizers", "vllm", "verl", "verl.trainer.main_ppo", "verl.workers.engine_workers",
        "verl.trainer.ppo.core_algos", "verl.model_merger.fsdp_model_merger", "transfer_queue", "ray", "tensordict",
        "hydra", "torchdata", "peft", "codetiming", "orjson"]
out = {}
for m in mods:
    module = importlib.import_module(m)
    out[m] = getattr(module, "__version__", None)
out["trl_hidden"] = importlib.util.find_spec("trl") is None
import sys, torch
from transformers import AutoConfig, AutoTokenizer
out["torch"] = torch.__version__
out["model_tokenizer"] = type(AutoTokenizer.from_pretrained(sys.argv[1])).__name__  # the model verl trains first
out["model_config"] = type(AutoConfig.from_pretrained(sys.argv[1])).__name__
print("IMPORT-CHECK " + json.dumps(out))
"""


# --------------------------------------------------------------------------------------------------
# Overrides the machine and the call force, beyond the export's own
# --------------------------------------------------------------------------------------------------
def forced_overrides(work: Path, steps: int, save_freq: int) -> list[dict[str, Any]]:
    """Every override passed after the export's (``run_verl.sh "$@"``, where a later value wins), with its reason.

    The export (``grpo_lab.verl_export``, tiny profile, 1 GPU) already sets ``trainer.n_gpus_per_node=1``,
    ``rollout.tensor_model_parallel_size=1``, ``rollout.name=vllm`` and the micro-batch sizes one GPU needs.
    """
    return [
        dict(key="+actor_rollout_ref.model.override_config.attn_implementation", value="sdpa",
             reason="this image: no flash-attn (verl's default attention is flash_attention_2); '+' because "
                    "override_config is an empty dict in verl's config"),
        dict(key="trainer.logger", value=["console", "file"],
             reason="this image: no wandb; the file logger ($VERL_FILE_LOGGER_PATH) writes the per-step metrics "
                    "read here (export: [console])"),
        dict(key="trainer.rollout_data_dir", value=str(work / "rollouts"),
             reason="parity: verl dumps every rollout (input, output, ground truth, score, uid)"),
        dict(key="trainer.total_training_steps", value=steps,
             reason="one device call of at most 10 minutes (export: the profile's max_steps)"),
        dict(key="trainer.save_freq", value=save_freq,
             reason="checkpoints within the call, the last one at the last step (export: save_steps)"),
        dict(key="trainer.test_freq", value=steps,
             reason="validation on test.parquet before training and after the last step only (export: save_steps)"),
        dict(key="trainer.default_local_dir", value=str(work / "checkpoints"),
             reason="checkpoints outside the repository copy, which the device tool rebuilds on every call"),
        dict(key="trainer.resume_mode", value="disable", reason="a fresh run (export: verl's default 'auto')"),
        dict(key="actor_rollout_ref.rollout.enforce_eager", value=True,
             reason="time: no CUDA-graph capture when verl starts vLLM"),
        dict(key="actor_rollout_ref.actor.use_torch_compile", value=False,
             reason="time: no torch.compile of the entropy function on the first step"),
        dict(key="actor_rollout_ref.rollout.agent.num_workers", value=1,
             reason="one GPU: one agent-loop worker instead of verl's 8 (fewer Ray actors to start)"),
        dict(key="reward.num_workers", value=1, reason="one GPU: one reward worker instead of verl's 8"),
    ]


def best_settings(flash_attn: bool) -> list[dict[str, Any]]:
    """verl at its own best on one GPU (issue 26): after :func:`forced_overrides`, so each replaces the constrained
    value (a later Hydra value wins). Every value is verl 0.9.1's default or its performance guide's advice, with the
    reason; what this image cannot run says why."""
    settings = [
        dict(key="actor_rollout_ref.rollout.enforce_eager", value=False,
             reason="verl's default: the rollout's decode replays CUDA graphs (the constrained run was eager)"),
        dict(key="actor_rollout_ref.actor.use_torch_compile", value=True, reason="verl's default"),
        dict(key="actor_rollout_ref.rollout.agent.num_workers", value=8, reason="verl's default agent-loop workers"),
        dict(key="reward.num_workers", value=8, reason="verl's default reward workers"),
        dict(key="actor_rollout_ref.model.enable_gradient_checkpointing", value=False,
             reason="memory does not need it: 135 M parameters on 140 GiB (the export copies TRL's setting)"),
        dict(key="actor_rollout_ref.actor.use_dynamic_bsz", value=True,
             reason="verl's performance guide: micro-batches packed up to a token budget, not a fixed row count; "
                    "the ref and rollout log-prob passes follow it (their defaults select the actor's)"),
        dict(key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu", value=16384,
             reason="verl's default budget, about 39 of the recipe's longest rows (160 + 256 tokens)"),
    ]
    if flash_attn:
        settings.append(dict(
            key="actor_rollout_ref.model.override_config.attn_implementation", value="flash_attention_2",
            reason="verl's default attention (the constrained override added the key: no '+')"))
    # Padding removal is verl's default (use_remove_padding=True) and stays on: without flash-attn, verl 0.9.1 unpads
    # and repacks with pure-torch fallbacks (verl/utils/attention_utils.py), which every constrained run here used.
    return settings


def hydra_args(overrides: list[dict[str, Any]]) -> list[str]:
    return [f"{o['key']}={V.hydra_value(o['value'])}" for o in overrides]


# Retries: when a run fails before its first step, one more attempt with the remedy the log points at.
REMEDIES = (
    (re.compile(r"transfer_queue|TransferQueue"), dict(
        key="trainer.use_v1", value=False,
        reason="retry: the V1 trainer failed in TransferQueue; verl's legacy trainer")),
    (re.compile(r"cu_seqlens|unpad|remove_padding|packed_sequence|flash_attn"), dict(
        key="actor_rollout_ref.model.use_remove_padding", value=False,
        reason="retry: the padding-free path failed with sdpa; padded batches")),
)


# --------------------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------------------
class Run:
    """The call's deadline, its results (kept in WORK/results.json across calls on one machine) and $OUT."""

    def __init__(self, out: Path, budget_s: float, fresh: bool, earlier: Path | None = None):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.files = WORK / "files"  # logs, metrics, rollouts, export files: packed into $OUT/FILES_ARCHIVE
        if fresh:
            shutil.rmtree(self.files, ignore_errors=True)
        self.files.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.path = WORK / "results.json"
        source = self.path if self.path.is_file() else earlier  # this machine's earlier calls, else another's
        previous = {} if fresh or source is None else json.loads(source.read_text())
        self.results: dict[str, Any] = {**previous, "phases": previous.get("phases", {})}
        self.results.setdefault("calls", []).append({"started": now(), "argv": sys.argv[1:]})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        """results.json and one archive of every file into $OUT: the device tool brings back at most 8 files of at
        most 16 MiB each, no more than 2 folders down."""
        WORK.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.results, indent=2, default=str) + "\n"
        self.path.write_text(text)
        (self.out / "results.json").write_text(text)
        (self.files / "results.json").write_text(text)
        archive = self.out / FILES_ARCHIVE
        with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
            tar.add(self.files, arcname="verl-files")
        archive.with_suffix(".tmp").replace(archive)
        if archive.stat().st_size > ARCHIVE_CAP_BYTES:  # keep what matters: no full logs, their tails instead
            with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
                tar.add(self.files, arcname="verl-files", filter=lambda m: None if m.name.endswith(".log") else m)
                for log in self.files.rglob("*.log"):
                    data = tail(log, 400).encode()
                    info = tarfile.TarInfo(f"verl-files/{log.relative_to(self.files)}.tail")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            archive.with_suffix(".tmp").replace(archive)

    def phase(self, name: str, needs_s: float, function, *args) -> Any:
        """Run one phase: skipped when less than ``needs_s`` is left, recorded either way, never raising."""
        record = {"status": "skipped", "seconds": 0.0}
        self.results["phases"][name] = record
        if self.left() < needs_s:
            record["error"] = f"not run: {self.left():.0f} s left of the call's budget, the phase needs {needs_s:.0f} s"
            print(f"[{name}] SKIPPED: {record['error']}", flush=True)
            self.save()
            return None
        print(f"[{name}] start ({self.left():.0f} s left)", flush=True)
        began = time.monotonic()
        try:
            value = function(self, *args)
            record["status"] = "ok"
            return value
        except PhaseFailed as failure:
            record.update(status=failure.status, error=str(failure), log_tail=failure.tail)
        except Exception as error:  # noqa: BLE001 - every failure is recorded and the call goes on
            record.update(status="failed", error=f"{type(error).__name__}: {error}",
                          log_tail=traceback.format_exc()[-4000:])
        finally:
            record["seconds"] = round(time.monotonic() - began, 1)
            print(f"[{name}] {record['status']} in {record['seconds']} s"
                  + (f": {record.get('error')}" if record["status"] != "ok" else ""), flush=True)
            record["gpu_processes_after"] = gpu_processes()
            self.save()
        return None


class PhaseFailed(RuntimeError):
    """A phase that did not do all it should; ``partial``: it stopped early but left usable results."""

    def __init__(self, message: str, tail: str = "", partial: bool = False):
        super().__init__(message)
        self.tail = tail
        self.status = "partial" if partial else "failed"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def copy_log(source: Path, target: Path) -> None:
    """Copy a log to $OUT; a very long one keeps its first MiB and its last 5 MiB."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not source.is_file():
        return
    size = source.stat().st_size
    if size <= LOG_CAP_BYTES:
        shutil.copyfile(source, target)
        return
    with source.open("rb") as handle:
        head = handle.read(2**20)
        handle.seek(size - 5 * 2**20)
        rest = handle.read()
    target.write_bytes(head + f"\n\n[... {size - len(head) - len(rest)} bytes cut by run.py ...]\n\n".encode() + rest)


def gpu_processes() -> list[str]:
    """Processes holding GPU memory now (nvidia-smi), to show that a phase left nothing behind."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ["nvidia-smi did not answer"]
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def run_logged(command: list[str], log: Path, timeout_s: float, env: dict[str, str], cwd: Path | None = None
               ) -> dict[str, Any]:
    """Run ``command`` in a session of its own with a hard timeout; afterwards stop its process group and every
    process it started (tracked while it ran: Ray starts workers that may sit in other process groups)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with log.open("ab") as handle:
        handle.write(f"\n$ {shlex.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True)
    seen: dict[int, float] = {}
    timed_out = False
    try:
        while process.poll() is None:
            _track(process.pid, seen)
            if time.monotonic() - began > timeout_s:
                timed_out = True
                break
            time.sleep(2.0)
    finally:
        _track(process.pid, seen)
        stop_process_group(process, timeout_s=20.0)
        _stop_tracked(seen)
    return {"returncode": process.returncode, "timed_out": timed_out, "seconds": round(time.monotonic() - began, 1),
            "command": shlex.join(command), "log": str(log)}


def _track(pid: int, seen: dict[int, float]) -> None:
    try:
        import psutil
    except ImportError:  # then the process group alone is stopped
        return
    with contextlib.suppress(Exception):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(Exception):
                seen.setdefault(child.pid, child.create_time())


def _stop_tracked(seen: dict[int, float]) -> None:
    """SIGTERM, then SIGKILL, the processes seen under a child that are still the same processes (pid + start)."""
    try:
        import psutil
    except ImportError:
        return
    alive = []
    for pid, created in seen.items():
        with contextlib.suppress(Exception):
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 1e-3:
                alive.append(process)
    for process in alive:
        with contextlib.suppress(Exception):
            process.terminate()
    _, still = psutil.wait_procs(alive, timeout=15)
    for process in still:
        with contextlib.suppress(Exception):
            process.kill()
    psutil.wait_procs(still, timeout=10)


def wait_for_free_gpu(timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = gpu_processes()
        if not busy:
            return []
        time.sleep(1.0)
    return gpu_processes()


# --------------------------------------------------------------------------------------------------
# TRL aside while verl runs
# --------------------------------------------------------------------------------------------------
TRL, TRL_OFF = SITE / "trl", SITE / "trl.off"


def restore_trl() -> None:
    if TRL_OFF.is_dir() and not TRL.exists():
        TRL_OFF.rename(TRL)
        print(f"put TRL back: {TRL}", flush=True)


@contextlib.contextmanager
def trl_hidden():
    """verl 0.9.1 imports TRL's value-head model whenever ``find_spec("trl")`` finds TRL; TRL 1.16 has none."""
    moved = False
    if TRL.is_dir():
        TRL.rename(TRL_OFF)
        moved = True
    try:
        yield
    finally:
        if moved:
            restore_trl()


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(f"stopped by signal {signum}")


# --------------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------------
def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", VLLM_USE_FLASHINFER_SAMPLER="0",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0",
               HYDRA_FULL_ERROR="1", WANDB_MODE="disabled")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # verl's vLLM sleep mode refuses expandable segments
    return env


def verl_env(run: Run, extra: dict[str, str] | None = None) -> dict[str, str]:
    """verl's processes: the chosen transformers (if any) ahead of the bundle, the bundle ahead of the image."""
    paths = [str(VERL_TRANSFORMERS)] if run.results.get("verl_transformers", {}).get("ahead") else []
    return {**base_env(), "PYTHONPATH": os.pathsep.join(paths + [str(SITE)]), **(extra or {})}


def course_env() -> dict[str, str]:
    """The course's own processes: the bundle and the repository, the image's transformers."""
    return {**base_env(), "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO)])}


def unpack_transformers(source: Path) -> dict[str, Any]:
    """Unpack the carried transformers wheels into VERL_TRANSFORMERS (checked against their SHA256 file)."""
    wheels = sorted(source.glob("*.whl"))
    if not wheels:
        return {"found": False, "why": f"no wheels in {source} (carry .wheels/gpu-verl-bundle/verl-transformers)"}
    sums = {}
    if (source / "SHA256").is_file():
        for line in (source / "SHA256").read_text().splitlines():
            digest, name = line.split(maxsplit=1)
            sums[Path(name.lstrip("*")).name] = digest
    for wheel in wheels:
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if sums and sums.get(wheel.name) != digest:
            return {"found": False, "why": f"{wheel.name}: sha256 does not match {source / 'SHA256'}"}
    marker = VERL_TRANSFORMERS / ".wheels"
    names = "\n".join(w.name for w in wheels)
    if not (marker.is_file() and marker.read_text() == names):
        staging = VERL_TRANSFORMERS.with_name(VERL_TRANSFORMERS.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(staging)
        (staging / ".wheels").write_text(names)
        shutil.rmtree(VERL_TRANSFORMERS, ignore_errors=True)
        staging.rename(VERL_TRANSFORMERS)
    return {"found": True, "wheels": [w.name for w in wheels], "folder": str(VERL_TRANSFORMERS)}


def import_check(run: Run, ahead: bool, log: Path) -> dict[str, Any]:
    env = {**base_env(), "PYTHONPATH": os.pathsep.join(([str(VERL_TRANSFORMERS)] if ahead else []) + [str(SITE)])}
    script = WORK / "import_check.py"
    script.write_text(IMPORT_CHECK)
    with trl_hidden():
        done = run_logged([sys.executable, str(script), str(TINY_MODEL)], log, min(180.0, max(30.0, run.left() - 300)),
                          env)
    found = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("IMPORT-CHECK ")]
    done["versions"] = json.loads(found[-1].split(" ", 1)[1]) if found else None
    done["ok"] = done["returncode"] == 0 and done["versions"] is not None
    if not done["ok"]:
        done["log_tail"] = tail(log, 25)
    return done


def phase_env(run: Run, args: argparse.Namespace) -> None:
    out = run.files / "env"
    out.mkdir(parents=True, exist_ok=True)
    import importlib.metadata as md

    lines = []
    for dist in md.distributions():
        with contextlib.suppress(Exception):
            where = "bundle" if str(SITE) in str(dist.locate_file("")) else "image"
            lines.append(f"{dist.metadata['Name']}=={dist.version}  [{where}]")
    lines.sort(key=str.lower)
    (out / "distributions.txt").write_text("\n".join(lines) + "\n")
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20) if shutil.which(
        "nvidia-smi") else None
    run.results["device"] = smi.stdout.strip() if smi else "no nvidia-smi"
    run.results["python"] = sys.version.split()[0]
    restore_trl()  # a call killed while verl ran may have left TRL aside
    carried = unpack_transformers(Path(args.verl_transformers))
    choice: dict[str, Any] = {"carried": carried, "checks": {}}
    order = ([True] if carried["found"] else []) + [False]
    for ahead in order:
        label = "verl-transformers ahead" if ahead else "image transformers"
        check = import_check(run, ahead, out / f"import_check_{'verl' if ahead else 'image'}.log")
        choice["checks"][label] = check
        if check["ok"]:
            choice.update(ahead=ahead, label=label, versions=check["versions"])
            break
    run.results["verl_transformers"] = choice
    if "label" not in choice:
        raise PhaseFailed("verl does not import with either transformers (see env/import_check_*.log)",
                          "\n".join(c.get("log_tail", "") for c in choice["checks"].values()))
    print(f"[env] verl runs with {choice['label']}: transformers {choice['versions']['transformers']}, "
          f"vllm {choice['versions']['vllm']}, verl {choice['versions']['verl']}, ray {choice['versions']['ray']}")


# --------------------------------------------------------------------------------------------------
# verl runs
# --------------------------------------------------------------------------------------------------
def export_for_one_gpu(folder: Path, config: TrainConfig) -> dict[str, Any]:
    export = V.export_verl(folder, config, V.VerlTarget(device="cuda", n_gpus_per_node=1), overwrite=True,
                           validate=True)
    return {"folder": str(folder), "overrides": export.overrides, "schema_check": export.schema_check.summary(),
            "schema_ok": export.schema_check.ok, "train_rows": export.num_train_rows,
            "test_rows": export.num_test_rows, "launch": export.launch_command}


def verl_command(export_dir: Path, forced: list[dict[str, Any]]) -> list[str]:
    """The export's own launch script with the forced overrides after the export's (the later value wins)."""
    return ["bash", str(export_dir / V.LAUNCH_FILE), *hydra_args(forced)]


def verl_attempt(run: Run, name: str, export_dir: Path, model: Path, steps: int, save_freq: int, attempt: int,
                 extra: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    work = WORK / name / f"attempt-{attempt}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    forced = forced_overrides(work, steps, save_freq) + extra
    metrics_path = work / "metrics.jsonl"
    env = verl_env(run, {"MODEL_PATH": str(model), "VERL_FILE_LOGGER_PATH": str(metrics_path),
                         "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")})
    log = work / "verl.log"
    with trl_hidden():
        done = run_logged(verl_command(export_dir, forced), log, timeout_s, env, cwd=work)
    metrics = P.read_metrics(metrics_path)
    done.update(attempt=attempt, work=str(work), forced_overrides=forced, transformers=run.results.get(
        "verl_transformers", {}).get("label"), steps_logged=len(P.training_records(metrics)))
    if done["returncode"] != 0 or done["timed_out"]:
        done["log_tail"] = tail(log)
    return done


def train_with_verl(run: Run, name: str, config: TrainConfig, model: Path, steps: int, save_freq: int,
                    reserve_s: float, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Export ``config`` for one GPU, run verl on it (a second attempt if the first fails before any step), read
    back metrics, rollouts and parity. Everything lands in run.results[name] and run.files/<name>/."""
    section: dict[str, Any] = {"model": str(model), "steps_asked": steps, "save_freq": save_freq, "attempts": []}
    run.results[name] = section
    export_dir = WORK / name / "export"
    section["export"] = export_for_one_gpu(export_dir, config)
    out = run.files / name
    out.mkdir(parents=True, exist_ok=True)
    for file in (V.OVERRIDES_FILE, V.LAUNCH_FILE, V.README_FILE, V.MANIFEST_FILE, V.REWARD_FILE):
        shutil.copyfile(export_dir / file, out / f"export_{file}")
    extra = list(extra or [])
    for attempt in (1, 2):
        budget = run.left() - reserve_s
        if budget < 150:
            section["attempts"].append({"attempt": attempt, "skipped": f"{run.left():.0f} s left, {reserve_s:.0f} s "
                                                                       "kept for the phases after it"})
            break
        done = verl_attempt(run, name, export_dir, model, steps, save_freq, attempt, extra, budget)
        section["attempts"].append(done)
        run.save()
        copy_log(Path(done["log"]), out / f"verl_attempt{attempt}.log")
        if (done["returncode"] == 0 and not done["timed_out"]) or done["steps_logged"] > 0 or attempt == 2:
            break
        log_text = tail(Path(done["log"]), 400)
        remedy = next((r for pattern, r in REMEDIES if pattern.search(log_text)), None)
        if remedy is not None:
            extra.append(remedy)
            done["next"] = f"retry with {remedy['key']}={V.hydra_value(remedy['value'])}"
            continue
        choice = run.results.get("verl_transformers") or {}
        other = not choice.get("ahead", False)
        if other and not (choice.get("carried") or {}).get("found"):
            break  # nothing else to try
        choice.update(ahead=other, label=("verl-transformers ahead" if other else "image transformers")
                      + " (switched after attempt 1 failed)")
        run.results["verl_transformers"] = choice
        done["next"] = f"retry with {choice['label']}"
    last = next((a for a in reversed(section["attempts"]) if "work" in a), None)
    if last is None:
        raise PhaseFailed("verl did not run (no time left)")
    work = Path(last["work"])
    read_back(run, name, work, out)
    if last["returncode"] != 0 or last["timed_out"]:
        why = "was stopped at its time limit" if last["timed_out"] else f"exited with {last['returncode']}"
        usable = bool(section.get("steps_completed")) and section.get("checkpoint") is not None
        raise PhaseFailed(f"verl {why} after {section.get('steps_completed', 0)} of {steps} steps (attempt "
                          f"{last['attempt']}; last checkpoint: {(section.get('checkpoint') or {}).get('step')})",
                          last.get("log_tail", ""), partial=usable)
    return section


def read_back(run: Run, name: str, work: Path, out: Path) -> None:
    """Metrics, rollouts, checkpoint and parity of a verl run, into run.results[name] and ``out`` (archived)."""
    section = run.results[name]
    metrics = P.read_metrics(work / "metrics.jsonl")
    if (work / "metrics.jsonl").is_file():
        shutil.copyfile(work / "metrics.jsonl", out / "metrics.jsonl")
    rollouts = P.read_rollouts(work / "rollouts")
    if rollouts:
        shutil.copytree(work / "rollouts", out / "rollouts", dirs_exist_ok=True)
    curve = P.reward_curve(metrics)
    section.update(steps_completed=len(curve), reward_curve=curve, validation=P.validation_scores(metrics),
                   timings=P.step_timings(metrics), checkpoint=latest_checkpoint(work / "checkpoints"))
    if curve:
        k = max(1, len(curve) // 4)
        section["reward_first_quarter_mean"] = statistics.fmean(v for _, v in curve[:k])
        section["reward_last_quarter_mean"] = statistics.fmean(v for _, v in curve[-k:])
    if not rollouts:
        section["parity"] = {"error": "no rollout dumps"}
        return
    try:
        parity(run, name, metrics, rollouts)
    except Exception as error:  # noqa: BLE001 - a parity bug must not hide the run's own results
        section["parity"] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}


def parity(run: Run, name: str, metrics: list[dict[str, Any]], rollouts: dict[int, list[dict[str, Any]]]) -> None:
    """Reward parity on every dumped completion, advantage parity on every dumped batch."""
    section = run.results[name]
    loaded = V.load_export(WORK / name / "export")
    every = [r for step in sorted(rollouts) for r in rollouts[step]]
    rewards = P.reward_parity(every, loaded.reward_set())
    verl_fn, origin = P.load_verl_grpo_advantage(os.environ.get(V.VERL_SOURCE_ENV))
    norm = bool(loaded.overrides["algorithm.norm_adv_by_std_in_grpo"])
    by_step = {int(m["step"]): m for m in metrics}
    advantages = {step: P.advantage_parity(records, verl_fn, by_step.get(step), norm_by_std=norm)
                  for step, records in rollouts.items()}
    last_step = max(advantages)
    section["parity"] = {
        "reward": {**rewards.__dict__, "equal": rewards.equal},
        "advantage_function": origin,
        "advantage_last_batch": {**{k: v for k, v in advantages[last_step].__dict__.items() if k != "advantages"},
                                 "agrees": advantages[last_step].agrees()},
        "advantage_per_step": {step: {"vs_verl_function": a.max_abs_diff_vs_verl_function,
                                      "vs_logged_range": a.max_abs_diff_vs_logged_range,
                                      "course_epsilon": a.max_abs_diff_course_epsilon}
                               for step, a in sorted(advantages.items())},
    }
    diffs = [d for a in advantages.values() for d in (a.max_abs_diff_vs_verl_function, a.max_abs_diff_vs_logged_range)
             if d is not None]
    section["advantage_parity_max_abs_diff"] = max(diffs) if diffs else None
    section["reward_parity_max_abs_diff"] = rewards.max_abs_diff


def latest_checkpoint(root: Path) -> dict[str, Any] | None:
    """The checkpoint verl recorded as complete (``latest_checkpointed_iteration.txt``), else the newest folder."""
    steps = {int(p.name.rsplit("_", 1)[-1]): p for p in root.glob("global_step_*")
             if p.name.rsplit("_", 1)[-1].isdigit()}
    if not steps:
        return None
    recorded = root / "latest_checkpointed_iteration.txt"
    named = recorded.read_text().strip() if recorded.is_file() else ""
    step = int(named) if named.isdigit() and int(named) in steps else max(steps)
    path = steps[step]
    files = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file())
    return {"step": step, "actor": str(path / "actor"), "files": files, "latest_checkpointed_iteration": named or None,
            "bytes": sum((path / f).stat().st_size for f in files)}


def skip_validation_before(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--skip-val-before``: validation after the last step only (the "before" comes from an earlier call)."""
    if not args.skip_val_before:
        return []
    return [dict(key="trainer.val_before_train", value=False,
                 reason="time: the validation before training was measured in an earlier call")]


def phase_tiny(run: Run, args: argparse.Namespace) -> None:
    config = TrainConfig(profile="tiny")
    section = train_with_verl(run, "tiny", config, TINY_MODEL, args.steps,
                              args.save_freq or max(1, args.steps // 2), reserve_s=args.reserve_s,
                              extra=skip_validation_before(args))
    summarise(run)
    return section


def merge_command(actor: Path, target: Path) -> list[str]:
    """verl's own model merger: FSDP shards of ``global_step_N/actor`` -> a Hugging Face folder (safetensors)."""
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
            "--target_dir", str(target)]


def phase_merge(run: Run, args: argparse.Namespace) -> None:
    checkpoint = (run.results.get("tiny") or {}).get("checkpoint")
    if not checkpoint:
        raise PhaseFailed("no verl checkpoint to merge (the tiny phase wrote none)")
    target = WORK / "tiny" / "merged"
    shutil.rmtree(target, ignore_errors=True)
    log = WORK / "tiny" / "merge.log"
    with trl_hidden():
        done = run_logged(merge_command(Path(checkpoint["actor"]), target), log, min(180.0, run.left() - 60),
                          verl_env(run))
    copy_log(log, run.files / "tiny" / "merge.log")
    files = {p.name: p.stat().st_size for p in sorted(target.glob("*"))} if target.is_dir() else {}
    run.results["merge"] = {**done, "step": checkpoint["step"], "target": str(target), "files": files}
    for name in ("config.json", "generation_config.json"):
        if (target / name).is_file():
            shutil.copyfile(target / name, run.files / "tiny" / f"merged_{name}")
    if done["returncode"] != 0 or not any(name.endswith(".safetensors") for name in files):
        raise PhaseFailed(f"the model merger exited with {done['returncode']} (timed out: {done['timed_out']})",
                          tail(log))


def phase_deploy(run: Run, args: argparse.Namespace) -> None:
    """The course's deployment path for a model trained elsewhere (notebook 05): export, verify, serve, ask."""
    from grpo_lab import deploy, models
    from grpo_lab.data import load_split
    from grpo_lab.rewards import is_correct

    run.results["merged_checkpoint_verified"] = False
    merged = Path((run.results.get("merge") or {}).get("target", WORK / "tiny" / "merged"))
    if not any(merged.glob("*.safetensors")):
        raise PhaseFailed(f"no merged model in {merged}")
    section: dict[str, Any] = {"merged": str(merged)}
    run.results["deploy"] = section
    section["verify_merged_as_written"] = str(deploy.verify_export(merged, load_weights=False))
    served = WORK / "tiny" / "served"
    deploy.export_model(merged, served, overwrite=True)
    report = deploy.verify_export(served)
    section["verify_export"] = {"ok": report.ok, "report": str(report)}
    section["digest_merged"], section["digest_served"] = models.weights_digest(merged), models.weights_digest(served)
    section["same_digest"] = section["digest_merged"] == section["digest_served"]
    # the digest also covers the dtype: a folder loaded in another dtype holds the same values, exactly upcast
    section["same_tensors"] = section["same_digest"] or same_values(merged, served)
    section["change_from_base"] = weight_change(TINY_MODEL, merged)
    experiment = TrainConfig(profile="tiny").with_profile()
    question = load_split("eval")[0]
    busy = wait_for_free_gpu()
    if busy:
        section["gpu_busy_before_server"] = busy
    config = deploy.serve_config(served, experiment, gpu_memory_utilization=0.5, extra_args=("--enforce-eager",),
                                 startup_timeout_s=max(60.0, min(300.0, run.left() - 40)))
    log = run.files / "deploy" / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with deploy.VLLMServer(config, log_path=log) as server:
        section["server_start_s"] = round(time.monotonic() - began, 1)
        reply = deploy.chat(server, question["prompt"], max_tokens=experiment.max_completion_length)
        section["chat"] = {"question": question["prompt"][-1]["content"], "answer_key": question["answer"],
                           "reply": reply.text, "finish_reason": reply.finish_reason,
                           "completion_tokens": reply.completion_tokens, "seconds": round(reply.seconds, 3),
                           "correct": is_correct(reply.text, question["answer"])}
        section["curl"] = deploy.curl_command(server, question["prompt"])
    section["answered"] = reply.finish_reason in ("stop", "length")
    run.results["merged_checkpoint_verified"] = bool(report.ok and section["same_tensors"] and section["answered"])
    if not run.results["merged_checkpoint_verified"]:
        raise PhaseFailed("the merged checkpoint did not pass verify_export, the digest check or the server check",
                          str(report))


def tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        found.update(load_file(str(file)))
    return found


def same_values(a_dir: Path, b_dir: Path) -> bool:
    """Same tensor names, shapes and values (compared in float32), whatever dtype each folder stores."""
    a, b = tensors(a_dir), tensors(b_dir)
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and bool((a[k].float() == b[k].float()).all())
                                        for k in a)


def weight_change(base: Path, trained: Path) -> dict[str, Any]:
    """How far training moved the weights: tensors compared in float32 (the merger writes bfloat16)."""
    import torch

    a, b = tensors(base), tensors(trained)
    common = sorted(set(a) & set(b))
    changes = {name: float((a[name].float() - b[name].float()).abs().max()) for name in common
               if a[name].shape == b[name].shape}
    bf16 = {name: float((a[name].to(torch.bfloat16).float() - b[name].float()).abs().max()) for name in common
            if a[name].shape == b[name].shape}
    return {"tensors_compared": len(changes), "only_in_base": sorted(set(a) - set(b)),
            "only_in_trained": sorted(set(b) - set(a)), "max_abs_change": max(changes.values(), default=None),
            "tensors_changed_beyond_bf16_rounding": sum(v > 0 for v in bf16.values())}


def phase_trl(run: Run, args: argparse.Namespace) -> None:
    """TRL colocate on the tiny workload (the experiment verl ran), same GPU, for the per-step side-by-side."""
    from grpo_lab.runs import read_metrics

    work = WORK / "trl"
    shutil.rmtree(work, ignore_errors=True)
    log = work / "train.log"
    command = [sys.executable, "-m", "grpo_lab.train", "--profile", "tiny", "--use-vllm", "true",
               "--vllm-gpu-memory-utilization", "0.3", "--max-steps", str(args.trl_steps), "--save-steps",
               str(args.trl_steps), "--output-dir", str(work / "run"), "--live-plot", "false"]
    restore_trl()
    done = run_logged(command, log, min(420.0, run.left() - 30), course_env(), cwd=REPO)
    copy_log(log, run.files / "trl" / "train.log")
    metrics = read_metrics(work / "run")
    if (work / "run" / "metrics.jsonl").is_file():
        shutil.copyfile(work / "run" / "metrics.jsonl", run.files / "trl" / "metrics.jsonl")
    rows = metrics[2:] if len(metrics) > 2 else metrics
    med = (lambda key: statistics.median(r[key] for r in rows if key in r) if any(key in r for r in rows) else None)
    run.results["trl"] = {**done, "steps_completed": len(metrics), "reward_curve": [
        (int(r["step"]), r.get("reward")) for r in metrics], "median_after_2_warmup_steps": {
        "step_s": med("step_time"), "generation_s": med("timing/generation_s"), "reward_s": med("timing/reward_s"),
        "update_s": med("timing/update_s")}, "vllm_gpu_memory_utilization": 0.3}
    summarise(run)
    if done["returncode"] != 0:
        raise PhaseFailed(f"grpo_lab.train exited with {done['returncode']} (timed out: {done['timed_out']})",
                          tail(log))


def phase_smollm2(run: Run, args: argparse.Namespace, name: str = "smollm2",
                  extra: list[dict[str, Any]] | None = None) -> None:
    if not (SMOLLM2_MODEL / "config.json").is_file():
        raise PhaseFailed(f"no SmolLM2 model at {SMOLLM2_MODEL}: stage it first (../grpo_smollm2/stage_model.sh)")
    spec = importlib.util.spec_from_file_location("grpo_smollm2_run", REPO / "benchmarks" / "grpo_smollm2" / "run.py")
    smollm2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smollm2)
    config = TrainConfig(**{**smollm2.RECIPE, "max_steps": args.smollm2_steps, "save_steps": args.smollm2_steps},
                         model=str(SMOLLM2_MODEL), dataset=str(smollm2.training_rows()),
                         rewards=("correctness", "format"), reward_weights=(1.0, 0.2))
    train_with_verl(run, name, config, SMOLLM2_MODEL, args.smollm2_steps, args.smollm2_save_freq or args.smollm2_steps,
                    reserve_s=20, extra=[*(extra or []), *skip_validation_before(args)])
    run.results[name]["recipe_note"] = (
        "the TRL SmolLM2 recipe (../grpo_smollm2/run.py RECIPE, English rows) through the export; its correctness "
        "reward is the registry's (the last number counts without '####'), where the TRL run required the marker")


def phase_smollm2_best(run: Run, args: argparse.Namespace) -> None:
    """The SmolLM2 run again with :func:`best_settings`; verl's start (Ray, workers, vLLM, validation) reported
    apart from its steps."""
    phase_smollm2(run, args, name="smollm2_best",
                  extra=best_settings(importlib.util.find_spec("flash_attn") is not None))
    section = run.results["smollm2_best"]
    last = next((a for a in reversed(section["attempts"]) if "seconds" in a), {})
    steps = sum(row.get("step_s", 0.0) for row in (section.get("timings") or {}).get("per_step", []))
    section["startup_s"] = round(last.get("seconds", 0.0) - steps, 1) if last else None
    section["startup_note"] = ("the run's wall time minus the sum of its steps' timing_s/step: Ray, the workers, "
                               "vLLM's start, the validation before training and the shutdown")


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------
def summarise(run: Run) -> None:
    """The headline fields and the verl-vs-TRL table, from whatever sections exist."""
    r = run.results
    tiny = r.get("tiny") or {}
    r["steps_completed"] = tiny.get("steps_completed", 0)
    r["reward_parity_max_abs_diff"] = tiny.get("reward_parity_max_abs_diff")
    r["advantage_parity_max_abs_diff"] = tiny.get("advantage_parity_max_abs_diff")
    r.setdefault("merged_checkpoint_verified", False)
    verl_median = (tiny.get("timings") or {}).get("median") or {}
    trl_median = (r.get("trl") or {}).get("median_after_2_warmup_steps") or {}
    if verl_median and trl_median:
        pairs = {"step": ("step_s", "step_s"), "generation": ("gen", "generation_s"),
                 "update (everything after the rollout)": ("update_like", "update_s"), "reward": ("reward", "reward_s")}
        r["comparison"] = {
            "workload": "tiny profile: 4 prompts x 8 completions, <= 32 tokens, tiny-qwen2, one H200",
            "rows": {label: {"verl_s": verl_median.get(v), "trl_colocate_s": trl_median.get(t)}
                     for label, (v, t) in pairs.items()},
            "verl_parts_s": {k: verl_median[k] for k in ("update_actor", "old_log_prob", "update_weights", "adv")
                             if k in verl_median},
            "note": "medians after 2 warm-up steps; verl's update = step - gen - reward - checkpoint - validation - "
                    "dump",
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phases", nargs="*", metavar="PHASE",
                        help=f"any of {' '.join(PHASES)} (default: {' '.join(DEFAULT_PHASES)})")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "verl-out")))
    parser.add_argument("--budget-s", type=float, default=530.0, help="the whole call's time (device calls: 600 s)")
    parser.add_argument("--steps", type=int, default=30, help="verl steps on the tiny model")
    parser.add_argument("--save-freq", type=int, default=None, help="default: half of --steps")
    parser.add_argument("--reserve-s", type=float, default=170.0,
                        help="seconds the tiny phase leaves for merge, deploy and the report")
    parser.add_argument("--trl-steps", type=int, default=30)
    parser.add_argument("--smollm2-steps", type=int, default=20)
    parser.add_argument("--smollm2-save-freq", type=int, default=None, help="default: --smollm2-steps")
    parser.add_argument("--skip-val-before", action="store_true",
                        help="no validation before training (verl's val_before_train=False), to save a call's time")
    parser.add_argument("--verl-transformers", default=str(CARRIED_TRANSFORMERS),
                        help="folder with the transformers/tokenizers wheels verl runs with")
    parser.add_argument("--fresh", action="store_true", help="forget the results of earlier calls on this machine")
    parser.add_argument("--continue-from", type=Path, default=None,
                        help="on a fresh machine, start from this results.json (the committed one: `trl` is then "
                             "compared with the verl run it holds)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.phases) - set(PHASES))  # not argparse's choices: it rejects an empty list on 3.12
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    asked = args.phases or DEFAULT_PHASES
    phases = [p for p in PHASES if p in asked and p != "report"]
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminate)
    restore_trl()  # a call stopped while verl ran may have left TRL aside
    run = Run(args.out, args.budget_s, args.fresh, args.continue_from)
    run.results.update(issue=17, verl_pin="0.9.1", updated=now())
    needs = {"env": 60, "tiny": 240, "merge": 40, "deploy": 90, "trl": 150, "smollm2": 240, "smollm2-best": 240}
    functions = {"env": phase_env, "tiny": phase_tiny, "merge": phase_merge, "deploy": phase_deploy,
                 "trl": phase_trl, "smollm2": phase_smollm2, "smollm2-best": phase_smollm2_best}
    try:
        for name in phases:
            run.phase(name, needs[name], functions[name], args)
    finally:
        restore_trl()
        summarise(run)
        run.results["calls"][-1]["seconds"] = round(time.monotonic() - run.start, 1)
        run.save()
    headline = {k: run.results.get(k) for k in ("steps_completed", "reward_parity_max_abs_diff",
                                                 "advantage_parity_max_abs_diff", "merged_checkpoint_verified")}
    print("results:", json.dumps(headline), "| phases:",
          {k: v["status"] for k, v in run.results["phases"].items()}, flush=True)
    return 0 if all(run.results["phases"][p]["status"] == "ok" for p in phases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
