"""The LLM proposer: generator, improver and refiner written by a language model.

Each role makes a few calls (the refiner one per precise-but-narrow annotator); every ```python block in a
reply is checked by `engine.sandbox.checks`. A reply with no usable code gets one repair turn quoting the errors,
then what still fails is dropped with its reason (`last_dropped`, and `candidate_dropped` events). A spent
budget ends proposing cleanly with what was gathered; bad credentials propagate as `LLMAuthError`.
"""
from __future__ import annotations

import hashlib
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.agents import prompts
from engine.agents.base import ProposalContext
from engine.domain import AGENT_ROLES, Annotator, Candidate, code_hash
from engine.events import EventKind, EventSink
from engine.llm.client import BudgetExhausted, LLMCallFailed, LLMClient
from engine.sandbox.checks import CodeRejected, check_source, extract_code

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


def split_reply(text: str) -> list[tuple[str, str]]:
    """(prose just before the block, code) for every python or untagged fenced block of a reply.

    A reply with no fence at all is passed to `extract_code`, which accepts bare code (and raises
    `CodeRejected` when there is none).
    """
    blocks, last_end = [], 0
    for match in _FENCE.finditer(text):
        if match.group(1).lower() in _PYTHON_TAGS and match.group(2).strip():
            prose = [ln.strip(" #*-") for ln in text[last_end: match.start()].splitlines() if ln.strip()]
            blocks.append((prose[-1][:200] if prose else "", match.group(2)))
        last_end = match.end()
    if not blocks and "```" not in text:
        blocks.append(("", extract_code(text)))
    if not blocks and text.count("```") % 2:
        raise CodeRejected("a ```python block is never closed (was the reply cut off?); write shorter code")
    if not blocks:
        raise CodeRejected("no ```python code block found")
    return blocks


def check_reply(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """([(rationale, normalised source)], [error per rejected block]) for one reply."""
    try:
        blocks = split_reply(text)
    except CodeRejected as err:
        return [], [err.reason]
    good, errors = [], []
    for i, (rationale, code) in enumerate(blocks, start=1):
        try:
            good.append((rationale, check_source(code)))
        except CodeRejected as err:
            errors.append(f"block {i}: {err.reason}" if len(blocks) > 1 else err.reason)
    return good, errors


@dataclass(frozen=True)
class _Job:
    role: str
    index: int
    seed: int
    messages: list[dict]
    parent_ids: tuple[str, ...] = ()


@dataclass
class _Outcome:
    sources: list[tuple[str, str]] = field(default_factory=list)  # (rationale, normalised source)
    dropped: list[str] = field(default_factory=list)
    exhausted: bool = False
    failed: LLMCallFailed | None = None


class LLMProposer:
    """`Proposer` over any `LLMClient`; `n_per_role` calls per role, each asking for `per_call` annotators."""

    name = "llm"

    def __init__(self, client: LLMClient, n_per_role: int = 3, *, per_call: int = 2,
                 max_refine: int | None = None, refine_min_precision: float = 0.55,
                 refine_max_coverage: float = 0.08, parallel: int | None = None,
                 on_event: EventSink | None = None):
        self.client = client
        self.n_per_role = n_per_role
        self.per_call = per_call
        self.max_refine = n_per_role if max_refine is None else max_refine
        self.refine_min_precision = refine_min_precision
        self.refine_max_coverage = refine_max_coverage
        config = getattr(client, "config", None)
        self.parallel = max(1, parallel or getattr(config, "max_parallel", 1))
        self.on_event = on_event
        self.last_dropped: list[tuple[str, str]] = []
        self.budget_exhausted = False
        self._event_lock = threading.Lock()

    def refine_targets(self, context: ProposalContext) -> list[Annotator]:
        """Pool annotators precise enough to trust but too narrow to matter yet, best first."""
        picks = []
        for a in context.annotators:
            s = context.scores.get(a.id)
            if s and s.fires and s.precision >= self.refine_min_precision and s.coverage <= self.refine_max_coverage:
                picks.append((-s.precision, s.coverage, a.id, a))
        return [p[-1] for p in sorted(picks, key=lambda p: p[:3])][: self.max_refine]

    def propose(self, role: str, context: ProposalContext) -> list[Candidate]:
        if role not in AGENT_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {AGENT_ROLES}")
        self.last_dropped = []
        if not context.task.labels:
            return []
        outcomes = self._run(self._jobs(role, context))
        known = {a.id for a in context.annotators} | set(context.excluded_ids)
        candidates: list[Candidate] = []
        for job, outcome in outcomes:
            for reason in outcome.dropped:
                self._drop(role, reason)
            for rationale, source in outcome.sources:
                if code_hash(source) in known:
                    self._drop(role, "duplicate of an annotator already in the pool, proposed or rejected")
                    continue
                known.add(code_hash(source))
                candidates.append(Candidate(source=source, agent=role, parent_ids=job.parent_ids,
                                            rationale=rationale))
        failures = [o.failed for _, o in outcomes if o.failed is not None]
        if outcomes and len(failures) == len(outcomes):
            raise failures[0]  # the endpoint is down or unusable: say so rather than propose nothing
        return candidates

    # ---- calls ---------------------------------------------------------------------------------
    def _jobs(self, role: str, context: ProposalContext) -> list[_Job]:
        jobs = []
        targets: list[Annotator | None] = (
            list(self.refine_targets(context)) if role == "refiner" else [None] * self.n_per_role)
        for index, parent in enumerate(targets):
            seed = _seed(context, role, index, parent.id if parent else "")
            rng = np.random.default_rng(seed)
            if role == "generator":
                messages = prompts.generator_messages(context, rng, self.per_call)
            elif role == "improver":
                messages = prompts.improver_messages(context, rng, self.per_call)
            else:
                messages = prompts.refiner_messages(context, parent, rng, self.per_call)
            jobs.append(_Job(role, index, seed, messages, (parent.id,) if parent else ()))
        return jobs

    def _run(self, jobs: list[_Job]) -> list[tuple[_Job, _Outcome]]:
        """Run the calls (up to `parallel` at once); results come back in job order."""
        if self.parallel == 1 or len(jobs) <= 1:
            done = []
            for job in jobs:
                done.append((job, self._call(job)))
                if done[-1][1].exhausted:
                    break  # every later call would be refused too
            return done
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(jobs))) as pool:
            futures = [pool.submit(self._call, job) for job in jobs]
            return [(job, f.result()) for job, f in zip(jobs, futures, strict=True)]

    def _call(self, job: _Job) -> _Outcome:
        """One call plus at most one repair turn; budget and call failures become part of the outcome."""
        outcome, errors = _Outcome(), []
        try:
            reply = self._complete(job, job.messages)
            outcome.sources, errors = check_reply(reply)
            if errors:
                self._emit(EventKind.LLM_REPAIR, {"agent": job.role, "call": job.index, "errors": errors})
                repaired = self._complete(job, prompts.repair_messages(job.messages, reply, errors))
                fixed, still = check_reply(repaired)
                outcome.sources += fixed
                outcome.dropped += [f"rejected after one repair: {e}" for e in still]
        except BudgetExhausted as err:
            outcome.exhausted = self.budget_exhausted = True
            outcome.dropped += [f"rejected, not repaired (budget exhausted): {e}" for e in errors]
            self._emit(EventKind.BUDGET_EXHAUSTED, {"agent": job.role, "call": job.index, "message": str(err)})
        except LLMCallFailed as err:
            outcome.failed = err
            outcome.dropped += [f"rejected, repair call failed: {e}" for e in errors] or [f"LLM call failed: {err}"]
        return outcome

    def _complete(self, job: _Job, messages: list[dict]) -> str:
        reply = self.client.complete(messages, role=job.role, seed=job.seed)
        self._emit(EventKind.LLM_CALL, {"agent": job.role, "call": job.index, "cached": reply.cached,
                                "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out,
                                "cost_usd": reply.cost_usd, "latency_s": round(reply.latency_s, 3)})
        return reply.text

    # ---- reporting -----------------------------------------------------------------------------
    def _drop(self, role: str, reason: str) -> None:
        self.last_dropped.append((role, reason))
        self._emit(EventKind.CANDIDATE_DROPPED, {"agent": role, "name": "", "reason": reason})

    def _emit(self, kind: EventKind, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            with self._event_lock:
                self.on_event(kind, payload)


def _seed(context: ProposalContext, role: str, index: int, extra: str) -> int:
    """The sample index of one call: stable across reruns, different per generation, role and call."""
    key = f"{context.seed}:{context.generation}:{role}:{index}:{extra}"
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
