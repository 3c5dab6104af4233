"""The adapter for any OpenAI-compatible endpoint: `OpenAICompatibleClient`, the `LLMClient` the agents use.

Retries are the `openai` client's own (`max_retries`: it retries 408/409/429/5xx, timeouts and dropped connections
with backoff and honours Retry-After); this client adds a cap on parallel requests, a spending budget, a price
table, and the store's call log (one row per HTTP attempt, written by the HTTP layer in `transport.py`), which
doubles as a cache so a rerun with the same seed is reproducible and free. It also adapts to the server
(`adapt.py`): constrained decoding in the `response_format` shape the server accepts, fewer parallel requests and
longer timeouts for a server that answers one at a time, and `cancel()` closes the connections of requests nobody
waits for any more. The API key lives only in `LLMConfig` and the HTTP client: never logged, stored or shown.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import openai

from engine.llm import adapt
from engine.llm.config import LOCAL_KEY, LLMConfig
from engine.llm.costs import Budget, BudgetExhausted, PriceTable, Usage
from engine.llm.seam import LLMAuthError, LLMCallFailed, LLMCallSkipped, LLMEndpointDown, LLMError, LLMReply
from engine.llm.transport import (
    MAX_CONNECTION_FAILURES,
    MAX_TIMEOUT_S,
    MAX_TIMEOUTS,
    REFUSES_PARAMETER,
    AttemptLoggingClient,
    Call,
    Cancelled,
    FormatRejected,
    InterruptibleOpenAI,
    RetryRefused,
    Unanswered,
    Unreachable,
    Unusable,
    apply_param_fixes,
    error_message,
    not_a_completion,
    retried_by_openai,
    said_in,
)

if TYPE_CHECKING:
    from engine.store.workspace import Store

_KEY_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-*.]{4,})")


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
        self._current = threading.local()  # the `Call` this thread is making
        self._http = AttemptLoggingClient(self, config.max_parallel)
        self._openai = InterruptibleOpenAI(base_url=config.base_url, api_key=self._key, timeout=config.timeout_s,
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
        call = Call({"request_hash": rhash, "role": role, "model": cfg.model, "request": _canonical(request),
                      "prompt_hash": hashlib.sha256(_canonical(messages).encode()).hexdigest()[:16]})
        apply_param_fixes(request, self._param_fixes)
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
                except FormatRejected as err:
                    self._format_refused(err)
                    continue  # asked again in the next shape (or without one)
                except openai.BadRequestError as err:
                    if self._adapt(request, self._scrub(error_message(err))):
                        call.outcomes.clear()  # reshaped for this model: a fresh request, not a failure
                        continue
                    raise
                return self._success(response, call)
        except Cancelled:
            self.usage.add_failed_call()
            raise LLMCallFailed(f"the {role} call was cancelled (the run no longer needs its answer)") from None
        except Unanswered:
            self.usage.add_failed_call()
            raise self._stop_asking(role, call) from None
        except Unreachable:
            self.usage.add_failed_call()
            down = self._stop_asking(role, call, timeouts=False)
            if not call.outcomes:  # began after another call found the server gone: it sent nothing
                raise LLMCallSkipped(f"the {role} call was not sent: {self._unanswered}") from None
            raise down from None
        except Unusable as err:
            self.usage.add_failed_call()
            said = self._scrub(str(err))
            self._log(call.record, None, call.latency_s, error=said)
            raise LLMCallFailed(f"the {role} call to {self.config.model}: {said}") from None
        except RetryRefused:
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

    def _format_refused(self, err: FormatRejected) -> None:
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

    def _answered(self, call: Call, tokens_out: int) -> None:
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

    def _failure(self, err: openai.APIStatusError, role: str, call: Call) -> LLMError:
        """What an error answer the openai client did not (or no longer) retry means for the caller."""
        status = err.status_code
        if status in (401, 403):
            return LLMAuthError(f"the endpoint refused the API key ({status}) — check OPENAI_API_KEY")
        if retried_by_openai(status):
            return self._gave_up(role, call)
        hint, said = "", error_message(err).lower()
        if status == 400 and "context" in said and any(w in said for w in ("length", "window", "token")):
            hint = (f" (the prompt and the reply's max_tokens ({self.config.max_tokens}) exceed the model's context: "
                    "lower EVOPOOL_MAX_TOKENS, or use a model with a longer context)")
        base = str(self.config.base_url or "")  # no base URL: the OpenAI API itself, whose 404s name the model
        if status in (404, 405) and base and not base.rstrip("/").endswith("/v1") and said_in(err.body) is None:
            hint = (f" (the base URL {self.config.base_url} does not end in /v1, where OpenAI-compatible servers "
                    "answer: Ollama, vLLM and llama.cpp take http://host:port/v1)")
        return LLMCallFailed(f"the endpoint rejected the request to {self.config.model} (HTTP {status}): "
                             f"{self._scrub(error_message(err))}{hint}")

    def _stop_asking(self, role: str, call: Call, timeouts: bool = True) -> LLMEndpointDown:
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

    def _gave_up(self, role: str, call: Call) -> LLMCallFailed:
        cfg, n = self.config, len(call.outcomes)
        where = cfg.base_url or "the OpenAI API"
        last = call.outcomes[-1] if call.outcomes else "no answer"
        said = f" ({call.last_said[:200]})" if call.last_said and call.last_said != last else ""
        return LLMCallFailed(f"the {role} call to {cfg.model} at {where} failed after {n} attempt"
                             f"{'s' if n != 1 else ''}: {last}{said}")

    def _attempt_failed(self, call: Call | None, started: float, outcome: str, detail: str) -> None:
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
        refused = any(word in said.lower() for word in REFUSES_PARAMETER)
        for fix, cue in (("max_completion_tokens", "max_completion_tokens"), ("no_temperature", "temperature"),
                         ("no_seed", "seed")):
            if cue in said and refused and fix not in self._param_fixes:
                self._param_fixes.add(fix)
                apply_param_fixes(request, {fix})
                return True
        return False

    def _success(self, response: Any, call: Call) -> LLMReply:
        problem = not_a_completion(response)
        if problem is not None:
            raise Unusable(problem)
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
