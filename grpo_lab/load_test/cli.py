"""``grpo-lab load-test`` (``python -m grpo_lab.load_test``): serve a model folder on 127.0.0.1 and load-test it."""

from __future__ import annotations

import argparse
import secrets
import sys
from dataclasses import replace

from grpo_lab import models
from grpo_lab.deploy import VLLMServer, verify_export
from grpo_lab.load_test.client import run_load_test, warm_up
from grpo_lab.load_test.config import LoadTest
from grpo_lab.load_test.records import format_table, save_results
from grpo_lab.load_test.workloads import WORKLOADS
from grpo_lab.plots import plot_load_test


def _numbers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive whole numbers, e.g. 1,4,16")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-lab load-test",
                                     description="Serve a model folder on 127.0.0.1 and load-test it with N "
                                                 "concurrent streaming clients; the server stops at the end.")
    parser.add_argument("model", nargs="?", default=str(models.TINY_MODEL_DIR), help="model folder")
    parser.add_argument("--concurrency", type=_numbers, default=[16], help="clients, or a list: 1,4,16 (a sweep)")
    parser.add_argument("--requests", type=int, default=128, help="requests per run (0: until --max-seconds)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="no request starts after this")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="seconds one request may take")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workload", choices=list(WORKLOADS), default="course")
    parser.add_argument("--turns", type=int, default=4, help="user turns per chat (--workload chat)")
    parser.add_argument("--no-stream", action="store_true", help="whole answers instead of streams (no TTFT)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest request (default: deploy.default_max_model_len for the model)")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--log", default=None, help="server log file")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    parser.add_argument("--plot", default=None, help="save the throughput / p99 latency plot here (PNG)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`grpo-lab load-test`: verify the folder, serve it on loopback with a fresh API key, load it, stop it.

    Exits 1 if any request failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    config = LoadTest(concurrency=args.concurrency[0], requests=args.requests or None, max_seconds=args.max_seconds,
                      request_timeout_s=args.request_timeout, max_tokens=args.max_tokens, stream=not args.no_stream,
                      workload=args.workload, turns=args.turns)
    config.validate()
    report = verify_export(args.model, load_weights=False)
    print(report)
    report.raise_if_bad()
    # loopback only and a key of its own: the load goes to this server and nowhere else
    with VLLMServer(args.model, log_path=args.log, host="127.0.0.1", api_key=secrets.token_hex(16),
                    max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                    enable_prefix_caching=not args.no_prefix_caching, block_size=args.block_size) as server:
        print(f"serving {args.model} at {server.base_url} (log: {server.log_path}); warming up")
        warm_up(server, max(args.concurrency))
        results = []
        for concurrency in args.concurrency:
            results.append(run_load_test(server, replace(config, concurrency=concurrency)))
            print(format_table([results[-1].record()]).splitlines()[-1], flush=True)
    records = [r.record() for r in results]
    print(format_table(records))
    for result in results:
        for line in result.first_errors():
            print(f"  concurrency {result.config.concurrency}: {line}")
    if args.out:
        print("results:", save_results(records, args.out, "grpo-lab load-test " + " ".join(argv)))
    if args.plot:
        plot_load_test(records).savefig(args.plot, dpi=120)
        print("plot:", args.plot)
    return 1 if any(r["errors"] for r in records) else 0
