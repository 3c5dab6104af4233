"""What LLM calls cost and how much a run may spend: an editable price table and a thread-safe budget."""
from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.store.workspace import Store

META_KEY = "llm_budget"  # the workspace's limits, in the store's meta table
LIMITS = ("max_calls", "max_tokens", "max_usd")


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
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: prices are an object of model: [input, output] USD per 1M tokens")
        prices = dict(DEFAULT_PRICES)
        for model, entry in raw.items():
            if isinstance(entry, Mapping):
                pair = (entry.get("input"), entry.get("output"))
            else:
                pair = tuple(entry) if isinstance(entry, (list, tuple)) else (entry,)
            if len(pair) != 2 or not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in pair):
                raise ValueError(f"{path}: price of {model!r} should be [input, output] USD per 1M tokens, "
                                 f"not {entry!r}")
            prices[model] = (float(pair[0]), float(pair[1]))  # type: ignore[arg-type]  # numbers: checked above
        return cls(prices)

    def price(self, model: str) -> tuple[float, float] | None:
        """USD per 1M tokens (in, out): the exact model name first, else the longest known prefix (dated snapshots
        like gpt-4o-2024-08-06), each also without a router's provider prefix (`openai/gpt-4o-mini`, as
        OpenRouter and LiteLLM name models); None when the table does not know the model."""
        for name in dict.fromkeys((model, model.rsplit("/", 1)[-1])):
            if name in self.prices:
                return self.prices[name]
            prefixes = [m for m in self.prices if name.startswith(m)]
            if prefixes:
                return self.prices[max(prefixes, key=len)]
        return None

    def cost(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """What the tokens cost (0 for a model the table does not know: a local one, mostly)."""
        price = self.price(model) or (0.0, 0.0)
        return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000


class Budget:
    """Thread-safe spending limits (None = unlimited), counted per HTTP attempt before it is sent.

    A workspace keeps its limits and its spending (`for_workspace`): a rerun continues from what earlier
    runs spent, so `--max-calls 30` means 30 attempts for the workspace, not per command.
    """

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None,
                 max_usd: float | None = None, *, spent_calls: int = 0, spent_tokens: int = 0,
                 spent_usd: float = 0.0):
        self.max_calls, self.max_tokens, self.max_usd = max_calls, max_tokens, max_usd
        self.calls, self.tokens, self.usd = spent_calls, spent_tokens, spent_usd
        self.start = {"calls": spent_calls, "tokens": spent_tokens, "usd": spent_usd}  # before this run
        # what the calls in flight may still spend (prompt + max_tokens, and its price): a call starts only while
        # spent plus reserved is under the limits, so parallel calls cannot all pass a limit none has reached yet
        self.reserved_tokens, self.reserved_usd = 0, 0.0
        self._lock = threading.Lock()

    @classmethod
    def for_workspace(cls, store: Store, *, save: bool = True, **limits: int | float | None) -> Budget:
        """The workspace's budget: its stored limits overlaid with the given ones (stored again when `save` and some
        limit is given; a negative value removes a limit), and what its call log says was already spent. A run that
        gives none (offline agents, `evopool run` without `--max-*`) stores nothing: no budget was set by it."""
        stored = dict(store.get_meta(META_KEY, {}) or {})
        for name, value in limits.items():
            if name not in LIMITS:
                raise ValueError(f"unknown LLM budget limit {name!r}; expected one of {', '.join(LIMITS)}")
            if value is not None:
                stored[name] = None if value < 0 else value
        stored = {k: v for k, v in stored.items() if v is not None}
        if save and any(value is not None for value in limits.values()):
            store.set_meta(META_KEY, stored)
        spent = store.llm_spent()
        return cls(**stored, spent_calls=int(spent["calls"]), spent_tokens=int(spent["tokens"]),
                   spent_usd=float(spent["usd"]))

    def _spent_reason(self) -> str | None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            return f"{self.calls} of {self.max_calls} calls used (the call limit, --max-calls)"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return f"{self.tokens} of {self.max_tokens} tokens used (the token limit, --max-tokens)"
        if self.max_usd is not None and self.usd >= self.max_usd:
            return f"${self.usd:.4f} of ${self.max_usd:.4f} spent (the dollar limit, --max-usd)"
        return None

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self._spent_reason() is not None

    def reason(self) -> str | None:
        """Which limit is reached, in words naming it (None while there is budget left)."""
        with self._lock:
            return self._spent_reason()

    def _reserved_reason(self) -> str | None:
        """A token or dollar limit that spending plus the calls in flight's reservations reach."""
        if self.max_tokens is not None and self.tokens + self.reserved_tokens >= self.max_tokens:
            return (f"{self.tokens} of {self.max_tokens} tokens used and up to {self.reserved_tokens} more in flight "
                    "(the token limit, --max-tokens)")
        if self.max_usd is not None and self.usd + self.reserved_usd >= self.max_usd:
            return (f"${self.usd:.4f} of ${self.max_usd:.4f} spent and up to ${self.reserved_usd:.4f} more in flight "
                    "(the dollar limit, --max-usd)")
        return None

    def reserve_call(self, tokens: int = 0, usd: float = 0.0) -> None:
        """Count the first attempt of a call about to be sent and hold what it may spend (`tokens`, `usd`: its
        prompt plus max_tokens, and their price; `release` them once it is answered or failed), or refuse it when
        a limit is reached, counting what the calls in flight may still spend."""
        with self._lock:
            reason = self._spent_reason() or self._reserved_reason()
            if reason:
                raise BudgetExhausted(f"LLM budget exhausted: {reason}")
            self.calls += 1
            self.reserved_tokens += tokens
            self.reserved_usd += usd

    def release(self, tokens: int, usd: float) -> None:
        """A call's reservation ends (its real spending is `charge`d)."""
        with self._lock:
            self.reserved_tokens = max(0, self.reserved_tokens - tokens)
            self.reserved_usd = max(0.0, self.reserved_usd - usd)

    def try_attempt(self) -> bool:
        """Count a retry about to be sent; False (and nothing counted) when a limit is reached."""
        with self._lock:
            if self._spent_reason():
                return False
            self.calls += 1
            return True

    def charge(self, tokens: int, usd: float) -> None:
        with self._lock:
            self.tokens += tokens
            self.usd += usd

    def spent(self) -> dict[str, float]:
        with self._lock:
            return {"calls": self.calls, "tokens": self.tokens, "usd": round(self.usd, 6)}

    def summary(self) -> dict[str, Any]:
        """Limits, spending (in all and in this run) and what remains, for the CLI and the studio."""
        with self._lock:
            limits = {"calls": self.max_calls, "tokens": self.max_tokens, "usd": self.max_usd}
            spent = {"calls": self.calls, "tokens": self.tokens, "usd": round(self.usd, 6)}
            this_run = {"calls": self.calls - self.start["calls"], "tokens": self.tokens - self.start["tokens"],
                        "usd": round(self.usd - self.start["usd"], 6)}
            remaining = {k: (None if limit is None else max(0, round(limit - spent[k], 6)))
                         for k, limit in limits.items()}
            return {"limits": limits, "spent": spent, "this_run": this_run, "remaining": remaining,
                    "exhausted": self._spent_reason()}

    def describe(self) -> str:
        """One line: what remains of each limit set."""
        s = self.summary()
        parts = [f"{s['remaining'][k]} of {s['limits'][k]} {unit} left" for k, unit in
                 (("calls", "calls"), ("tokens", "tokens"), ("usd", "USD")) if s["limits"][k] is not None]
        return "; ".join(parts) if parts else f"no limit ({s['spent']['calls']} calls spent so far)"


class Usage:
    """What a client's calls came to in this run: calls, HTTP attempts, tokens, cost and failures by kind."""

    def __init__(self) -> None:
        self.calls = self.cached = self.failed_calls = self.attempts = 0
        self.tokens_in = self.tokens_out = 0
        self.usd = 0.0
        self.failures: dict[str, int] = {}  # per failed attempt: "timed out", "HTTP 503", ...
        self._lock = threading.Lock()

    def add_call(self, *, cached: bool = False) -> None:
        with self._lock:
            self.calls += 1
            self.cached += cached

    def add_attempt(self, failure: str | None = None) -> None:
        with self._lock:
            self.attempts += 1
            if failure:
                self.failures[failure] = self.failures.get(failure, 0) + 1

    def add_reply(self, tokens_in: int, tokens_out: int, usd: float) -> None:
        with self._lock:
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.usd += usd

    def add_failed_call(self) -> None:
        with self._lock:
            self.failed_calls += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": self.calls, "cached": self.cached, "attempts": self.attempts,
                    "failed_calls": self.failed_calls, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                    "cost_usd": round(self.usd, 6), "failures": dict(sorted(self.failures.items()))}

    def describe(self) -> str:
        d = self.as_dict()
        failures = ", ".join(f"{n} {kind}" for kind, n in d["failures"].items()) or "none"
        return (f"{d['calls']} calls ({d['cached']} from the cache, {d['failed_calls']} failed), "
                f"{d['attempts']} HTTP attempts, {d['tokens_in']} + {d['tokens_out']} tokens, "
                f"${d['cost_usd']:.4f}; failed attempts: {failures}")
