"""The HTTP layer under the openai client: one log row per attempt, a cap on requests in flight, connections that
can be closed when nobody waits, and the failures told apart (refused format, no answer, no connection, unusable)."""
from __future__ import annotations

import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai

from engine.llm import adapt
from engine.llm.costs import Budget, Usage


class Attempts(Protocol):
    """What the HTTP layer reads of the client above it (`client.OpenAICompatibleClient`) and tells it of each
    attempt that got no usable answer."""

    _current: threading.local  # the `Call` each thread is making
    budget: Budget
    usage: Usage
    connection_failures: int
    on_note: Callable[[str], None] | None
    timeout_s: float

    def _attempt_failed(self, call: Call | None, started: float, outcome: str, detail: str) -> None: ...

    def _timed_out(self, in_flight: int, timeout_used: float) -> None: ...


def apply_param_fixes(request: dict, fixes: set[str]) -> None:
    if "max_completion_tokens" in fixes and "max_tokens" in request:
        request["max_completion_tokens"] = request.pop("max_tokens")
    if "no_temperature" in fixes:
        request.pop("temperature", None)
    if "no_seed" in fixes:
        request.pop("seed", None)


# how servers word a parameter they do not take: OpenAI "Unsupported parameter", "... does not support ...",
# "Unrecognized request argument supplied: seed", vLLM / pydantic "Extra inputs are not permitted"
REFUSES_PARAMETER = ("support", "unrecognized", "unknown", "not permitted", "not allowed", "unexpected")


def error_message(err: openai.APIStatusError) -> str:
    """The server's own words (`{"error": {"message": ...}}`, or a plain-text body such as Ollama's "404 page not
    found"), without the SDK's "Error code" prefix."""
    text = err.response.text.strip() if isinstance(err.body, str) or err.body is None else ""
    return said_in(err.body) or " ".join(text.split())[:300] or err.message


def said_in(body: Any) -> str | None:
    """The message of an OpenAI-style error body, if it has one."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
    return None


def retried_by_openai(status: int) -> bool:
    """The statuses the openai client retries (request timeout, lock timeout, rate limit, server errors)."""
    return status in (408, 409, 429) or status >= 500


# The HTTP library openai sends through (httpx2 in openai 3.x, httpx before): its transport errors are what
# an attempt without an answer raised.
_HTTP = sys.modules[openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]]


@dataclass
class Call:
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


def not_a_completion(response: Any) -> str | None:
    """Why a 200 answer is no chat completion, or None: a web page or proxy login the SDK hands back as text, or
    an error body sent with 200 (OpenRouter and some gateways do)."""
    if isinstance(response, str | bytes):
        text = " ".join((response.decode("utf-8", "replace") if isinstance(response, bytes) else response).split())
        return (f"the endpoint answered with a page, not a chat completion ({text[:120]!r}): is the base URL the "
                "API's (it usually ends in /v1), not a web UI's or a proxy's?")
    extra = getattr(response, "model_extra", None) or {}
    error = extra.get("error") if isinstance(extra, Mapping) else None
    if error:
        return f"the endpoint answered 200 with an error: {said_in({'error': error}) or error}"
    if not hasattr(response, "choices"):
        return f"the endpoint's answer is not a chat completion ({type(response).__name__})"
    return None


class Slots:
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


class RetryRefused(openai.OpenAIError):
    """Raised inside `send` when the budget leaves no room for a retry; openai passes OpenAIErrors through."""


class FormatRejected(openai.OpenAIError):
    """Raised inside `send` when the server refused the request's `response_format`: not retried as it is
    (llama-cpp-python answers 500, which openai would retry), but asked again in the next shape."""

    def __init__(self, shape: str | None, said: str):
        super().__init__(said)
        self.shape, self.said = shape, said


class Unanswered(openai.OpenAIError):
    """MAX_TIMEOUTS attempts of a call timed out: no more (an OpenAIError, so openai does not retry it)."""


class Unreachable(openai.OpenAIError):
    """MAX_CONNECTION_FAILURES attempts in a row failed to connect (or lost their connection): no more."""


class Unusable(openai.OpenAIError):
    """A 200 answer that is no chat completion (`not_a_completion`)."""


class Cancelled(openai.OpenAIError):
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


class AttemptLoggingClient(openai.DefaultHttpxClient):
    """openai's default HTTP client, plus: at most `slots` requests in flight, and every attempt logged.

    openai retries by sending again, so each `send` is one attempt: an error answer or a failure without
    one is logged here; a good answer is logged by `complete` once its tokens and cost are known.
    """

    def __init__(self, adapter: Attempts, slots: int, **kwargs: Any):
        super().__init__(**kwargs)
        self._adapter = adapter
        self.slots = Slots(slots)
        self.sockets = _SocketTracker.install(self)
        self.cancelled = False
        self._cancel_event = threading.Event()  # ends a wait before a retry (`InterruptibleOpenAI`)
        self.answers = 0  # HTTP answers received, any status: a request's place in a server's queue
        self._answers_lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        call: Call | None = getattr(self._adapter._current, "call", None)
        if self.cancelled:
            raise Cancelled("the LLM client was cancelled")
        if call is not None:
            call.sent += 1
            if call.outcomes.count("timed out") >= MAX_TIMEOUTS:
                # a server that never answers kept a run silent for hours: each retry doubled the timeout
                raise Unanswered(f"{MAX_TIMEOUTS} attempts timed out")
            if self._adapter.connection_failures >= MAX_CONNECTION_FAILURES:
                raise Unreachable(f"{self._adapter.connection_failures} connection attempts in a row failed")
            if call.sent > 1 and not self._adapter.budget.try_attempt():
                raise RetryRefused("the LLM budget allows no retry")  # an OpenAIError: openai does not retry it
        timeouts = getattr(request, "extensions", {}).get("timeout")
        if isinstance(timeouts, dict) and (timeouts.get("read") or 0.0) < self._adapter.timeout_s:
            # openai's retries resend the request with the timeout it began with: a retry after `_timed_out`
            # raised it waits as long as the adapter now says, rather than timing out again at the old value
            request.extensions["timeout"] = {**timeouts, "read": self._adapter.timeout_s,
                                             "write": self._adapter.timeout_s, "pool": self._adapter.timeout_s}
        timeout_used = (getattr(request, "extensions", {}).get("timeout") or {}).get("read") or 0.0
        with self.slots as in_flight:
            if self.cancelled:  # cancelled while waiting for a slot
                raise Cancelled("the LLM client was cancelled")
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
                    raise Cancelled("the LLM client was cancelled") from None
                with self._answers_lock:
                    self._adapter.connection_failures += 1
                self._adapter._attempt_failed(call, started, "connection failed", str(err) or type(err).__name__)
                raise
        if response.status_code >= 400:
            try:
                said = said_in(response.json())
            except ValueError:
                said = None
            said = said or response.text.strip() or response.reason_phrase
            if call is not None and call.format_shape and adapt.rejects_format(response.status_code, said):
                self._adapter._attempt_failed(call, started, "response_format refused",
                                              f"HTTP {response.status_code}: {said}")
                raise FormatRejected(call.format_shape, f"HTTP {response.status_code}: {said}")
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


class InterruptibleOpenAI(openai.OpenAI):
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
