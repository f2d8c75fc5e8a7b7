"""The HF backend, what TRL does without vLLM: ``model.generate`` with ``num_return_sequences``, batched and
left-padded; each call decodes until its longest completion ends (vLLM's continuous batching does not wait)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from grpo_lab import device
from grpo_lab.errors import ConfigError
from grpo_lab.models import load_model_and_tokenizer
from grpo_lab.rollout.config import Sampling
from grpo_lab.rollout.engine import Completion, PromptRollout, RolloutEngine, decode_completion
from grpo_lab.rollout.prompts import EncodedPrompt


class HFEngine(RolloutEngine):
    """Rollouts with transformers' ``generate`` on the detected device."""

    name = "hf"

    def _start(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        kind = self.config.device_kind
        dtype = getattr(torch, self.config.dtype)
        if self.config.load_format == "dummy":  # random weights of the model's shape, like vLLM's "dummy"
            config = AutoConfig.from_pretrained(self.model_path, trust_remote_code=False)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            self.model = model.to(device.torch_device(kind=kind)).eval()
        else:  # the manifest was verified by open_engine; the tokenizer is the engine's shared one
            self.model, _ = load_model_and_tokenizer(self.model_path, device=device.torch_device(kind=kind),
                                                     dtype=dtype, verify=False)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]

    def _generate(self, prompts: list[EncodedPrompt], sampling: Sampling, progress: bool,
                  lengths: tuple[tuple[int, ...], ...] | None = None) -> list[PromptRollout]:
        per_call = max(1, self.config.hf_batch_size // sampling.n)  # prompts per generate call
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].token_ids))  # similar lengths together
        results: list[PromptRollout | None] = [None] * len(prompts)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        batches = [order[i:i + per_call] for i in range(0, len(order), per_call)]
        for batch in tqdm(batches, desc="hf generate", disable=not progress):
            batch_lengths = [lengths[i] for i in batch] if lengths is not None else None
            for index, rollout in zip(batch, self._generate_batch([prompts[i] for i in batch], sampling,
                                                                  batch_lengths)):
                results[index] = rollout
        return results

    def _generate_batch(self, prompts: list[EncodedPrompt], sampling: Sampling,
                        lengths: list[tuple[int, ...]] | None = None) -> list[PromptRollout]:
        torch_device = self.model.device
        width = max(len(p.token_ids) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(prompt.token_ids):] = torch.tensor(prompt.token_ids)
            attention_mask[row, width - len(prompt.token_ids):] = 1
        greedy = sampling.temperature == 0
        options = {"do_sample": False} if greedy else {
            "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0,
            "num_return_sequences": sampling.n}
        if sampling.stop:
            options.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        if sampling.min_tokens:
            options["min_new_tokens"] = sampling.min_tokens
        if lengths is not None:  # rows are prompt-major: the n samples of a prompt follow each other
            from transformers import LogitsProcessorList

            rows = [length for row in lengths for length in (row if not greedy else row[:1])]
            options["logits_processor"] = LogitsProcessorList([ExactLengths(rows, width, self.eos_ids, torch_device)])
        options.update(self.config.hf_generate_options)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids.to(torch_device), attention_mask=attention_mask.to(torch_device),
                max_new_tokens=sampling.max_tokens, eos_token_id=self.eos_ids, pad_token_id=self.pad_id,
                **options)
        new_tokens = output[:, width:].tolist()
        copies = 1 if greedy else sampling.n  # greedy: one decode, repeated n times (all n would be equal)
        rollouts = []
        for row, prompt in enumerate(prompts):
            completions = [self._completion(new_tokens[row * copies + j], sampling)
                           for j in range(copies)] * (sampling.n if greedy else 1)
            rollouts.append(PromptRollout(prompt.text, prompt.token_ids, tuple(completions)))
        return rollouts

    def _completion(self, tokens: list[int], sampling: Sampling) -> Completion:
        """Cut a padded row after its first end token (kept in the ids, as vLLM does)."""
        end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
        if end is not None:
            tokens = tokens[:end + 1]
        return decode_completion(self.tokenizer, tokens, sampling.stop, "stop" if end is not None else "length")

    def _stop(self) -> None:
        self.model = None
        device.release_memory(self.config.device_kind)

    @property
    def supports_sleep(self) -> bool:
        return not device.is_cpu(self.config.device_kind)

    def _no_sleep_reason(self) -> str:
        return "the HF model already lives in host memory on the CPU: nothing to free; stop() releases it"

    def _sleep(self, level: int) -> None:
        self.model.to("cpu")
        device.empty_cache(self.config.device_kind)

    def _wake_up(self) -> None:
        self.model.to(device.torch_device(kind=self.config.device_kind))


class ExactLengths:
    """A logits processor: row ``r`` gets the end token as its ``lengths[r]``-th new token, never earlier."""

    def __init__(self, lengths: list[int], prompt_width: int, eos_ids: list[int], torch_device):
        self.last = torch.tensor(lengths, device=torch_device) - 1  # index of each row's final new token
        self.prompt_width = prompt_width
        self.eos_ids = torch.tensor(eos_ids, device=torch_device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_width  # index of the token chosen now
        scores[:, self.eos_ids] = float("-inf")
        ending = self.last == position
        if bool(ending.any()):
            scores[ending] = float("-inf")
            scores[ending, self.eos_ids[0]] = 0.0
        return scores


def _eos_ids(model, tokenizer) -> list[int]:
    """End-of-sequence ids from the generation config (may be several), else the tokenizer's."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ConfigError("the model has no end-of-sequence token (generation_config.eos_token_id or "
                          "tokenizer.eos_token): generation could never stop early")
    return ids
