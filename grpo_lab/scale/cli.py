"""``grpo-lab scale`` (``python -m grpo_lab.scale``): the layout options, then every ``grpo-lab train`` option."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
from collections.abc import Callable

from grpo_lab import train
from grpo_lab.errors import GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.scale.config import RESULT_FILE, SERVER_LOG, TRAINER_LOG, WEIGHT_SYNC_MODES, ServerModeConfig
from grpo_lab.scale.planning import LAYOUTS, plan_resources
from grpo_lab.scale.runner import ServerModeResult, run_server_mode, run_trainer


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit``, so that the ``finally`` blocks stop the server and the trainer."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def device_indices(text: str) -> tuple[int, ...]:
    """``"0,1"`` -> ``(0, 1)``: a ``--rollout-devices`` / ``--train-devices`` value."""
    return tuple(int(v) for v in text.split(",") if v.strip())


SCALE_DESCRIPTION = ("GRPO with TRL's server mode: vLLM on its own device(s), the trainer on the others. Every "
                     "`grpo-lab train` option is accepted too (run `grpo-lab train --help`).")


def build_parser(prog: str = "grpo-lab scale", description: str = SCALE_DESCRIPTION,
                 plans: bool = True) -> argparse.ArgumentParser:
    """The server-layout options (and ``--plan`` where ``plans``); the rest goes to ``grpo-lab train``'s."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False, description=description)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--rollout-devices", type=device_indices, default=None, help="e.g. 0 (default: plan_devices)")
    parser.add_argument("--train-devices", type=device_indices, default=None, help="e.g. 1")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    parser.add_argument("--weight-sync", choices=WEIGHT_SYNC_MODES, default=None,
                        help="default: nccl on CUDA, file elsewhere")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the server")
    parser.add_argument("--train-timeout", type=float, default=None, help="seconds before the trainer is stopped")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more vLLM server flag, repeatable (e.g. --server-arg=--enforce-eager)")
    if plans:
        parser.add_argument("--plan", type=int, metavar="N", default=None,
                            help="print the resource plans for N devices (colocate, server, verl) and exit")
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]
                       ) -> tuple[argparse.Namespace, ServerModeConfig, TrainConfig]:
    """The layout options, their :class:`ServerModeConfig` and the ``TrainConfig`` of the remaining options."""
    args, rest = parser.parse_known_args(argv)
    overrides = {k: v for k, v in vars(train.build_parser().parse_args(rest)).items() if v is not dataclasses.MISSING}
    overrides.setdefault("live_plot", False)
    config = ServerModeConfig(rollout_devices=args.rollout_devices, train_devices=args.train_devices, port=args.port,
                              weight_sync=args.weight_sync, startup_timeout_s=args.startup_timeout,
                              train_timeout_s=args.train_timeout, extra_server_args=tuple(args.server_arg))
    return args, config, TrainConfig(**overrides) if not args.help else TrainConfig()


def print_commands(result: ServerModeResult, result_file: str = RESULT_FILE) -> None:
    print(f"run folder {result.run_dir} ({result_file}, {SERVER_LOG}, {TRAINER_LOG})")
    print("server:  " + shlex.join(result.server_command))
    print("trainer: " + shlex.join(result.trainer_command))


def run_command(argv: list[str] | None, parser: argparse.ArgumentParser, trainer_entry: Callable[[str], int],
                run: Callable[..., ServerModeResult | None], result_file: str = RESULT_FILE,
                errors: tuple[type[Exception], ...] = (GrpoLabError,)) -> int:
    """A server-layout command: the trainer entry that ``accelerate launch`` runs (``trainer SPEC``), else parse,
    ``run(args, config, train_config)`` (None: it only printed) and report the result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trainer"]:
        return trainer_entry(argv[1])
    exit_on_sigterm()
    try:
        args, config, train_config = parse_command_line(parser, argv)
        if args.help:
            parser.print_help()
            return 0
        result = run(args, config, train_config)
    except errors as error:
        print(f"{parser.prog}: {error}")
        return 2
    if result is not None:
        print(f"done: {result.global_step} steps, median step {result.median_step_seconds():.2f} s{result.summary()}")
        print_commands(result, result_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab scale [--rollout-devices 0 --train-devices 1] [grpo-lab train options]``."""
    def run(args: argparse.Namespace, config: ServerModeConfig, train_config: TrainConfig) -> ServerModeResult | None:
        if not args.plan:
            return run_server_mode(config, train_config)
        for layout in LAYOUTS:
            print(plan_resources(args.plan, layout).table(), end="\n\n")
        return None

    return run_command(argv, build_parser(), run_trainer, run)
