"""One load test's shape (:class:`LoadTest`): clients, requests, time bound, workload, lengths."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lab.errors import ConfigError
from grpo_lab.load_test.workloads import WORKLOADS, Conversation, chat_workload, course_workload


@dataclass(frozen=True)
class LoadTest:
    """One load: ``concurrency`` clients until ``requests`` are sent or ``max_seconds`` pass (whichever first)."""

    concurrency: int = 16
    requests: int | None = 128  # None: as many as fit in max_seconds
    max_seconds: float = 120.0  # no request starts after this
    request_timeout_s: float = 60.0
    max_tokens: int = 32
    temperature: float = 0.0
    stream: bool = True
    workload: str = "course"  # a key of WORKLOADS
    turns: int = 4  # user turns per conversation (workload "chat")

    def validate(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append(f"concurrency={self.concurrency}: need at least 1 client")
        if self.requests is not None and self.requests < 1:
            problems.append(f"requests={self.requests}: need at least 1 (or None to run for max_seconds)")
        if not 0 < self.max_seconds <= 3600 or not 0 < self.request_timeout_s <= 3600:
            problems.append(f"max_seconds={self.max_seconds}, request_timeout_s={self.request_timeout_s}: each must "
                            "be in (0, 3600]; a load test is bounded")
        if self.max_tokens < 1:
            problems.append(f"max_tokens={self.max_tokens}: need at least 1")
        if self.workload not in WORKLOADS:
            problems.append(f"workload={self.workload!r}: use one of {', '.join(WORKLOADS)}")
        if self.turns < 1:
            problems.append(f"turns={self.turns}: need at least 1")
        if problems:
            raise ConfigError("bad load test: " + "; ".join(problems) + ".")

    def conversations(self) -> list[Conversation]:
        return chat_workload(self.turns) if self.workload == "chat" else course_workload()
