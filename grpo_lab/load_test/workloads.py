"""What the clients send: the course's prompts one turn each, or multi-turn chats under a shared system prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpo_lab.data import load_split

# The chat workload's shared system prompt: long enough to fill whole KV blocks, so prefix caching has something to
# reuse before the history grows.
CHAT_SYSTEM_PROMPT = (
    "You are a patient maths tutor for primary-school pupils. Read each question carefully. Write the "
    "calculation on one line, using the numbers from the question, then give the final answer on the last line "
    "as #### followed by the number. Keep units out of the final line. If a question is unclear, still give "
    "your best answer.")


@dataclass(frozen=True)
class Conversation:
    """One client's chat: ``turns`` are user messages sent one after the other; every request re-sends the history
    (the system prompt, the earlier turns and the server's replies), as a chat UI does."""

    turns: tuple[str, ...]
    system: str | None = None

    def messages(self, replies: Sequence[str]) -> list[dict[str, str]]:
        """The request for turn ``len(replies)``: the history so far, then that turn's user message."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for turn, reply in zip(self.turns, replies):
            out += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
        return out + [{"role": "user", "content": self.turns[len(replies)]}]


def course_workload(split: str = "eval") -> list[Conversation]:
    """The course's prompts (one user turn each): what the trained model was asked in training."""
    return [Conversation(tuple(m["content"] for m in row["prompt"] if m["role"] == "user"),
                         next((m["content"] for m in row["prompt"] if m["role"] == "system"), None))
            for row in load_split(split)]


def chat_workload(turns: int = 4, split: str = "eval", system: str = CHAT_SYSTEM_PROMPT) -> list[Conversation]:
    """Multi-turn chats for the prefix-caching comparison: the course's questions, ``turns`` per conversation, under
    one system prompt; every turn re-sends the history, which prefix caching computes only once."""
    questions = [turn for conversation in course_workload(split) for turn in conversation.turns]
    return [Conversation(tuple(questions[i:i + turns]), system)
            for i in range(0, len(questions) - turns + 1, turns)]


WORKLOADS = {"course": "the course's eval prompts, one turn each",
             "chat": "multi-turn chats under a shared system prompt, the history re-sent every turn"}
