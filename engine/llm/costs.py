"""What LLM calls cost and how much a run may spend: an editable price table and a thread-safe budget."""
from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class BudgetExhausted(RuntimeError):
    """The call budget is spent; raised before any request is sent."""


# USD per 1M (input, output) tokens; approximate list prices, edit via PriceTable.from_file.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60), "gpt-4o": (2.50, 10.00), "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1-nano": (0.10, 0.40), "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00), "gpt-5-nano": (0.05, 0.40), "o4-mini": (1.10, 4.40),
}


@dataclass(frozen=True)
class PriceTable:
    """model -> (USD per 1M input tokens, per 1M output). Unknown (e.g. local) models cost 0."""

    prices: Mapping[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))

    @classmethod
    def default(cls) -> PriceTable:
        return cls(dict(DEFAULT_PRICES))

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """Defaults overlaid with a JSON/TOML file of `model = [in, out]` or `{input = .., output = ..}`."""
        path = Path(path)
        raw = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
        prices = dict(DEFAULT_PRICES)
        for model, entry in raw.items():
            pair = (entry["input"], entry["output"]) if isinstance(entry, Mapping) else tuple(entry)
            if len(pair) != 2:
                raise ValueError(f"{path}: price of {model!r} should be [input, output] USD per 1M tokens")
            prices[model] = (float(pair[0]), float(pair[1]))
        return cls(prices)

    def cost(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """Exact model name first, else the longest known prefix (dated snapshots like gpt-4o-2024-08-06)."""
        price = self.prices.get(model)
        if price is None:
            prefixes = [m for m in self.prices if model.startswith(m)]
            price = self.prices[max(prefixes, key=len)] if prefixes else (0.0, 0.0)
        return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000


class Budget:
    """Thread-safe spending limits (None = unlimited). Calls are counted before they are sent."""

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None,
                 max_usd: float | None = None):
        self.max_calls, self.max_tokens, self.max_usd = max_calls, max_tokens, max_usd
        self.calls = self.tokens = 0
        self.usd = 0.0
        self._lock = threading.Lock()

    def _spent_reason(self) -> str | None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            return f"{self.calls} of {self.max_calls} calls used"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return f"{self.tokens} of {self.max_tokens} tokens used"
        if self.max_usd is not None and self.usd >= self.max_usd:
            return f"${self.usd:.4f} of ${self.max_usd:.4f} spent"
        return None

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self._spent_reason() is not None

    def reserve_call(self) -> None:
        with self._lock:
            reason = self._spent_reason()
            if reason:
                raise BudgetExhausted(f"LLM budget exhausted: {reason}")
            self.calls += 1

    def charge(self, tokens: int, usd: float) -> None:
        with self._lock:
            self.tokens += tokens
            self.usd += usd

    def spent(self) -> dict[str, float]:
        with self._lock:
            return {"calls": self.calls, "tokens": self.tokens, "usd": round(self.usd, 6)}
