"""The LLM seam: `LLMClient` protocol plus the adapter for any OpenAI-compatible endpoint.

The only module that imports `openai`. Retries are the `openai` client's own (`max_retries`: it retries
408/409/429/5xx, timeouts and dropped connections with backoff and honours Retry-After); this module adds a
cap on parallel requests, a spending budget, a price table, and the store's call log (one row per HTTP
attempt, written by the HTTP client openai sends through), which doubles as a cache so a rerun with the
same seed is reproducible and free. It also adapts to the server (`adapt.py`): constrained decoding in the
`response_format` shape the server accepts, fewer parallel requests and longer timeouts for a server that
answers one at a time, and `cancel()` closes the connections of requests nobody waits for any more.
The API key lives only in `LLMConfig` and the HTTP client: never logged, stored or shown.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import openai

from engine.llm import adapt
from engine.llm.costs import DEFAULT_PRICES, Budget, BudgetExhausted, PriceTable, Usage  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from engine.store.workspace import Store

DEFAULT_MODEL = "gpt-4o-mini"
LOCAL_KEY = "not-needed"  # local servers (vLLM, Ollama, llama.cpp) accept any key
# Environment variable (also accepted as a top-level secrets.toml key) -> LLMConfig field.
ENV_VARS = {"OPENAI_API_KEY": "api_key", "OPENAI_BASE_URL": "base_url", "EVOPOOL_MODEL": "model",
            "EVOPOOL_TEMPERATURE": "temperature", "EVOPOOL_MAX_TOKENS": "max_tokens",
            "EVOPOOL_LLM_TIMEOUT": "timeout_s", "EVOPOOL_LLM_PARALLEL": "max_parallel",
            "EVOPOOL_LLM_MODE": "mode", "EVOPOOL_LLM_PRESET": "preset", "EVOPOOL_LLM_RETRIES": "max_retries"}
_KEY_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-*.]{4,})")


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
class LLMConfig:
    base_url: str | None = None  # None = OpenAI's own endpoint
    api_key: str | None = field(default=None, repr=False)
    model: str = DEFAULT_MODEL
    temperature: float = 0.7
    max_tokens: int = 1500
    timeout_s: float = 60.0
    max_retries: int = 4  # the openai client's: attempts = 1 + max_retries
    max_parallel: int = 4
    mode: str = "auto"  # what the agents ask for: "code", "spec" (a JSON spec rendered by the engine), "auto"
    preset: str = ""  # the server kind whose settings filled the unset fields (engine/llm/presets.py)

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
        """Settings by precedence: `overrides` > environment > `secrets` (e.g. st.secrets) > the preset named
        by any of those (`presets.py`) > defaults.

        `secrets` may hold the environment-variable names at top level and/or an `[llm]` table keyed
        by field name; blank values count as unset.
        """
        from engine.llm.presets import preset

        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if secrets:
            values.update(_pick(secrets, ENV_VARS))
            table = secrets.get("llm") if hasattr(secrets, "get") else None
            if table is not None and hasattr(table, "keys"):
                values.update(_pick(table, {f.name: f.name for f in fields(cls)}))
        values.update(_pick(env, ENV_VARS))
        values.update({k: v for k, v in (overrides or {}).items() if v is not None and v != ""})
        if not values.get("preset") and _is_local(values.get("base_url")) and not (
                {"max_parallel", "timeout_s"} & set(values)):
            values["preset"] = "local"  # a server on this machine most likely answers one request at a time
        values = {**preset(values.get("preset")), **values}
        known = {f.name: f for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown LLM settings: {sorted(unknown)}")
        return cls(**{k: _coerce(v, known[k].default) for k, v in values.items()})


def _is_local(base_url: Any) -> bool:
    """Whether an endpoint runs on this machine (loopback), where one-at-a-time servers are the rule."""
    host = urlsplit(str(base_url or "")).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


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
    finish_reason: str | None = None  # "length": the reply hit max_tokens
    reasoning_only: bool = False  # no answer, only the model's reasoning (`reasoning_content`): it never finished


class LLMClient(Protocol):
    """What the agents need from an LLM. `seed` picks the sample: same messages + seed = same reply.
    `schema`: a JSON schema the reply must follow, enforced by the server where it can (constrained decoding)."""

    def complete(self, messages: list[dict], *, role: str, seed: int = 0,
                 schema: dict | None = None) -> LLMReply: ...


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def request_hash(model: str, messages: list[dict], temperature: float, max_tokens: int, seed: int,
                 schema: dict | None = None, base_url: str | None = None) -> str:
    """Cache key: the same request to the same endpoint and sample index always map to the same stored reply. The
    endpoint counts: a local server's model name (`local`) says nothing of which weights it serves."""
    payload = {"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
               "seed": seed}
    if schema is not None:  # absent otherwise, so free-code requests keep their keys
        payload["schema"] = schema
    if base_url:  # absent for OpenAI's own endpoint, whose keys stay as they were
        payload["base_url"] = str(base_url).rstrip("/")
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


def _apply_param_fixes(request: dict, fixes: set[str]) -> None:
    if "max_completion_tokens" in fixes and "max_tokens" in request:
        request["max_completion_tokens"] = request.pop("max_tokens")
    if "no_temperature" in fixes:
        request.pop("temperature", None)
    if "no_seed" in fixes:
        request.pop("seed", None)


# how servers word a parameter they do not take: OpenAI "Unsupported parameter", "... does not support ...",
# "Unrecognized request argument supplied: seed", vLLM / pydantic "Extra inputs are not permitted"
_REFUSES_PARAMETER = ("support", "unrecognized", "unknown", "not permitted", "not allowed", "unexpected")


def _error_message(err: openai.APIStatusError) -> str:
    """The server's own words (`{"error": {"message": ...}}`, or a plain-text body such as Ollama's "404 page not
    found"), without the SDK's "Error code" prefix."""
    text = err.response.text.strip() if isinstance(err.body, str) or err.body is None else ""
    return _said(err.body) or " ".join(text.split())[:300] or err.message


def _said(body: Any) -> str | None:
    """The message of an OpenAI-style error body, if it has one."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
    return None


def _retried_by_openai(status: int) -> bool:
    """The statuses the openai client retries (request timeout, lock timeout, rate limit, server errors)."""
    return status in (408, 409, 429) or status >= 500


# The HTTP library openai sends through (httpx2 in openai 3.x, httpx before): its transport errors are what
# an attempt without an answer raised.
_HTTP = sys.modules[openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]]


@dataclass
class _Call:
    """One `complete` call as its HTTP attempts see it: what to log, and what each attempt came to."""

    record: dict[str, Any]
    outcomes: list[str] = field(default_factory=list)  # per attempt: "ok", "HTTP 503", "timed out", ...
    latency_s: float = 0.0  # of the last attempt
    sent: int = 0  # attempts sent for the current request (the budget reserved some before it)
    format_shape: str | None = None  # the `response_format` shape of the current request (adapt.FORMAT_SHAPES)
    position: int = 1  # 1 + the answers to other requests that came while the last attempt was in flight
    last_said: str = ""  # the server's words with the last attempt that failed (its error message, or why)


MAX_TIMEOUT_S = 600.0
LONG_WAIT_S = 10.0  # a wait before a retry at least this long is said (openai's own backoff stays under it)
MAX_TIMEOUTS = 2  # attempts of one call that may time out: then the server is taken for one that does not answer
# attempts in a row, over all calls, that could not connect or lost the connection with no answer between them: then
# the server is taken for gone (a crashed llama.cpp server cost 15 refused attempts, five per call, before this).
# Requests already in flight together may each fail before any is counted: with N in parallel, up to N fail
MAX_CONNECTION_FAILURES = 2


def _not_a_completion(response: Any) -> str | None:
    """Why a 200 answer is no chat completion, or None: a web page or proxy login the SDK hands back as text, or
    an error body sent with 200 (OpenRouter and some gateways do)."""
    if isinstance(response, str | bytes):
        text = " ".join((response.decode("utf-8", "replace") if isinstance(response, bytes) else response).split())
        return (f"the endpoint answered with a page, not a chat completion ({text[:120]!r}): is the base URL the "
                "API's (it usually ends in /v1), not a web UI's or a proxy's?")
    extra = getattr(response, "model_extra", None) or {}
    error = extra.get("error") if isinstance(extra, Mapping) else None
    if error:
        return f"the endpoint answered 200 with an error: {_said({'error': error}) or error}"
    if not hasattr(response, "choices"):
        return f"the endpoint's answer is not a chat completion ({type(response).__name__})"
    return None


class _Slots:
    """A semaphore whose size can shrink while in use (a one-request-at-a-time server gets one slot)."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.in_use = 0
        self.closed = False  # cancelled: waiters go through at once (and are refused by the caller)
        self._cond = threading.Condition()

    def __enter__(self) -> int:
        """Wait for a slot; returns how many requests (this one included) are then in flight."""
        with self._cond:
            self._cond.wait_for(lambda: self.in_use < self.limit or self.closed)
            self.in_use += 1
            return self.in_use

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self.in_use -= 1
            self._cond.notify_all()

    def shrink_to(self, limit: int) -> None:
        with self._cond:
            self.limit = max(1, limit)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class _RetryRefused(openai.OpenAIError):
    """Raised inside `send` when the budget leaves no room for a retry; openai passes OpenAIErrors through."""


class _FormatRejected(openai.OpenAIError):
    """Raised inside `send` when the server refused the request's `response_format`: not retried as it is
    (llama-cpp-python answers 500, which openai would retry), but asked again in the next shape."""

    def __init__(self, shape: str | None, said: str):
        super().__init__(said)
        self.shape, self.said = shape, said


class _Unanswered(openai.OpenAIError):
    """MAX_TIMEOUTS attempts of a call timed out: no more (an OpenAIError, so openai does not retry it)."""


class _Unreachable(openai.OpenAIError):
    """MAX_CONNECTION_FAILURES attempts in a row failed to connect (or lost their connection): no more."""


class _Unusable(openai.OpenAIError):
    """A 200 answer that is no chat completion (`_not_a_completion`)."""


class _Cancelled(openai.OpenAIError):
    """Raised inside `send` once the client was cancelled: nobody waits for the answer, so no retry."""


def _shutdown(sock: socket.socket) -> None:
    """Both directions: a thread blocked reading wakes at once, and the peer reads end of file."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


class _SocketTracker:
    """The network backend of openai's HTTP pool, wrapped to remember every socket it opens, so `cancel()`
    can shut them down: a thread blocked reading an answer wakes at once, and the server sees the connection
    closed (llama.cpp then drops the queued request, vLLM aborts the running one)."""

    def __init__(self, inner: Any):
        self._inner = inner
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.closed = False  # after shutdown_all, a socket opened by a request already under way is shut too

    def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
        stream = self._inner.connect_tcp(*args, **kwargs)
        self._remember(stream)
        return stream

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        stream = self._inner.connect_unix_socket(*args, **kwargs)
        self._remember(stream)
        return stream

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def _remember(self, stream: Any) -> None:
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.add(sock)
                closed = self.closed
            if closed:
                _shutdown(sock)

    def shutdown_all(self) -> int:
        """Shut down every open socket; returns how many were open."""
        with self._lock:
            self.closed = True
            open_now = [s for s in self._sockets if s.fileno() != -1]
        for sock in open_now:
            _shutdown(sock)
        return len(open_now)

    @classmethod
    def install(cls, client: Any) -> _SocketTracker | None:
        """Wrap the network backend of every connection pool `client` (an httpx Client) sends through; None
        when the HTTP library is laid out differently (then `cancel()` only stops new attempts)."""
        tracker = None
        for transport in (getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()):
            pool = getattr(transport, "_pool", None)
            if pool is not None and hasattr(pool, "_network_backend"):
                tracker = tracker or cls(pool._network_backend)
                pool._network_backend = tracker
        return tracker


class _AttemptLoggingClient(openai.DefaultHttpxClient):
    """openai's default HTTP client, plus: at most `slots` requests in flight, and every attempt logged.

    openai retries by sending again, so each `send` is one attempt: an error answer or a failure without
    one is logged here; a good answer is logged by `complete` once its tokens and cost are known.
    """

    def __init__(self, adapter: OpenAICompatibleClient, slots: int, **kwargs: Any):
        super().__init__(**kwargs)
        self._adapter = adapter
        self.slots = _Slots(slots)
        self.sockets = _SocketTracker.install(self)
        self.cancelled = False
        self._cancel_event = threading.Event()  # ends a wait before a retry (`_InterruptibleOpenAI`)
        self.answers = 0  # HTTP answers received, any status: a request's place in a server's queue
        self._answers_lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        call: _Call | None = getattr(self._adapter._current, "call", None)
        if self.cancelled:
            raise _Cancelled("the LLM client was cancelled")
        if call is not None:
            call.sent += 1
            if call.outcomes.count("timed out") >= MAX_TIMEOUTS:
                # a server that never answers kept a run silent for hours: each retry doubled the timeout
                raise _Unanswered(f"{MAX_TIMEOUTS} attempts timed out")
            if self._adapter.connection_failures >= MAX_CONNECTION_FAILURES:
                raise _Unreachable(f"{self._adapter.connection_failures} connection attempts in a row failed")
            if call.sent > 1 and not self._adapter.budget.try_attempt():
                raise _RetryRefused("the LLM budget allows no retry")  # an OpenAIError: openai does not retry it
        timeouts = getattr(request, "extensions", {}).get("timeout")
        if isinstance(timeouts, dict) and (timeouts.get("read") or 0.0) < self._adapter.timeout_s:
            # openai's retries resend the request with the timeout it began with: a retry after `_timed_out`
            # raised it waits as long as the adapter now says, rather than timing out again at the old value
            request.extensions["timeout"] = {**timeouts, "read": self._adapter.timeout_s,
                                             "write": self._adapter.timeout_s, "pool": self._adapter.timeout_s}
        timeout_used = (getattr(request, "extensions", {}).get("timeout") or {}).get("read") or 0.0
        with self.slots as in_flight:
            if self.cancelled:  # cancelled while waiting for a slot
                raise _Cancelled("the LLM client was cancelled")
            started, answers_before = time.monotonic(), self.answers
            try:
                response = super().send(request, **kwargs)
                if response.status_code >= 400:
                    response.read()  # the error message, for the log (openai reads it too)
                with self._answers_lock:
                    position = 1 + self.answers - answers_before
                    self.answers += 1
                    self._adapter.connection_failures = 0  # it answered (any status): it is there
            except _HTTP.TimeoutException as err:
                self._adapter._attempt_failed(call, started, "timed out", str(err) or "no answer in time")
                self._adapter._timed_out(max(in_flight, self.slots.in_use), timeout_used)
                raise
            except _HTTP.TransportError as err:
                if self.cancelled:
                    self._adapter._attempt_failed(call, started, "cancelled", "the connection was closed by cancel()")
                    raise _Cancelled("the LLM client was cancelled") from None
                with self._answers_lock:
                    self._adapter.connection_failures += 1
                self._adapter._attempt_failed(call, started, "connection failed", str(err) or type(err).__name__)
                raise
        if response.status_code >= 400:
            try:
                said = _said(response.json())
            except ValueError:
                said = None
            said = said or response.text.strip() or response.reason_phrase
            if call is not None and call.format_shape and adapt.rejects_format(response.status_code, said):
                self._adapter._attempt_failed(call, started, "response_format refused",
                                              f"HTTP {response.status_code}: {said}")
                raise _FormatRejected(call.format_shape, f"HTTP {response.status_code}: {said}")
            self._adapter._attempt_failed(call, started, f"HTTP {response.status_code}", said)
        elif call is not None:
            call.outcomes.append("ok")
            call.latency_s = time.monotonic() - started
            call.position = position
            self._adapter.usage.add_attempt()
        return response

    def wait_before_retry(self, seconds: float) -> None:
        """Sleep `seconds` before openai's next attempt, or less when the client is cancelled meanwhile (the
        attempt is then refused at once in `send`). A long wait (a server's Retry-After) is said first: minutes of
        silence looked like a hang."""
        if seconds >= LONG_WAIT_S and self._adapter.on_note is not None:
            self._adapter.on_note(f"the server asked to wait {seconds:.0f} s before the next attempt (Retry-After): "
                                  "waiting")
        self._cancel_event.wait(max(seconds, 0.0))

    def cancel(self) -> int:
        """Refuse every later attempt and close the connections of those in flight; returns how many
        connections were open."""
        self.cancelled = True
        self._cancel_event.set()
        self.slots.close()
        return self.sockets.shutdown_all() if self.sockets is not None else 0


class _InterruptibleOpenAI(openai.OpenAI):
    """openai's client, whose wait before a retry (a server's Retry-After: up to a minute) ends as soon as the
    client is cancelled: a stopped run does not wait for it. `with_options` copies keep the class and share the
    HTTP client, which holds the cancel event. Overrides openai's private `_sleep_for_retry` (signature of openai
    1.x to 3.x); an HTTP client without `wait_before_retry` sleeps as openai does."""

    def _sleep_for_retry(self, *, retries_taken: int, max_retries: int, options: Any, response: Any) -> None:
        wait = getattr(self._client, "wait_before_retry", None)
        if wait is None:
            super()._sleep_for_retry(retries_taken=retries_taken, max_retries=max_retries, options=options,
                                     response=response)
            return
        headers = response.headers if response is not None else None
        wait(self._calculate_retry_timeout(max_retries - retries_taken, options, headers))


class OpenAICompatibleClient:
    """`LLMClient` over the `openai` package, for OpenAI, vLLM, Ollama, llama.cpp server and the like."""

    def __init__(self, config: LLMConfig, store: Store | None = None, prices: PriceTable | None = None,
                 budget: Budget | None = None):
        self.config = config
        self.store = store
        self.prices = prices or PriceTable()
        self.budget = budget or Budget()
        self.usage = Usage()
        self.timeout_s = config.timeout_s  # stretched when the server proves slower than configured
        self.notes: list[str] = []  # how the client adapted to the server, in words
        self.on_note: Callable[[str], None] | None = None
        self.format_shape: str | None = adapt.FORMAT_SHAPES[0]  # how a schema is sent; None once all were refused
        self.latencies = adapt.LatencyWatch()
        self._adapt_lock = threading.Lock()
        self._param_fixes: set[str] = set()
        self._unanswered: str | None = None  # why the server is taken for one that no longer answers
        self.connection_failures = 0  # attempts in a row (any call) that got no connection or lost it, no answer
        self._key = config.resolved_api_key()
        self._current = threading.local()  # the `_Call` this thread is making
        self._http = _AttemptLoggingClient(self, config.max_parallel)
        self._openai = _InterruptibleOpenAI(base_url=config.base_url, api_key=self._key, timeout=config.timeout_s,
                                             max_retries=config.max_retries, http_client=self._http)

    @property
    def parallel(self) -> int:
        """Requests allowed in flight now (1 once the server showed it serves one at a time)."""
        return self._http.slots.limit

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(model={self.config.model!r}, base_url={self.config.base_url!r})"

    def cancel(self) -> int:
        """Abandon every request in flight (closing its connection, so the server can stop working on it)
        and refuse later ones: for a run that is interrupted or stopped. Returns how many connections were
        open."""
        return self._http.cancel()

    def complete(self, messages: list[dict], *, role: str, seed: int = 0,
                 schema: dict | None = None) -> LLMReply:
        cfg = self.config
        rhash = request_hash(cfg.model, messages, cfg.temperature, cfg.max_tokens, seed, schema, cfg.base_url)
        if self.store is not None:
            cached = self.store.cached_llm_answer(rhash)
            if cached is not None:
                self.usage.add_call(cached=True)
                # with its finish reason: a cut-off reply's repair prompt names the limit, as the first run's did
                return LLMReply(cached[0], 0, 0, 0.0, 0.0, cached=True, finish_reason=cached[1])
        if self._unanswered is not None:  # the server stopped answering (timeouts, or connections failing)
            raise LLMCallSkipped(f"the {role} call was not sent: {self._unanswered} (check the server, then run "
                                 "again)")
        request = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
                   "max_tokens": cfg.max_tokens, "seed": seed}
        call = _Call({"request_hash": rhash, "role": role, "model": cfg.model, "request": _canonical(request),
                      "prompt_hash": hashlib.sha256(_canonical(messages).encode()).hexdigest()[:16]})
        _apply_param_fixes(request, self._param_fixes)
        self._current.call = call
        est_in = estimate_tokens(call.record["request"])  # what this call may spend, held while it is in flight
        hold = (est_in + cfg.max_tokens, self.prices.cost(cfg.model, est_in, cfg.max_tokens))
        held = False
        try:
            while True:
                # the first attempt (each retry is counted by the HTTP client), its reservation once
                self.budget.reserve_call(*((0, 0.0) if held else hold))
                held = True
                if not call.sent:
                    self.usage.add_call()
                call.sent = 0
                call.format_shape = self.format_shape if schema is not None else None
                fmt = adapt.response_format(call.format_shape, schema, "annotator_specs") if schema else None
                try:
                    client = self._openai.with_options(timeout=self.timeout_s)
                    response = client.chat.completions.create(**request, **(  # type: ignore[call-overload]
                        {"response_format": fmt} if fmt is not None else {}))
                except _FormatRejected as err:
                    self._format_refused(err)
                    continue  # asked again in the next shape (or without one)
                except openai.BadRequestError as err:
                    if self._adapt(request, self._scrub(_error_message(err))):
                        call.outcomes.clear()  # reshaped for this model: a fresh request, not a failure
                        continue
                    raise
                return self._success(response, call)
        except _Cancelled:
            self.usage.add_failed_call()
            raise LLMCallFailed(f"the {role} call was cancelled (the run no longer needs its answer)") from None
        except _Unanswered:
            self.usage.add_failed_call()
            raise self._stop_asking(role, call) from None
        except _Unreachable:
            self.usage.add_failed_call()
            down = self._stop_asking(role, call, timeouts=False)
            if not call.outcomes:  # began after another call found the server gone: it sent nothing
                raise LLMCallSkipped(f"the {role} call was not sent: {self._unanswered}") from None
            raise down from None
        except _Unusable as err:
            self.usage.add_failed_call()
            said = self._scrub(str(err))
            self._log(call.record, None, call.latency_s, error=said)
            raise LLMCallFailed(f"the {role} call to {self.config.model}: {said}") from None
        except _RetryRefused:
            self.usage.add_failed_call()
            last = call.outcomes[-1] if call.outcomes else "no answer"
            raise BudgetExhausted(f"LLM budget exhausted: {self.budget.reason()}; the {role} call was not "
                                  f"retried after {len(call.outcomes)} failed attempt(s) ({last})") from None
        except openai.APIStatusError as err:
            self.usage.add_failed_call()
            raise self._failure(err, role, call) from None
        except openai.APIConnectionError:  # includes APITimeoutError
            self.usage.add_failed_call()
            if call.outcomes.count("timed out") >= MAX_TIMEOUTS:  # the retries ran out on timeouts alone
                raise self._stop_asking(role, call) from None
            if self.connection_failures >= MAX_CONNECTION_FAILURES:  # the retries ran out on connections failing
                raise self._stop_asking(role, call, timeouts=False) from None
            raise self._gave_up(role, call) from None
        except openai.APIError as err:  # e.g. a reply that is not a chat completion
            self.usage.add_failed_call()
            said = self._scrub(str(err))
            self._log(call.record, None, call.latency_s, error=said)
            raise LLMCallFailed(f"unusable answer from the endpoint: {said}") from None
        finally:
            self._current.call = None
            if held:  # answered (and charged what it spent) or failed: its hold ends
                self.budget.release(*hold)

    def _timed_out(self, in_flight: int, timeout_used: float) -> None:
        """An attempt got no answer in time. With others in flight the server most likely answers one
        request at a time (llama.cpp, Ollama by default): send one at a time and wait longer; alone, wait
        longer. Said once per change, through `on_note`."""
        with self._adapt_lock:
            slots, old = self._http.slots, self.timeout_s
            if timeout_used < old:
                return  # sent before the last adaptation: already answered
            if in_flight > 1 and slots.limit > 1:
                slots.shrink_to(1)
                self.timeout_s = min(MAX_TIMEOUT_S, max(old * 3, 180.0))
                note = (f"requests timed out with {in_flight} in flight: the server seems to answer one at a "
                        f"time, so calls now go one at a time with a {self.timeout_s:.0f} s timeout "
                        f"(was up to {in_flight} at once and {old:.0f} s; set EVOPOOL_LLM_PARALLEL=1 and "
                        f"EVOPOOL_LLM_TIMEOUT, or --llm-preset, to start there)")
            elif old < MAX_TIMEOUT_S:
                self.timeout_s = min(MAX_TIMEOUT_S, old * 2)
                note = f"a request alone timed out after {old:.0f} s: the timeout is now {self.timeout_s:.0f} s"
            else:
                return
            self.notes.append(note)
        if self.on_note is not None:
            self.on_note(note)

    def _format_refused(self, err: _FormatRejected) -> None:
        """The server refused a `response_format` shape: the next calls use the next one (or none), said once
        per change, through `on_note`."""
        with self._adapt_lock:
            if err.shape != self.format_shape:
                return  # another call already stepped past this shape
            shapes = adapt.FORMAT_SHAPES
            self.format_shape = shapes[shapes.index(err.shape) + 1]
            then = (f'now asks with "{self.format_shape}"' if self.format_shape else
                    "asks without one from now on: replies are checked but not constrained")
            said = " ".join(self._scrub(err.said).split())
            note = (f'the server refused response_format "{err.shape}" ({said[:160]}): '
                    f"constrained decoding {then}")
            self.notes.append(note)
        if self.on_note is not None:
            self.on_note(note)

    def _answered(self, call: _Call, tokens_out: int) -> None:
        """Learn from an answered attempt: latency that grows with a request's place in line means a server
        answering one at a time (send one at a time and wait longer), and an answer that came close to the
        timeout stretches it, both before anything times out. Said once per change, through `on_note`."""
        notes = []
        with self._adapt_lock:
            slots = self._http.slots
            if slots.limit > 1:
                self.latencies.add(call.position, call.latency_s, tokens_out)
                if self.latencies.serialised():
                    was, old = slots.limit, self.timeout_s
                    slots.shrink_to(1)
                    self.timeout_s = min(MAX_TIMEOUT_S, max(old, 3 * self.latencies.longest()))
                    notes.append(f"latency grew with each request's place in line ({self.latencies.describe()}): "
                                 f"the server seems to answer one at a time, so calls now go one at a time (was up to "
                                 f"{was}) with a {self.timeout_s:.0f} s timeout (was {old:.0f} s); "
                                 "EVOPOOL_LLM_PARALLEL=1 or --llm-preset starts there")
            longer = adapt.stretched_timeout(self.timeout_s, call.latency_s, MAX_TIMEOUT_S)
            if longer is not None:
                notes.append(f"an answer took {call.latency_s:.0f} s of the {self.timeout_s:.0f} s timeout: the "
                             f"timeout is now {longer:.0f} s")
                self.timeout_s = longer
            self.notes.extend(notes)
        for note in notes:
            if self.on_note is not None:
                self.on_note(note)

    def _failure(self, err: openai.APIStatusError, role: str, call: _Call) -> LLMError:
        """What an error answer the openai client did not (or no longer) retry means for the caller."""
        status = err.status_code
        if status in (401, 403):
            return LLMAuthError(f"the endpoint refused the API key ({status}) — check OPENAI_API_KEY")
        if _retried_by_openai(status):
            return self._gave_up(role, call)
        hint, said = "", _error_message(err).lower()
        if status == 400 and "context" in said and any(w in said for w in ("length", "window", "token")):
            hint = (f" (the prompt and the reply's max_tokens ({self.config.max_tokens}) exceed the model's context: "
                    "lower EVOPOOL_MAX_TOKENS, or use a model with a longer context)")
        base = str(self.config.base_url or "")  # no base URL: the OpenAI API itself, whose 404s name the model
        if status in (404, 405) and base and not base.rstrip("/").endswith("/v1") and _said(err.body) is None:
            hint = (f" (the base URL {self.config.base_url} does not end in /v1, where OpenAI-compatible servers "
                    "answer: Ollama, vLLM and llama.cpp take http://host:port/v1)")
        return LLMCallFailed(f"the endpoint rejected the request to {self.config.model} (HTTP {status}): "
                             f"{self._scrub(_error_message(err))}{hint}")

    def _stop_asking(self, role: str, call: _Call, timeouts: bool = True) -> LLMEndpointDown:
        """MAX_TIMEOUTS attempts of this call timed out, or MAX_CONNECTION_FAILURES attempts in a row found no
        server: it is taken for one that no longer answers, and the run's later calls are not sent."""
        if timeouts:
            why = f"{self._gave_up(role, call)}; none answered within its timeout"
            self._unanswered = self._unanswered or why  # the first call that found it so is the one to name
            return LLMEndpointDown(f"{why}: no more attempts, and no more calls in this run (raise "
                                   "EVOPOOL_LLM_TIMEOUT for a server this slow)")
        where = self.config.base_url or "the OpenAI API"
        why = (f"the LLM endpoint at {where} stopped answering: {MAX_CONNECTION_FAILURES} connection attempts in a "
               "row failed (is the server still running? its log says why it stopped)")
        self._unanswered = self._unanswered or why
        return LLMEndpointDown(f"{self._gave_up(role, call)}; {why}: no more calls in this run")

    @property
    def stopped_answering(self) -> str | None:
        """Why the endpoint is taken for one that no longer answers (no call is sent any more), or None."""
        return self._unanswered

    def _gave_up(self, role: str, call: _Call) -> LLMCallFailed:
        cfg, n = self.config, len(call.outcomes)
        where = cfg.base_url or "the OpenAI API"
        last = call.outcomes[-1] if call.outcomes else "no answer"
        said = f" ({call.last_said[:200]})" if call.last_said and call.last_said != last else ""
        return LLMCallFailed(f"the {role} call to {cfg.model} at {where} failed after {n} attempt"
                             f"{'s' if n != 1 else ''}: {last}{said}")

    def _attempt_failed(self, call: _Call | None, started: float, outcome: str, detail: str) -> None:
        """Log one attempt that got no usable answer (called by the HTTP client, once per attempt)."""
        if call is None:
            return
        self.usage.add_attempt(outcome)
        call.outcomes.append(outcome)
        call.last_said = " ".join(self._scrub(detail).split())
        call.latency_s = time.monotonic() - started
        self._log(call.record, None, call.latency_s, error=f"{outcome}: {self._scrub(detail)}")

    def _adapt(self, request: dict, said: str) -> bool:
        """Newer OpenAI models refuse `max_tokens` (wanting `max_completion_tokens`) or a custom temperature, and
        some servers any `seed`; reshape the request once, and every later one, instead of failing."""
        refused = any(word in said.lower() for word in _REFUSES_PARAMETER)
        for fix, cue in (("max_completion_tokens", "max_completion_tokens"), ("no_temperature", "temperature"),
                         ("no_seed", "seed")):
            if cue in said and refused and fix not in self._param_fixes:
                self._param_fixes.add(fix)
                _apply_param_fixes(request, {fix})
                return True
        return False

    def _success(self, response: Any, call: _Call) -> LLMReply:
        problem = _not_a_completion(response)
        if problem is not None:
            raise _Unusable(problem)
        record = call.record
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        extra = (getattr(choice.message, "model_extra", None) or {}) if choice and choice.message else {}
        reasoning_only = not text.strip() and bool(extra.get("reasoning_content") or extra.get("reasoning"))
        usage = getattr(response, "usage", None)
        tokens_in = getattr(usage, "prompt_tokens", None) or estimate_tokens(record["request"])
        tokens_out = getattr(usage, "completion_tokens", None) or estimate_tokens(text)
        cost = self.prices.cost(self.config.model, tokens_in, tokens_out)
        self._answered(call, tokens_out)
        self.budget.charge(tokens_in + tokens_out, cost)
        self.usage.add_reply(tokens_in, tokens_out, cost)
        finish = getattr(choice, "finish_reason", None) if choice else None
        self._log(record, text, call.latency_s, tokens_in, tokens_out, cost, finish_reason=finish)
        return LLMReply(text, tokens_in, tokens_out, call.latency_s, cost, finish_reason=finish,
                        reasoning_only=reasoning_only)

    def _log(self, record: dict, reply: str | None, latency: float, tokens_in: int = 0, tokens_out: int = 0,
             cost: float = 0.0, error: str | None = None, finish_reason: str | None = None) -> None:
        if self.store is not None:
            self.store.record_llm_call(**record, reply=reply, tokens_in=tokens_in, tokens_out=tokens_out,
                                       latency_s=latency, cost_usd=cost, error=error, finish_reason=finish_reason)

    def _scrub(self, text: str) -> str:
        """Error texts may echo (part of) the key: remove it before anything is stored or raised."""
        if self._key and self._key != LOCAL_KEY:
            text = text.replace(self._key, "***")
        return _KEY_LIKE.sub("sk-***", text)
