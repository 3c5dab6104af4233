"""What the agents need from an LLM: `LLMClient`, its `LLMReply`, and the errors a call reports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class LLMError(RuntimeError):
    """Base of the errors an LLM call reports to the caller."""


class LLMAuthError(LLMError):
    """The endpoint refused the credentials (or none were given): fix the key, retrying will not help."""


class LLMCallFailed(LLMError):
    """A call failed for good: retries exhausted, or a request the endpoint will never accept."""


class LLMEndpointDown(LLMCallFailed):
    """The endpoint stopped answering (attempts timed out, or connections failed, `MAX_TIMEOUTS` /
    `MAX_CONNECTION_FAILURES` in a row): the client sends no more calls in this run."""


class LLMCallSkipped(LLMEndpointDown):
    """A call that was not sent, because the endpoint had stopped answering earlier in the run: its caller sent
    nothing, so its message must not claim its own call failed."""


@dataclass(frozen=True)
class LLMReply:
    text: str
    tokens_in: int
    tokens_out: int
    latency_s: float
    cost_usd: float
    cached: bool = False
    finish_reason: str | None = None  # "length": the reply hit max_tokens
    reasoning_only: bool = False  # no answer, only the model's reasoning (`reasoning_content`): it never finished


class LLMClient(Protocol):
    """What the agents need from an LLM. `seed` picks the sample: same messages + seed = same reply.
    `schema`: a JSON schema the reply must follow, enforced by the server where it can (constrained decoding)."""

    def complete(self, messages: list[dict], *, role: str, seed: int = 0,
                 schema: dict | None = None) -> LLMReply: ...
