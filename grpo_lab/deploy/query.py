"""Query a running server (chat, completion), compare its greedy text with transformers', and the curl line."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.deploy.server import VLLMServer
from grpo_lab.errors import DeployError, ServerDied
from grpo_lab.rollout import Sampling, open_engine
from grpo_lab.servers import ranked_prompt_tokens


@dataclass
class Reply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def _request(server: VLLMServer, chat: bool, model: str | None, **kwargs: Any) -> Any:
    """``/v1/chat/completions`` (``chat``) or ``/v1/completions``, its errors said for people."""
    from openai import APIConnectionError, AuthenticationError, BadRequestError, OpenAIError

    endpoint = server.client().chat.completions if chat else server.client().completions
    try:
        return endpoint.create(model=model or server.config.served_model_name, **kwargs)
    except OpenAIError as exc:
        if isinstance(exc, APIConnectionError) and not server.alive():
            raise ServerDied(f"request failed ({type(exc).__name__}): {server.death_report()}") from None
        too_long = any(word in str(exc).lower() for word in ("context length", "max_model_len", "maximum context"))
        if isinstance(exc, BadRequestError) and too_long:
            raise DeployError(f"the request is longer than the server's max_model_len "
                              f"({server.config.max_model_len}): shorten the prompt or max_tokens, or restart "
                              f"the server with a larger max_model_len.\nServer said: {exc}") from None
        if isinstance(exc, AuthenticationError):
            raise DeployError("the server rejected the API key; pass the same api_key to the server and "
                              "client.") from None
        raise DeployError(f"request failed: {exc}") from None


def complete(server: VLLMServer, prompt: str, max_tokens: int = 32, temperature: float = 0.0,
             model: str | None = None) -> Reply:
    """``/v1/completions`` on a raw prompt (``model``: the served name, or ``server.config.adapter_name``)."""
    start = time.perf_counter()
    out = _request(server, False, model, prompt=prompt, max_tokens=max_tokens, temperature=temperature)
    choice = out.choices[0]
    return Reply(choice.text, choice.finish_reason, out.usage.prompt_tokens, out.usage.completion_tokens,
                 time.perf_counter() - start)


def chat(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
         temperature: float = 0.0, model: str | None = None) -> Reply:
    """``/v1/chat/completions`` with the exported chat template (``model``: as for :func:`complete`)."""
    start = time.perf_counter()
    out = _request(server, True, model, messages=messages, max_tokens=max_tokens, temperature=temperature)
    choice = out.choices[0]
    return Reply(choice.message.content or "", choice.finish_reason, out.usage.prompt_tokens,
                 out.usage.completion_tokens, time.perf_counter() - start)


TOKEN_AGREEMENT_FLOOR = 0.90
"""The share of transformers' greedy tokens the server must also rank first, fed transformers' own text (a server in
bf16 breaks near-ties differently, so its greedy text may go elsewhere, but it still ranks nearly every token first)."""


@dataclass
class GreedyCheck:
    """transformers vs vLLM greedy on the same chat prompts: identical texts, and the share of transformers' tokens the
    server ranks first when fed transformers' text."""

    total: int
    matches: int
    pairs: list[tuple[str, str]]
    agreeing_tokens: int = 0
    compared_tokens: int = 0

    @property
    def token_agreement(self) -> float:
        return self.agreeing_tokens / self.compared_tokens if self.compared_tokens else float("nan")

    def agrees(self, floor: float = TOKEN_AGREEMENT_FLOOR) -> bool:
        """The server holds the weights transformers loaded: every text identical, or ``floor`` of the tokens."""
        return self.matches == self.total or self.token_agreement >= floor

    def __str__(self) -> str:
        rows = [f"{self.matches}/{self.total} prompts: transformers and vLLM greedy outputs identical; fed "
                f"transformers' text, the server ranks {self.agreeing_tokens} of its {self.compared_tokens} tokens "
                f"first ({self.token_agreement:.1%})"]
        rows += [f"  {'=' if a == b else '≠'} hf: {a!r}\n    vllm: {b!r}" for a, b in self.pairs]
        return "\n".join(rows)


def top_token_agreement(server: VLLMServer, prompt_ids: list[int], completion_ids: list[int],
                        model: str | None = None) -> int:
    """How many of ``completion_ids`` the server ranks first at their position after the prompt and the tokens before
    them (vLLM's ``prompt_logprobs``: one forward pass, nothing sampled)."""
    out = _request(server, False, model, prompt=list(prompt_ids) + list(completion_ids), max_tokens=1,
                   temperature=0.0, extra_body={"prompt_logprobs": 1})
    ranked = out.choices[0].model_dump().get("prompt_logprobs")
    if not ranked:
        raise DeployError("the server returned no prompt_logprobs: this vLLM does not support them on /v1/completions")
    positions = ranked_prompt_tokens(ranked)[len(prompt_ids):]
    return sum(next(token for token, (_, rank) in candidates.items() if rank == 1) == expected
               for candidates, expected in zip(positions, completion_ids))


def compare_greedy(folder: str | Path, server: VLLMServer, prompts: list[list[dict[str, str]]],
                   max_tokens: int = 32, model: str | None = None) -> GreedyCheck:
    """Compare transformers' greedy output (HF backend, fp32) with the server's: the texts, and each of transformers'
    tokens against the server's first choice there (a mismatch means the export or serving config differs)."""
    with open_engine(str(folder), backend="hf", dtype="float32", n=1, max_tokens=max_tokens, temperature=0.0,
                     prompts=prompts) as engine:
        rollouts = engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens, temperature=0.0)).outputs
    hf = [rollout.completions[0].text for rollout in rollouts]
    served = [chat(server, p, max_tokens=max_tokens, model=model).text for p in prompts]
    pairs = list(zip(hf, served))
    agreeing = sum(top_token_agreement(server, r.prompt_token_ids, r.completions[0].token_ids, model)
                   for r in rollouts)
    compared = sum(len(r.completions[0].token_ids) for r in rollouts)
    return GreedyCheck(len(pairs), sum(a.strip() == b.strip() for a, b in pairs), pairs, agreeing, compared)


def curl_command(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
                 model: str | None = None) -> str:
    """The equivalent ``curl`` call for a chat request, to paste into a terminal."""
    body = json.dumps({"model": model or server.config.served_model_name, "messages": messages,
                       "max_tokens": max_tokens, "temperature": 0}, ensure_ascii=False)
    auth = ' -H "Authorization: Bearer $GRPO_LAB_API_KEY"' if server.config.api_key else ""
    return (f"curl -s {server.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")
