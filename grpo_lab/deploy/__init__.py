"""From a trained policy to a running vLLM OpenAI-compatible server: export a self-contained folder (safetensors,
tokenizer, chat template, generation config, manifest of checksums), verify it, compare transformers' greedy output
with vLLM's, serve it with ``python -m vllm.entrypoints.openai.api_server`` (in the CPU, CUDA and Ascend builds
alike) and query it with the ``openai`` client.

>>> from grpo_lab import deploy                                    # doctest: +SKIP
>>> folder = deploy.export_model("runs/grpo/final", "runs/export")   # doctest: +SKIP
>>> with deploy.VLLMServer(folder) as server:                        # doctest: +SKIP
...     print(deploy.complete(server, "1 + 1 =").text)

Modules: ``export`` (the folder, its verification), ``server`` (vLLM's server as a watched child process, what a run
serves), ``query`` (chat, completion, the greedy check), ``cli`` (``grpo-lab serve``).
"""

from grpo_lab.deploy.cli import STOP_HELP, main
from grpo_lab.deploy.export import REQUIRED_FILES, TOKENIZER_FILES, VerifyReport, export_model, verify_export
from grpo_lab.deploy.query import (
    TOKEN_AGREEMENT_FLOOR,
    GreedyCheck,
    Reply,
    chat,
    compare_greedy,
    complete,
    curl_command,
    top_token_agreement,
)
from grpo_lab.deploy.server import (
    ADAPTER_CONFIG,
    FOUR_BIT_QUANTIZATION,
    ServeConfig,
    VLLMServer,
    VLLM_LORA_RANKS,
    default_max_model_len,
    serve_config,
    served_quantization,
    served_weights,
    suggest_max_model_len,
)
from grpo_lab.errors import DeployError, ServerDied

__all__ = [
    "ADAPTER_CONFIG",
    "DeployError",
    "FOUR_BIT_QUANTIZATION",
    "GreedyCheck",
    "REQUIRED_FILES",
    "Reply",
    "STOP_HELP",
    "ServeConfig",
    "ServerDied",
    "TOKENIZER_FILES",
    "TOKEN_AGREEMENT_FLOOR",
    "VLLMServer",
    "VLLM_LORA_RANKS",
    "VerifyReport",
    "chat",
    "compare_greedy",
    "complete",
    "curl_command",
    "default_max_model_len",
    "export_model",
    "main",
    "serve_config",
    "served_quantization",
    "served_weights",
    "suggest_max_model_len",
    "top_token_agreement",
    "verify_export",
]

# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

__getattr__ = moved_names(__name__, moved={
    name: f"grpo_lab.servers:{name}" for name in ("LOG_TAIL_LINES", "port_is_free", "wait_until_healthy")}, since="0.2.0")
