"""The course's recipes on one H200 standing in for a smaller card (``GRPO_LAB_DEVICE_MEMORY_GIB``), one JSON per row.

    python3 benchmarks/capped/run.py list                          # the jobs, their rows and expected minutes
    python3 benchmarks/capped/run.py start seed-2b qlora lengths-16 lengths-24 lengths-32   # side by side, detached
    python3 benchmarks/capped/run.py wait                          # <= 9 minutes, then copies the rows to $OUT
    python3 benchmarks/capped/run.py jobs qlora                    # in the foreground instead
    python3 benchmarks/capped/run.py course-row --course /tmp/course-gpu --cap 24   # the capped course as a row
    python3 benchmarks/capped/run.py report benchmarks/capped/results                # here: the committed rows

Each job runs in its own process, its rows one after another, each row in a child process of its own (an
out-of-memory row, or one that crashes, writes its row and the next row runs). Rows land in ``$CAPPED/rows``
(default ``/tmp/capped``); ``wait`` copies them, with each row's log, to ``$OUT/capped``. The cap, the plan
(micro-batch, vLLM's share), torch's peaks and the driver's count of the row's own processes, step times, tokens per second and an
out-of-memory step and phase are in each row (``lab.capped.CappedRow`` reads them back).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO), str(REPO / "benchmarks")]

from jobs import BENCH_CAP_GIB, BENCH_MINUTES, JOBS, OPTIONAL, SIDE_BY_SIDE, SIDE_BY_SIDE_GIB, row_id  # noqa: E402

WORK = Path(os.environ.get("CAPPED", "/tmp/capped"))
ROW_TIMEOUT_S = 420
"""A row's process is ended after this long (its error row says so)."""
WAIT_S = int(os.environ.get("CAPPED_WAIT_S", "540"))
GPU_ENV = {"PYTHONPATH": f"/tmp/grpo-gpu-site:{REPO}:{REPO}/benchmarks", "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "MPLBACKEND": "Agg", "GRPO_LAB_PROFILE": "gpu"}
SMOLLM2 = "/tmp/grpo-smollm2/model"
MASTER_PORT_BASE = 29610
"""Each job's TRL colocate process group gets a port of its own (side by side, TRL's default 29500 clashed:
``EADDRINUSE`` in the 2026-12-03 session)."""
START_STAGGER_S = 60
"""Seconds between the jobs' starts: vLLM 0.26 asserts when another process frees device memory while it profiles
its own at engine start (seen beside other jobs on 2026-12-03), so the engines should not start together."""


def device_total_gib() -> float | None:
    """Device 0's memory as the driver counts it, GiB (None without ``nvidia-smi``)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30)
        return int(done.stdout.split()[0]) / 1024 if done.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def bench_cap_gib(device_gib: float | None) -> float | None:
    """The bench's cap: 80 GiB on a larger device (an H200 standing in for an 80 GB card); none on an 80 GB card
    itself (an H100: 79.6 GiB as the driver counts it), which is the card the row is about."""
    return None if device_gib is not None and device_gib <= BENCH_CAP_GIB + 1 else BENCH_CAP_GIB


def job_environment(job: str, environ: dict[str, str] | None = None, device_gib: float | None = None) -> dict[str, str]:
    """A job's processes' variables: the GPU bundle, the cap (``GRPO_LAB_DEVICE_MEMORY_GIB``; the bench's depends on
    ``device_gib``), SmolLM2 as the model, a vLLM compile cache of the job's own (jobs start side by side)."""
    environ = dict(os.environ if environ is None else environ)
    cap = bench_cap_gib(device_gib) if job == "bench-80" else JOBS[job].cap_gib
    path = [GPU_ENV["PYTHONPATH"], environ.get("PYTHONPATH", "")]
    environ.pop("GRPO_LAB_DEVICE_MEMORY_GIB", None)
    return {**environ, **GPU_ENV, "PYTHONPATH": ":".join(p for p in path if p),
            "PATH": f"/tmp/grpo-gpu-site/bin:{environ.get('PATH', '')}",
            **({"GRPO_LAB_DEVICE_MEMORY_GIB": f"{cap:g}"} if cap is not None else {}),
            "GRPO_LAB_MODEL": environ.get("GRPO_LAB_MODEL", SMOLLM2),
            "VLLM_CACHE_ROOT": str(WORK / "vllm-cache" / job), "GRPO_LAB_RUN_DIR": str(WORK / "runs" / job),
            "MASTER_PORT": str(MASTER_PORT_BASE + [*JOBS, "bench-80"].index(job))}


def describe_jobs() -> str:
    lines = []
    for name, job in JOBS.items():
        lines.append(f"{name}: {job.cap_gib:g} GiB, about {job.minutes:g} min — {job.what}")
        lines += [f"    {row_id(name, row)}: " + (f"serves the run of {row.settings['run_of']!r}" if row.kind == "serve"
                  else f"{row.steps} steps, the planner says {row.expect}") for row in job.rows]
    together = max(JOBS[name].minutes for name in SIDE_BY_SIDE)
    lines.append(f"side by side ({' '.join(SIDE_BY_SIDE)}): caps {SIDE_BY_SIDE_GIB:g} GiB, about {together:g} min")
    lines += [f"{name} (optional): {BENCH_CAP_GIB} GiB, about {BENCH_MINUTES:g} min — {what}"
              for name, what in OPTIONAL.items()]
    return "\n".join(lines)


BENCH_SHAPE = "qwen2.5-0.5b"
BENCH_SHARE = 0.25
"""The vLLM share of the committed micro-batch-128 runs (``--train-option vllm_gpu_memory_utilization=0.25``)."""


def bench_micro_batch(cap_gib: float = BENCH_CAP_GIB, share: float = BENCH_SHARE) -> int:
    """The largest micro-batch (128, 64, 32, 16) whose bench step the planner fits in ``cap_gib`` beside the other
    backend's trainer (its weights, gradients, AdamW states and reference model, which the bench keeps alive)."""
    import dataclasses

    from lab.bench.grpo_step import step_memory
    from lab.bench.profiles import BENCH_PROFILES

    profile = BENCH_PROFILES["seed"]
    for micro in (128, 64, 32, 16):
        step = dataclasses.replace(profile.step, per_device_train_batch_size=micro,
                                   gradient_accumulation_steps=profile.sequences // micro)
        budget = step_memory(dataclasses.replace(profile, step=step), BENCH_SHAPE, cap_gib, share)
        other_trainer = budget.phases["optimizer step"]  # weights, gradients, AdamW states, reference model
        if budget.fits and budget.used_bytes + other_trainer <= budget.device_bytes:
            return micro
    return 16


def bench_command(micro_batch: int, cap_gib: float | None = BENCH_CAP_GIB) -> list[str]:
    """The GRPO-step bench (notebook 06), fixed lengths, five interleaved steps per backend, under the cap (``None``:
    on an 80 GB card, uncapped)."""
    name = f"grpo_step_seed_{BENCH_SHAPE}_fixed_" + (f"cap{cap_gib:g}" if cap_gib is not None else "80gb_card")
    return [sys.executable, "-m", "lab.bench", "--profile", "seed", "--shape", BENCH_SHAPE, "--parts", "grpo",
            "--grpo-backends", "hf,vllm", "--grpo-steps", "5", "--grpo-workload", "fixed",
            "--per-device-train-batch-size", str(micro_batch),
            "--train-option", f"vllm_gpu_memory_utilization={BENCH_SHARE}",
            "--out", str(WORK / "bench"), "--name", name]


def run_row(job: str, index: int) -> int:
    """In a child process: one row, its record written to ``WORK/rows``."""
    from measure import write
    from runners import run_course_row, run_serve_row, run_trl_row

    row = JOBS[job].rows[index]
    runner = {"trl": run_trl_row, "course": run_course_row, "serve": run_serve_row}[row.kind]
    record = runner(job, row, JOBS[job].cap_gib, WORK)
    write(record, WORK / "rows" / f"{row_id(job, row)}.json")
    print(json.dumps({k: record[k] for k in ("name", "planned", "measured", "oom", "error")}, default=str), flush=True)
    os._exit(0)  # the row is written: no teardown of an engine that ran out of memory (it can hang the exit)


@contextlib.contextmanager
def ballast(job: str, stem: str, leave_gib: float, ready_s: int = 180):
    """``ballast.py`` in a process of its own (not the row's child: the row's driver count leaves it out) while the
    row runs, holding all but ``leave_gib`` of the device; its numbers land in ``logs/<row>.ballast.json``."""
    ready = WORK / "logs" / f"{stem}.ballast.json"
    ready.unlink(missing_ok=True)
    with (WORK / "logs" / f"{stem}.ballast.log").open("w") as handle:
        holder = subprocess.Popen([sys.executable, str(HERE / "ballast.py"), "--leave-gib", f"{leave_gib:g}",
                                   "--ready", str(ready)], stdout=handle, stderr=subprocess.STDOUT,
                                  env=job_environment(job))
    try:
        waited = 0.0
        while not ready.is_file() and holder.poll() is None and waited < ready_s:
            time.sleep(0.5)
            waited += 0.5
        print(f"{stem}: ballast " + (ready.read_text().replace("\n", " ") if ready.is_file() else "not ready"),
              flush=True)
        yield  # a ballast that failed: the row finds the device free and says so (runners.ballast_check)
    finally:
        holder.terminate()
        holder.wait(timeout=60)


def run_job(job: str, timeout_s: int = ROW_TIMEOUT_S) -> int:
    """A job's rows one after another, each in its own process (a ``ballast`` row beside ``ballast.py``'s); a row
    that dies gets an error row."""
    from runners import write_error

    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for index, row in enumerate(JOBS[job].rows):
        stem = row_id(job, row)
        log = logs / f"{stem}.log"
        started = time.perf_counter()
        stand_in = ballast(job, stem, JOBS[job].cap_gib) if row.stand_in == "ballast" else contextlib.nullcontext()
        with stand_in, log.open("w") as handle:
            try:
                code = subprocess.run([sys.executable, __file__, "row", job, str(index)], stdout=handle,
                                      stderr=subprocess.STDOUT, env=job_environment(job), timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = f"timed out after {timeout_s} s"
        if not (WORK / "rows" / f"{stem}.json").is_file():
            servers = "".join(f"\n--- {path.name}\n" + path.read_text(errors="replace")[-2000:]
                              for path in sorted((WORK / "runs" / job).glob("*/serve-*.log")))
            write_error(WORK / "rows" / f"{stem}.json", job, row, JOBS[job].cap_gib,
                        f"exit {code}\n" + log.read_text(errors="replace") + servers)
        print(f"{stem}: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def run_jobs(jobs: list[str]) -> int:
    """The jobs side by side, one process each; waits for all, then marks the work folder done (each job's exit code);
    1 when any job failed."""
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "done").unlink(missing_ok=True)
    (WORK / "jobs.json").write_text(json.dumps({"jobs": jobs, "started": time.time()}))
    children = {}
    for position, job in enumerate(jobs):
        time.sleep(START_STAGGER_S if position else 0)
        if job == "bench-80":
            (WORK / "logs").mkdir(parents=True, exist_ok=True)
            log = (WORK / "logs" / "bench-80.log").open("w")
            device_gib = device_total_gib()
            cap = bench_cap_gib(device_gib)
            micro = bench_micro_batch(cap if cap is not None else device_gib)
            print(f"bench-80: device {device_gib} GiB, cap {cap}, micro-batch {micro}", flush=True)
            children[job] = subprocess.Popen(bench_command(micro, cap), cwd=REPO,
                                             env=job_environment(job, device_gib=device_gib),
                                             stdout=log, stderr=subprocess.STDOUT)
        else:
            children[job] = subprocess.Popen([sys.executable, __file__, "job", job])
    codes = {job: child.wait() for job, child in children.items()}
    (WORK / "done").write_text(json.dumps(codes))
    return 1 if any(codes.values()) else 0  # chain.sh's progress line shows it


def wait_and_collect(out: Path, wait_s: int = WAIT_S) -> int:
    waited = 0
    while not (WORK / "done").is_file() and waited < wait_s:
        time.sleep(10)
        waited += 10
    print("finished" if (WORK / "done").is_file() else f"still running after {waited} s: call wait again")
    target = out / "capped"
    for folder in ("rows", "logs", "bench"):
        if (WORK / folder).is_dir():
            shutil.copytree(WORK / folder, target / folder, dirs_exist_ok=True)
    for path in sorted((target / "rows").glob("*.json")) if (target / "rows").is_dir() else []:
        print(path.name)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("list", "start", "wait", "jobs", "job", "row", "course-row", "report"))
    parser.add_argument("names", nargs="*", help="jobs (start, jobs), a job (job), a job and a row index (row)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--course", type=Path, default=Path("/tmp/course-gpu"), help="course-row: the course's folder")
    parser.add_argument("--cap", type=float, default=24, help="course-row: the cap the course ran under")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if args.what in ("start", "jobs") and name not in (*JOBS, *OPTIONAL)
               or args.what == "job" and name not in JOBS]
    if unknown:
        parser.error(f"unknown job(s) {unknown}: {', '.join(JOBS)}")
    if args.what == "list":
        print(describe_jobs())
    elif args.what == "start":
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.Popen([sys.executable, __file__, "jobs", *(args.names or SIDE_BY_SIDE)], start_new_session=True,
                         stdout=(WORK / "driver.log").open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        print(f"started {' '.join(args.names or SIDE_BY_SIDE)} in its own session; follow {WORK}/driver.log")
    elif args.what == "wait":
        return wait_and_collect(args.out)
    elif args.what == "jobs":
        return run_jobs(args.names or list(SIDE_BY_SIDE))
    elif args.what == "job":
        return run_job(args.names[0])
    elif args.what == "row":
        return run_row(args.names[0], int(args.names[1]))
    elif args.what == "course-row":
        from course_row import write_course_row

        print(write_course_row(args.course, args.cap, args.out / "capped" / "rows"))
    else:
        from lab.capped import capped_rows

        for row in capped_rows(args.names[0] if args.names else HERE / "results"):
            print(row.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
