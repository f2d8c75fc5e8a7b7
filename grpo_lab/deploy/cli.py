"""`grpo-lab serve`: verify a folder, serve it until stopped, or answer one prompt."""

from __future__ import annotations

import argparse
import os
import time

from grpo_lab import models
from grpo_lab.deploy.export import verify_export
from grpo_lab.deploy.query import chat, curl_command
from grpo_lab.deploy.server import VLLMServer, served_quantization, served_weights


STOP_HELP = ("What stops the server: Ctrl-C (SIGINT) or SIGTERM to this command (kill PID, systemd, docker stop) "
             "stops it gracefully, its whole process group (API server, engine core, workers), then this command "
             "exits; if this command is killed outright (kill -9, the OOM killer, a crash) the server's watchdog ends "
             "the group within a few seconds. Either way the port is free again. `grpo-lab doctor` lists vLLM "
             "processes of yours that still hold a device or a port, with the command to stop them.")


def main(argv: list[str] | None = None) -> int:
    """`grpo-lab serve`: verify a folder, serve it until Ctrl-C (or answer one prompt with --ask)."""
    parser = argparse.ArgumentParser(prog="grpo-lab serve", description="Serve a model folder with vLLM.",
                                     epilog=STOP_HELP)
    parser.add_argument("model", nargs="?", default=str(models.TINY_MODEL_DIR),
                        help="model folder, or a training run (its final/: a LoRA run's adapter merged)")
    parser.add_argument("--lora", action="store_true",
                        help="a LoRA run (or adapter folder): serve the adapter on its base with vLLM's LoRA serving")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--api-key", default=os.environ.get("GRPO_LAB_API_KEY"), help="require this key")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest request (default: deploy.default_max_model_len for the model)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--log", default=None, help="server log file")
    parser.add_argument("--ask", default=None, help="send one chat message, print the reply, stop")
    args = parser.parse_args(argv)
    model, adapter = served_weights(args.model, adapter=args.lora)
    if adapter is None:
        report = verify_export(model, load_weights=False)
        print(report)
        report.raise_if_bad()
    server = VLLMServer(model, log_path=args.log, host=args.host, port=args.port, api_key=args.api_key,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        enable_prefix_caching=not args.no_prefix_caching, lora_adapter=adapter,
                        quantization=served_quantization(args.model, adapter=args.lora))
    with server:
        name = server.config.adapter_name if adapter else server.config.served_model_name
        print(f"serving {model}{f' with the LoRA adapter {adapter} as {name!r}' if adapter else ''} at "
              f"{server.base_url}/v1 (log: {server.log_path}); Ctrl-C or `kill {os.getpid()}` stops it")
        messages = [{"role": "user", "content": args.ask or "Hello"}]
        print("try:", curl_command(server, messages, model=name))
        if args.ask:
            print(chat(server, messages, model=name).text)
            return 0
        try:
            while server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping")
        return 0 if server.process is None or server.process.poll() in (None, 0) else 1
