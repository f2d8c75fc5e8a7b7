"""Query a running server (chat, completion), compare its greedy text with transformers', and the curl line."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_lab.deploy.server import VLLMServer
from grpo_lab.errors import DeployError, ServerDied
from grpo_lab.rollout import Sampling, open_engine


@dataclass
class Reply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def _request_error(exc: Exception, server: VLLMServer) -> DeployError:
    from openai import APIConnectionError, AuthenticationError, BadRequestError

    if isinstance(exc, APIConnectionError) and not server.alive():
        return ServerDied(f"request failed ({type(exc).__name__}): {server.death_report()}")
    too_long = any(word in str(exc).lower() for word in ("context length", "max_model_len", "maximum context"))
    if isinstance(exc, BadRequestError) and too_long:
        return DeployError(f"the request is longer than the server's max_model_len "
                           f"({server.config.max_model_len}): shorten the prompt or max_tokens, or restart "
                           f"the server with a larger max_model_len.\nServer said: {exc}")
    if isinstance(exc, AuthenticationError):
        return DeployError("the server rejected the API key; pass the same api_key to the server and client.")
    return DeployError(f"request failed: {exc}")


def complete(server: VLLMServer, prompt: str, max_tokens: int = 32, temperature: float = 0.0,
             model: str | None = None) -> Reply:
    """``/v1/completions`` on a raw prompt (``model``: the served name, or ``server.config.adapter_name``)."""
    from openai import OpenAIError

    start = time.perf_counter()
    try:
        out = server.client().completions.create(model=model or server.config.served_model_name, prompt=prompt,
                                                 max_tokens=max_tokens, temperature=temperature)
    except OpenAIError as exc:
        raise _request_error(exc, server) from None
    choice = out.choices[0]
    return Reply(choice.text, choice.finish_reason, out.usage.prompt_tokens, out.usage.completion_tokens,
                 time.perf_counter() - start)


def chat(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
         temperature: float = 0.0, model: str | None = None) -> Reply:
    """``/v1/chat/completions``: the server applies the exported chat template (``model``: the served name, or
    ``server.config.adapter_name`` for the LoRA adapter)."""
    from openai import OpenAIError

    start = time.perf_counter()
    try:
        out = server.client().chat.completions.create(model=model or server.config.served_model_name,
                                                      messages=messages, max_tokens=max_tokens,
                                                      temperature=temperature)
    except OpenAIError as exc:
        raise _request_error(exc, server) from None
    choice = out.choices[0]
    return Reply(choice.message.content or "", choice.finish_reason, out.usage.prompt_tokens,
                 out.usage.completion_tokens, time.perf_counter() - start)


@dataclass
class GreedyCheck:
    """transformers greedy vs vLLM greedy on the same chat prompts."""

    total: int
    matches: int
    pairs: list[tuple[str, str]]

    def __str__(self) -> str:
        rows = [f"{self.matches}/{self.total} prompts: transformers and vLLM greedy outputs identical"]
        rows += [f"  {'=' if a == b else '≠'} hf: {a!r}\n    vllm: {b!r}" for a, b in self.pairs]
        return "\n".join(rows)


def compare_greedy(folder: str | Path, server: VLLMServer, prompts: list[list[dict[str, str]]],
                   max_tokens: int = 32, model: str | None = None) -> GreedyCheck:
    """Reload the folder with transformers (the rollout engine's HF backend, fp32) and compare its greedy output
    with the server's.

    Identical text is what intact weights and a shared tokenizer/chat template give in fp32; a mismatch
    on the first tokens means the export or the serving config differs from what was trained.
    """
    with open_engine(str(folder), backend="hf", dtype="float32", n=1, max_tokens=max_tokens, temperature=0.0,
                     prompts=prompts) as engine:
        hf = [texts[0] for texts in engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens,
                                                                      temperature=0.0)).texts]
    served = [chat(server, p, max_tokens=max_tokens, model=model).text for p in prompts]
    pairs = list(zip(hf, served))
    return GreedyCheck(len(pairs), sum(a.strip() == b.strip() for a, b in pairs), pairs)


def curl_command(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
                 model: str | None = None) -> str:
    """The equivalent ``curl`` call for a chat request, to paste into a terminal."""
    body = json.dumps({"model": model or server.config.served_model_name, "messages": messages,
                       "max_tokens": max_tokens, "temperature": 0}, ensure_ascii=False)
    auth = ' -H "Authorization: Bearer $GRPO_LAB_API_KEY"' if server.config.api_key else ""
    return (f"curl -s {server.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")
