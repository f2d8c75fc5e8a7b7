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

from __future__ import annotations

__all__ = [
    "ServeConfig", "VLLMServer", "chat", "compare_greedy", "complete", "curl_command", "export_model", "served_weights",
    "suggest_max_model_len", "verify_export",
]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
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
