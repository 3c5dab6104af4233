"""The LLM seam: `LLMClient` protocol plus the adapter for any OpenAI-compatible endpoint.

The only module that imports `openai`. It owns what every call needs regardless of the agent: its own
retries (honouring Retry-After), a cap on parallel calls, a spending budget, a price table, and the
store's call log, which doubles as a cache so a rerun with the same seed is reproducible and free.
The API key lives only in `LLMConfig` and the HTTP client: never logged, stored or shown.
"""
from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import openai

from engine.llm.costs import DEFAULT_PRICES, Budget, BudgetExhausted, PriceTable  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from engine.store.workspace import Store

log = logging.getLogger(__name__)
DEFAULT_MODEL = "gpt-4o-mini"
LOCAL_KEY = "not-needed"  # local servers (vLLM, Ollama, llama.cpp) accept any key
# Environment variable (also accepted as a top-level secrets.toml key) -> LLMConfig field.
ENV_VARS = {"OPENAI_API_KEY": "api_key", "OPENAI_BASE_URL": "base_url", "EVOPOOL_MODEL": "model",
            "EVOPOOL_TEMPERATURE": "temperature", "EVOPOOL_MAX_TOKENS": "max_tokens",
            "EVOPOOL_LLM_TIMEOUT": "timeout_s", "EVOPOOL_LLM_PARALLEL": "max_parallel"}
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_KEY_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-*.]{4,})")


class LLMError(RuntimeError):
    """Base of the errors an LLM call reports to the caller."""


class LLMAuthError(LLMError):
    """The endpoint refused the credentials (or none were given): fix the key, retrying will not help."""


class LLMCallFailed(LLMError):
    """A call failed for good: retries exhausted, or a request the endpoint will never accept."""


@dataclass(frozen=True)
class LLMConfig:
    base_url: str | None = None  # None = OpenAI's own endpoint
    api_key: str | None = field(default=None, repr=False)
    model: str = DEFAULT_MODEL
    temperature: float = 0.7
    max_tokens: int = 1500
    timeout_s: float = 60.0
    max_retries: int = 4
    max_parallel: int = 4
    retry_base_s: float = 1.0  # first backoff wait; doubles per retry
    retry_cap_s: float = 30.0  # no single wait (Retry-After included) is longer

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.public().items())
        return f"LLMConfig({shown})"

    __str__ = __repr__

    def public(self) -> dict[str, Any]:
        """The settings safe to show or store: the key is reduced to whether one is set."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["api_key"] = "***" if self.api_key else None
        return out

    def resolved_api_key(self) -> str:
        if self.api_key:
            return self.api_key
        if self.base_url:
            return LOCAL_KEY
        raise LLMAuthError("no API key: set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server such as "
                           "vLLM, Ollama or llama.cpp, which need no key)")

    @classmethod
    def from_env(cls, overrides: Mapping[str, Any] | None = None, secrets: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> LLMConfig:
        """Settings by precedence: `overrides` > environment > `secrets` (e.g. st.secrets) > defaults.

        `secrets` may hold the environment-variable names at top level and/or an `[llm]` table keyed
        by field name; blank values count as unset.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if secrets:
            values.update(_pick(secrets, ENV_VARS))
            table = secrets.get("llm") if hasattr(secrets, "get") else None
            if table is not None and hasattr(table, "keys"):
                values.update(_pick(table, {f.name: f.name for f in fields(cls)}))
        values.update(_pick(env, ENV_VARS))
        values.update({k: v for k, v in (overrides or {}).items() if v is not None and v != ""})
        known = {f.name: f for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown LLM settings: {sorted(unknown)}")
        return cls(**{k: _coerce(v, known[k].default) for k, v in values.items()})


def _pick(source: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    return {target: source[name] for name, target in names.items()
            if name in source and source[name] is not None and str(source[name]).strip() != ""}


def _coerce(value: Any, default: Any) -> Any:
    """Environment and secrets values are strings: convert to the type of the field's default."""
    try:
        if isinstance(default, bool) or default is None or isinstance(value, type(default)):
            return value.strip() if isinstance(value, str) else value
        return type(default)(value)
    except (TypeError, ValueError):
        raise ValueError(f"LLM setting {value!r} should be a {type(default).__name__}") from None


@dataclass(frozen=True)
class LLMReply:
    text: str
    tokens_in: int
    tokens_out: int
    latency_s: float
    cost_usd: float
    cached: bool = False


class LLMClient(Protocol):
    """What the agents need from an LLM. `seed` picks the sample: same messages + seed = same reply."""

    def complete(self, messages: list[dict], *, role: str, seed: int = 0) -> LLMReply: ...


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def request_hash(model: str, messages: list[dict], temperature: float, max_tokens: int, seed: int) -> str:
    """Cache key: the same request and sample index always map to the same stored reply."""
    payload = {"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
               "seed": seed}
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


_ADAPTED = "request reshaped for the model"


def _apply_param_fixes(request: dict, fixes: set[str]) -> None:
    if "max_completion_tokens" in fixes and "max_tokens" in request:
        request["max_completion_tokens"] = request.pop("max_tokens")
    if "no_temperature" in fixes:
        request.pop("temperature", None)


def _error_message(err: openai.APIStatusError) -> str:
    """The server's own words (`{"error": {"message": ...}}`), without the SDK's "Error code" prefix."""
    body = err.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
    return err.message


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, `retry-after` seconds or HTTP date)."""
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            parsed = email.utils.parsedate_tz(value)
            if parsed is not None:
                return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


class OpenAICompatibleClient:
    """`LLMClient` over the `openai` package, for OpenAI, vLLM, Ollama, llama.cpp server and the like."""

    def __init__(self, config: LLMConfig, store: Store | None = None, prices: PriceTable | None = None,
                 budget: Budget | None = None):
        self.config = config
        self.store = store
        self.prices = prices or PriceTable()
        self.budget = budget or Budget()
        self._slots = threading.Semaphore(max(1, config.max_parallel))
        self._param_fixes: set[str] = set()
        self._key = config.resolved_api_key()
        self._openai = openai.OpenAI(base_url=config.base_url, api_key=self._key, timeout=config.timeout_s,
                                     max_retries=0)

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(model={self.config.model!r}, base_url={self.config.base_url!r})"

    def complete(self, messages: list[dict], *, role: str, seed: int = 0) -> LLMReply:
        cfg = self.config
        rhash = request_hash(cfg.model, messages, cfg.temperature, cfg.max_tokens, seed)
        if self.store is not None:
            cached = self.store.cached_llm_reply(rhash)
            if cached is not None:
                return LLMReply(cached, 0, 0, 0.0, 0.0, cached=True)
        self.budget.reserve_call()
        request = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
                   "max_tokens": cfg.max_tokens, "seed": seed}
        record = {"request_hash": rhash, "role": role, "model": cfg.model, "request": _canonical(request),
                  "prompt_hash": hashlib.sha256(_canonical(messages).encode()).hexdigest()[:16]}
        _apply_param_fixes(request, self._param_fixes)
        attempts, attempt = cfg.max_retries + 1, 0
        while True:
            outcome = self._attempt(request, record, attempt)
            if isinstance(outcome, LLMReply):
                return outcome
            wait, error = outcome
            if error == _ADAPTED:
                continue  # the request was reshaped for this model: resend at once, not a failure
            attempt += 1
            if attempt >= attempts:
                where = cfg.base_url or "the OpenAI API"
                raise LLMCallFailed(f"the {role} call to {cfg.model} at {where} failed after {attempts} "
                                    f"attempts: {error}")
            log.info("%s call failed (%s); retry %d/%d in %.1fs", role, error, attempt, cfg.max_retries, wait)
            time.sleep(wait)

    def _attempt(self, request: dict, record: dict, attempt: int) -> LLMReply | tuple[float, str]:
        """One HTTP request: the reply, or (seconds to wait, what went wrong) when worth retrying."""
        started = time.monotonic()
        with self._slots:
            try:
                response = self._openai.chat.completions.create(**request)
            except openai.APIStatusError as err:
                status, said = err.status_code, self._scrub(_error_message(err))
                self._log(record, None, started, error=f"HTTP {status}: {said}")
                if status in (401, 403):
                    raise LLMAuthError(f"the endpoint refused the API key ({status}) — check OPENAI_API_KEY"
                                       ) from None
                if status == 400 and self._adapt(request, said):
                    return 0.0, _ADAPTED
                if status not in RETRYABLE_STATUS:
                    raise LLMCallFailed(f"the endpoint rejected the request to {request['model']} (HTTP "
                                        f"{status}): {said}") from None
                asked = retry_after_seconds(err.response.headers) if status in (429, 503) else None
                return self._backoff(attempt, asked), f"HTTP {status}"
            except openai.APIConnectionError as err:  # includes APITimeoutError
                kind = "timed out" if isinstance(err, openai.APITimeoutError) else "connection failed"
                self._log(record, None, started, error=f"{kind}: {self._scrub(str(err))}")
                return self._backoff(attempt, None), kind
            except openai.APIError as err:  # e.g. a reply that is not a chat completion
                self._log(record, None, started, error=self._scrub(str(err)))
                raise LLMCallFailed(f"unusable answer from the endpoint: {self._scrub(str(err))}") from None
        return self._success(response, record, started)

    def _adapt(self, request: dict, said: str) -> bool:
        """Newer OpenAI models refuse `max_tokens` (wanting `max_completion_tokens`) or a custom temperature;
        reshape the request once, and every later one, instead of failing."""
        for fix, cue in (("max_completion_tokens", "max_completion_tokens"), ("no_temperature", "temperature")):
            if cue in said and "support" in said.lower() and fix not in self._param_fixes:
                self._param_fixes.add(fix)
                _apply_param_fixes(request, {fix})
                return True
        return False

    def _backoff(self, attempt: int, asked: float | None) -> float:
        cap = self.config.retry_cap_s
        if asked is not None:
            return min(asked, cap)
        return min(cap, self.config.retry_base_s * 2**attempt) * random.uniform(0.75, 1.0)

    def _success(self, response: Any, record: dict, started: float) -> LLMReply:
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = getattr(response, "usage", None)
        tokens_in = getattr(usage, "prompt_tokens", None) or estimate_tokens(record["request"])
        tokens_out = getattr(usage, "completion_tokens", None) or estimate_tokens(text)
        cost = self.prices.cost(self.config.model, tokens_in, tokens_out)
        self.budget.charge(tokens_in + tokens_out, cost)
        latency = self._log(record, text, started, tokens_in, tokens_out, cost)
        return LLMReply(text, tokens_in, tokens_out, latency, cost)

    def _log(self, record: dict, reply: str | None, started: float, tokens_in: int = 0, tokens_out: int = 0,
             cost: float = 0.0, error: str | None = None) -> float:
        latency = time.monotonic() - started
        if self.store is not None:
            self.store.record_llm_call(**record, reply=reply, tokens_in=tokens_in, tokens_out=tokens_out,
                                       latency_s=latency, cost_usd=cost, error=error)
        return latency

    def _scrub(self, text: str) -> str:
        """Error texts may echo (part of) the key: remove it before anything is stored or raised."""
        if self._key and self._key != LOCAL_KEY:
            text = text.replace(self._key, "***")
        return _KEY_LIKE.sub("sk-***", text)
