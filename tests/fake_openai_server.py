"""A scripted OpenAI-compatible chat server on 127.0.0.1, for driving the real `openai` client over HTTP.

Each test queues what the server should do with the next requests: answer with a text, fail with an HTTP
status (and headers such as Retry-After), or hang for a while. A queued step may carry `when`, a substring
the request body must contain, so parallel callers still get the step meant for them. Every request body
and its headers are recorded for assertions. An empty queue answers 500 with a message saying so.

`die()` queues a crash: that request's connection is closed unanswered and the server stops listening, so later
connections are refused, as with a server process that died on its first chat request (a llama.cpp build for
another CPU: exit 132, illegal instruction). `drop()` closes one request's connection unanswered and goes on.

`serial=True` makes it answer one chat request at a time, as llama.cpp does: the others wait their turn.
A client that closes its connection while its request hangs or waits is noticed, as llama.cpp notices
before it starts a queued request: the request is dropped unanswered and listed in `closed_by_client`.
"""
from __future__ import annotations

import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest


@dataclass
class Step:
    """What the server does with one request."""

    text: str | None = None  # the assistant message, for a 200 reply
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    message: str | None = None  # the error message of a failing step
    hang_s: float = 0.0  # wait this long before answering (clients with a shorter timeout give up)
    usage: dict[str, int] | None | bool = True  # True: counted from the text; None/False: no usage field
    when: str | None = None  # only for a request whose body contains this substring
    finish_reason: str = "stop"  # "length": the reply hit max_tokens
    raw: tuple[str, str] | None = None  # (content type, body) sent as is with `status`: a proxy's page, plain text
    drop: bool = False  # close this connection unanswered
    die: bool = False  # ... and stop listening: the server process crashed


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]  # names in lower case
    at: float  # time.monotonic() on arrival

    @property
    def last_user_message(self) -> str:
        users = [m["content"] for m in self.body.get("messages", []) if m.get("role") == "user"]
        return users[-1] if users else ""


class FakeOpenAIServer:
    """Start with `with FakeOpenAIServer() as server:`; point clients at `server.base_url`."""

    def __init__(self, serial: bool = False) -> None:
        self._steps: list[Step] = []
        self._lock = threading.Lock()
        self._serial = _FifoLock() if serial else None  # held while one chat request is answered
        self.closed_by_client: list[str] = []  # last user message of each request dropped unanswered
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self.requests: list[Recorded] = []
        self.in_flight = 0
        self.max_in_flight = 0  # most chat requests being handled at the same moment
        self.answered = 0  # chat completions sent in full (status 200)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-openai",
                                        daemon=True)

    # ---- scripting -----------------------------------------------------------------------------
    def reply(self, text: str, *, usage: dict[str, int] | None | bool = True, when: str | None = None,
              finish_reason: str = "stop") -> None:
        self._push(Step(text=text, usage=usage, when=when, finish_reason=finish_reason))

    def fail(self, status: int, *, headers: dict[str, str] | None = None, message: str | None = None,
             when: str | None = None) -> None:
        self._push(Step(status=status, headers=dict(headers or {}), message=message, when=when))

    def raw(self, status: int, body: str, content_type: str = "text/html") -> None:
        """Answer with `body` as it is, not an OpenAI-shaped reply: what a proxy, a web UI or a server's plain-text
        404 sends."""
        self._push(Step(status=status, raw=(content_type, body)))

    def hang(self, seconds: float, *, then: str | None = None, when: str | None = None) -> None:
        self._push(Step(text=then if then is not None else "", hang_s=seconds, when=when))

    def die(self) -> None:
        """The next request crashes the server: no answer, and every later connection is refused."""
        self._push(Step(drop=True, die=True))

    def drop(self) -> None:
        """The next request's connection is closed unanswered; the server goes on listening."""
        self._push(Step(drop=True))

    def _push(self, step: Step) -> None:
        with self._lock:
            self._steps.append(step)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._steps)

    def _next_step(self, raw_body: str) -> Step | None:
        with self._lock:
            for i, step in enumerate(self._steps):
                if step.when is None or step.when in raw_body:
                    return self._steps.pop(i)
        return None

    # ---- lifecycle -----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stopping.is_set():
            return  # stopped already (a scripted crash)
        self._stopping.set()  # wakes hanging handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- HTTP ----------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the recorded requests are the log."""

            def finish(self) -> None:
                try:
                    super().finish()
                except OSError:
                    pass  # the connection was shut (a scripted crash)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                                 "created": 0, "owned_by": "tests"}]})
                else:
                    self._json(404, _error("not found", "invalid_request_error"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode("utf-8")
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    self._json(400, _error("request body is not JSON", "invalid_request_error"))
                    return
                with server._lock:
                    server.requests.append(Recorded(self.path, body, {k.lower(): v for k, v in self.headers.items()},
                                                    time.monotonic()))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, _error(f"no route {self.path}", "invalid_request_error"))
                    return
                if server._serial is None:
                    self._handle(body, raw)
                    return
                with server._serial:  # one at a time; a client that left while queued is not served
                    if self._client_left():
                        server._dropped(body)
                        return
                    self._handle(body, raw)

            def _handle(self, body: dict, raw: str) -> None:
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(body, server._next_step(raw))
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _client_left(self) -> bool:
                """Whether the client closed its side (EOF waiting on the socket), without consuming data."""
                try:
                    readable, _, _ = select.select([self.connection], [], [], 0)
                    return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def _wait(self, seconds: float) -> bool:
                """Hang for `seconds`; False when the server stops or the client leaves meanwhile."""
                deadline = time.monotonic() + seconds
                while (left := deadline - time.monotonic()) > 0:
                    if server._stopping.wait(min(0.02, left)):
                        return False
                    if self._client_left():
                        return False
                return True

            def _answer(self, body: dict, step: Step | None) -> None:
                if step is None:
                    self._json(500, _error("fake server: no scripted reply left for this request", "server_error"))
                    return
                if step.drop:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)  # the client reads end of file, no answer
                    except OSError:
                        pass
                    if step.die:
                        server.stop()  # listening ends: later connections are refused
                    return
                if step.hang_s and not self._wait(step.hang_s):
                    if not server._stopping.is_set():
                        server._dropped(body)
                    return
                if step.raw is not None:
                    self._send(step.status, step.raw[1].encode("utf-8"), step.raw[0])
                    return
                if step.status != 200:
                    message = step.message or f"scripted HTTP {step.status}"
                    self._json(step.status, _error(message, _error_type(step.status)), step.headers)
                    return
                self._json(200, server._completion(body, step))
                with server._lock:
                    server.answered += 1

            def _json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                self._send(status, json.dumps(payload).encode("utf-8"), "application/json", headers)

            def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
                      ) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout) before the answer came

        return Handler

    def _dropped(self, body: dict) -> None:
        users = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"]
        with self._lock:
            self.closed_by_client.append(users[-1] if users else "")

    def _completion(self, body: dict, step: Step) -> dict[str, Any]:
        text = step.text or ""
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        out: dict[str, Any] = {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": step.finish_reason, "logprobs": None}],
        }
        if step.usage is True:
            prompt, completion = max(1, prompt_chars // 4), max(1, len(text) // 4)
            out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion}
        elif isinstance(step.usage, dict):
            out["usage"] = {**step.usage, "total_tokens": sum(step.usage.values())}
        return out


class _FifoLock:
    """A lock granted in the order it was asked for, as a server's request queue is."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc_info: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _error_type(status: int) -> str:
    return {401: "invalid_api_key", 403: "permission_denied", 429: "rate_limit_exceeded"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error")


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """A running scripted server, stopped after the test."""
    with FakeOpenAIServer() as server:
        yield server
