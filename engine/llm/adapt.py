"""How the client reads the server it talks to: which `response_format` shape it accepts for constrained
decoding, and whether it answers one request at a time (judged from latencies, before anything times out).

Pure bookkeeping without I/O, so the decisions can be tested on given numbers; `client.py` acts on them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The shapes of `response_format` that carry a JSON schema, most widely understood first; a server that
# rejects one gets the next (None: ask without one). OpenAI, vLLM, Ollama (0.5+) and the llama.cpp server
# take "json_schema"; llama-cpp-python's server takes only "json_object" with a "schema" (it answers 500
# to the other), as do older llama.cpp builds.
FORMAT_SHAPES = ("json_schema", "json_object", None)
# What an error message says when the server refused the format (not the prompt or the model).
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|\bschema\b|grammar", re.IGNORECASE)


def response_format(shape: str | None, schema: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The `response_format` request field of one shape (None for no constraint)."""
    if shape == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    if shape == "json_object":
        return {"type": "json_object", "schema": schema}
    return None


def rejects_format(status: int, said: str) -> bool:
    """Whether an error answer to a request with a `response_format` blames that field. Servers differ in
    how: 400 (OpenAI, vLLM), 422 (FastAPI validation) or 500 (llama-cpp-python)."""
    return status in (400, 422, 500) and bool(_FORMAT_WORDS.search(said or ""))


SERIAL_GROWTH = 0.5  # latency grows by at least half its solo value per place further back in the queue
MIN_SAMPLES = 4
STRETCH_AT = 0.5  # an answer that took more than this share of the timeout stretches the timeout


@dataclass(frozen=True)
class Sample:
    position: int  # 1 + the answers to other requests that came while this one was in flight
    latency_s: float
    tokens_out: int


class LatencyWatch:
    """Answered attempts, and whether their latency grows with their place in the server's queue.

    A request's place is 1 + the answers to other requests that arrived while it waited (counted by the
    client, whatever order the server took them in). A server that batches (vLLM, OpenAI) answers parallel
    requests together: they wait for few answers and take about the time of one. A server that answers one
    at a time (llama.cpp, Ollama by default) makes the k-th wait for the k-1 before it: latency grows with
    the place. Latency per reply token is fitted as a + b*place; the relative growth b / (a + b) is about 1
    for a queueing server and near 0 for a batching one.
    """

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, position: int, latency_s: float, tokens_out: int) -> None:
        self.samples.append(Sample(max(1, position), latency_s, tokens_out))

    def growth(self) -> float | None:
        """Relative latency growth per place in the queue, or None without enough evidence (fewer than
        `MIN_SAMPLES` answers, or all at the same place)."""
        points = [(s.position, s.latency_s / max(s.tokens_out, 1)) for s in self.samples]
        ks = {k for k, _ in points}
        if len(points) < MIN_SAMPLES or len(ks) < 2:
            return None
        n = len(points)
        mean_k = sum(k for k, _ in points) / n
        mean_y = sum(y for _, y in points) / n
        slope = (sum((k - mean_k) * (y - mean_y) for k, y in points)
                 / sum((k - mean_k) ** 2 for k, _ in points))
        solo = mean_y - slope * (mean_k - 1)  # fitted latency per token at the head of the queue
        if solo <= 0:
            return float("inf") if slope > 0 else None
        return slope / solo

    def serialised(self) -> bool:
        growth = self.growth()
        return growth is not None and growth >= SERIAL_GROWTH

    def describe(self) -> str:
        """Mean latency per reply token by place, e.g. "answered first: 0.02 s per reply token, 4th: 0.08"."""
        by_k: dict[int, list[float]] = {}
        for s in self.samples:
            by_k.setdefault(s.position, []).append(s.latency_s / max(s.tokens_out, 1))
        return ", ".join(f"{_ordinal(k)} in line: {sum(v) / len(v):.3g} s per reply token"
                         for k, v in sorted(by_k.items()))

    def longest(self) -> float:
        return max((s.latency_s for s in self.samples), default=0.0)


def _ordinal(k: int) -> str:
    return f"{k}{'st' if k == 1 else 'nd' if k == 2 else 'rd' if k == 3 else 'th'}"


def stretched_timeout(timeout_s: float, latency_s: float, cap: float) -> float | None:
    """A longer timeout when an answer came close to the current one (None: keep it)."""
    if latency_s <= STRETCH_AT * timeout_s or timeout_s >= cap:
        return None
    return min(cap, max(2 * timeout_s, 3 * latency_s))
