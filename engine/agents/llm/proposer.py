"""The LLM proposer: generator, improver and refiner written by a language model.

Each role makes a few calls (the refiner one per precise-but-narrow annotator); every ```python block in a
reply is checked by `engine.sandbox.checks`. A reply with no usable code gets one repair turn quoting the errors,
then what still fails is dropped with its reason (`last_dropped`, and `candidate_dropped` events). A spent
budget ends proposing cleanly with what was gathered; bad credentials propagate as `LLMAuthError`.

Modes: "code" asks for free Python; "spec" asks for a JSON spec (label, cues, view) that the engine renders
into the offline agents' readable templates (`spec_mode.py`), which small local models can fill, the more so as
the request carries the spec's JSON schema for servers that constrain decoding to it; "auto" starts with code
and switches to spec for the rest of the run once free-code replies keep failing the checks.
A run interrupted while calls are in flight (Ctrl-C, a stop from the studio) cancels them: their connections
are closed, so the server need not finish work nobody will read.
"""
from __future__ import annotations

import ast
import hashlib
import re
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.agents.base import ProposalContext
from engine.agents.llm import prompts, spec_mode
from engine.domain import AGENT_ROLES, Annotator, Candidate, Task, code_hash
from engine.events import EventKind, EventSink
from engine.llm.costs import BudgetExhausted
from engine.llm.seam import LLMCallFailed, LLMCallSkipped, LLMClient, LLMReply
from engine.sandbox.checks import CodeRejected, check_source
from engine.sandbox.replies import Fenced, extract_code, fenced_blocks

MODES = ("code", "spec", "auto")
AUTO_SWITCH_AFTER = 2  # free-code calls in a row with nothing usable before "auto" switches to spec


def endpoint_stopped_note(generation: int, role: str) -> str:
    """What an agent that sent no request says once the endpoint stopped answering (at `role` of `generation`): it
    must not repeat the failure of the call that found the server gone as if its own calls had failed."""
    return f"skipped: the LLM endpoint stopped answering in generation {generation} (at the {role}); no call sent"


def _prose_before(text: str, start: int, end: int) -> str:
    prose = [ln.strip(" #*-") for ln in text[start:end].splitlines() if ln.strip()]
    return prose[-1][:200] if prose else ""


_CODE_WORDS = re.compile(r"^\s*(?:def|import|from|class)\s|\breturn\b", re.MULTILINE)


def _is_code_block(block: Fenced) -> bool:
    """A python-tagged block, or an untagged one that reads as code (a definition, an import, a return): an untagged
    example call (`>>> annotate(...)`) or printed output after the code is prose, not a block to check or repair."""
    return block.python and (bool(block.tag) or bool(_CODE_WORDS.search(block.body)))


def split_reply(text: str) -> list[tuple[str, str]]:
    """(prose just before the block, code) for every python or untagged fenced block of a reply.

    A block whose closing fence never comes (the reply ended inside it) runs to the end of the reply, as in
    `extract_code`; the checks then judge whether the code in it is complete. A reply with no fence at all is
    passed to `extract_code`, which accepts bare code (and raises `CodeRejected` when there is none).
    """
    blocks, last_end = [], 0
    for block in fenced_blocks(text):
        # an unclosed block is the end of a cut-off reply: checked whatever it holds, so the error can say so
        if _is_code_block(block) if block.closed else block.python:
            blocks.append((_prose_before(text, last_end, block.start), block.body))
        last_end = block.end
    if not blocks and "```" not in text:
        blocks.append(("", extract_code(text)))
    if not blocks:
        raise CodeRejected("no ```python code block found")
    return blocks


def check_reply(text: str, cut_off: bool = False, reasoning_only: bool = False
                ) -> tuple[list[tuple[str, str]], list[str]]:
    """([(rationale, normalised source)], [error per rejected block]) for one reply. `cut_off`: the reply hit
    the max_tokens limit, which is then named as the likely cause of a rejected block. A reasoning model's
    `<think>` drafts are not its answer: they are left out. `reasoning_only`: the server sent the model's reasoning
    and no answer."""
    try:
        blocks = split_reply(spec_mode.without_thoughts(text))
    except CodeRejected as err:
        # "write shorter code" was wrong advice where no code was written: the model was still thinking
        return [], [err.reason + spec_mode.why_no_answer(text, cut_off, reasoning_only, _CUT_OFF)]
    # a block that defines no annotate beside one that does is an example of its use (`print(annotate(...))`), not
    # an annotator: checking it cost a repair call per reply and a "rejected" line (a review against small models)
    if any(_DEFINES_ANNOTATE.search(code) for _, code in blocks):
        blocks = [(rationale, code) for rationale, code in blocks if _DEFINES_ANNOTATE.search(code)]
    good, errors = [], []
    for i, (rationale, code) in enumerate(blocks, start=1):
        try:
            good.append((rationale, check_source(without_main_guard(code))))
        except CodeRejected as err:
            reason = f"block {i}: {err.reason}" if len(blocks) > 1 else err.reason
            errors.append(reason + (_CUT_OFF if cut_off and i == len(blocks) else ""))
    return good, errors


_CUT_OFF = " (the reply hit the max_tokens limit and was cut off: write shorter code)"
_DEFINES_ANNOTATE = re.compile(r"^def\s+annotate\s*\(", re.MULTILINE)


def without_main_guard(code: str) -> str:
    """The code without its top-level `if __name__ == "__main__":` blocks: a model's self-test, which never runs in
    the sandbox (the module is not __main__) but which the checker refuses, and so sank the annotator above it."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the checker says what is wrong
    guards = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
              and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"]
    if not guards:
        return code
    dropped = {line for node in guards for line in range(node.lineno - 1, node.end_lineno or node.lineno)}
    return "".join(line for i, line in enumerate(code.splitlines(keepends=True)) if i not in dropped)


@dataclass(frozen=True)
class _Job:
    role: str
    index: int
    seed: int
    messages: list[dict]
    parent_ids: tuple[str, ...] = ()
    mode: str = "code"  # "code" | "spec": what the messages ask for
    task: Task | None = None
    label: str | None = None  # spec mode: the one label this call's annotators may vote
    vocabulary: tuple[str, ...] = ()  # spec mode: the words its cues may be (empty: any word)
    views: tuple[str, ...] = ()  # spec mode: the views its specs may name (empty: every view of the task)


@dataclass
class _Outcome:
    sources: list[tuple[str, str]] = field(default_factory=list)  # (rationale, normalised source)
    dropped: list[str] = field(default_factory=list)
    exhausted: bool = False
    failed: LLMCallFailed | None = None
    skipped: bool = False  # not sent: the endpoint had stopped answering


class LLMProposer:
    """`Proposer` over any `LLMClient`; `n_per_role` calls per role, each asking for `per_call` annotators."""

    name = "llm"

    def __init__(self, client: LLMClient, n_per_role: int = 3, *, per_call: int = 2,
                 max_refine: int | None = None, refine_min_precision: float = 0.55,
                 refine_max_coverage: float = 0.08, parallel: int | None = None,
                 on_event: EventSink | None = None, mode: str = "code"):
        if mode not in MODES:
            raise ValueError(f"LLM mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.client = client
        self.mode = mode
        self.writing = "spec" if mode == "spec" else "code"  # what the next calls ask for
        self._code_misses = 0  # free-code calls in a row that gave nothing usable (for "auto")
        self.n_per_role = n_per_role
        self.per_call = per_call
        self.max_refine = n_per_role if max_refine is None else max_refine
        self.refine_min_precision = refine_min_precision
        self.refine_max_coverage = refine_max_coverage
        config = getattr(client, "config", None)
        self.model = getattr(config, "model", "") or "unknown model"
        self.written_by = f"llm:{self.model}"
        self.parallel: int = max(1, int(parallel or getattr(config, "max_parallel", 1) or 1))
        self.on_event = on_event
        self.last_dropped: list[tuple[str, str]] = []
        self.budget_exhausted = False
        self.budget_message = ""
        self.notes: list[str] = []  # adaptations (server, mode) in words, for the run's summary
        self.stopped_at: tuple[int, str] | None = None  # (generation, role) where the endpoint stopped answering
        self.code_drafts = {"checked": 0, "passed": 0}  # free-code replies (and repairs) read, and those with code
        self._event_lock = threading.Lock()
        if hasattr(client, "on_note"):
            client.on_note = self._note

    def usage(self) -> dict[str, Any]:
        """Calls, attempts, tokens, cost and failures of this run, the budget, and how the agents adapted."""
        out: dict[str, Any] = {"model": self.model, "mode": self.mode, "writing": self.writing}
        usage = getattr(self.client, "usage", None)
        if usage is not None:
            out.update(usage.as_dict())
        budget = getattr(self.client, "budget", None)
        if budget is not None:
            out["budget"] = budget.summary()
        out["notes"] = list(self.notes)
        out["code_drafts"] = dict(self.code_drafts)
        advice = spec_mode_advice(self.mode, self.writing, self.code_drafts)
        if advice:
            out["advice"] = advice
        for name in ("parallel", "timeout_s", "format_shape"):  # what the client adapted to, at the end
            if hasattr(self.client, name):
                out[name] = getattr(self.client, name)
        return out

    def _note(self, message: str) -> None:
        self.notes.append(message)
        self._emit(EventKind.LLM_NOTE, {"agent": "llm", "message": message})
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
        if self.stopped_at is not None:  # the endpoint stopped answering: nothing is sent, and nothing claimed failed
            raise LLMCallSkipped(endpoint_stopped_note(*self.stopped_at))
        outcomes = self._run(self._jobs(role, context))
        if getattr(self.client, "stopped_answering", None) and self.stopped_at is None:
            self.stopped_at = (context.generation, role)
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
                                            rationale=rationale, written_by=self.written_by))
        # a call failed only if it gave nothing: a failed repair leaves the first reply's good code standing
        failed = [o for _, o in outcomes if o.failed is not None and not o.sources]
        if outcomes and len(failed) == len(outcomes):  # the endpoint is down or unusable: say so, not propose nothing
            sent = [o.failed for o in failed if o.failed is not None and not o.skipped]  # the call that found it so
            if sent:
                raise sent[0]
            raise LLMCallSkipped(endpoint_stopped_note(*(self.stopped_at or (context.generation, role))))
        return candidates

    # ---- calls ---------------------------------------------------------------------------------
    def _jobs(self, role: str, context: ProposalContext) -> list[_Job]:
        jobs, mode = [], self.writing
        # spec mode offers the views the offline agents mine on this dev (no "near" where it copies "between")
        views = spec_mode.views_for(context.task, [ex.as_input() for ex in context.dev]) if mode == "spec" else ()
        targets: list[Annotator | None] = (
            list(self.refine_targets(context)) if role == "refiner" else [None] * self.n_per_role)
        for index, parent in enumerate(targets):
            seed = _seed(context, role, index, parent.id if parent else "")
            rng = np.random.default_rng(seed)
            label = self._spec_label(role, index, parent, context) if mode == "spec" else None
            words = tuple(prompts.label_vocabulary(context, label)) if label and role != "refiner" else ()
            if role == "generator":
                messages = prompts.generator_messages(context, rng, self.per_call, mode=mode, label=label,
                                                      words=words, views=views)
            elif role == "improver":
                messages = prompts.improver_messages(context, rng, self.per_call, mode=mode, label=label,
                                                     words=words, views=views)
            else:
                assert parent is not None  # the refiner's calls each widen a member
                messages = prompts.refiner_messages(context, parent, rng, self.per_call, mode=mode, views=views)
            jobs.append(_Job(role, index, seed, messages, (parent.id,) if parent else (), mode, context.task,
                             label, words, views))
        return jobs

    @staticmethod
    def _spec_label(role: str, index: int, parent: Annotator | None, context: ProposalContext) -> str | None:
        """The label a spec call is aimed at: the generator's calls take the labels in turn (shifted each
        generation), the improver's start from the weakest label (`prompts.weakest_classes`), a refiner keeps its
        parent's. Small models mix up which label a cue signals; one label per call leaves them no choice."""
        labels = context.task.labels
        if role == "refiner":
            score = context.scores.get(parent.id) if parent is not None else None
            return labels[score.label] if score is not None and 0 <= score.label < len(labels) else None
        if role == "improver":
            return labels[prompts.weakest_classes(context)[index % len(labels)]]
        return labels[(index + context.generation) % len(labels)]

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
            try:
                wait(futures, return_when=FIRST_EXCEPTION)  # a stop raised in any call ends the wait
                for future in futures:
                    if future.done() and future.exception() is not None:
                        raise future.exception()  # type: ignore[misc]
                return [(job, f.result()) for job, f in zip(jobs, futures, strict=True)]
            except BaseException:  # interrupted or stopped: the other answers are not needed any more
                for future in futures:
                    future.cancel()
                self.cancel()
                raise

    def cancel(self) -> None:
        """Abandon the calls in flight (their connections are closed) and refuse later ones."""
        cancel = getattr(self.client, "cancel", None)
        if not callable(cancel):
            return
        closed = cancel()
        note = (f"the run was interrupted: {closed} open connection(s) to the server closed, so it can drop "
                "the requests nobody waits for")
        self.notes.append(note)
        try:
            self._emit(EventKind.LLM_NOTE, {"agent": "llm", "message": note})
        except Exception:  # noqa: BLE001 - the sink may be what stops the run (a studio stop): it already did
            pass

    def _call(self, job: _Job) -> _Outcome:
        """One call plus at most one repair turn; budget and call failures become part of the outcome."""
        outcome, errors = _Outcome(), list[str]()
        try:
            reply = self._complete(job, job.messages)
            outcome.sources, errors = self._check(job, reply)
            if errors:
                self._emit(EventKind.LLM_REPAIR, {"agent": job.role, "call": job.index, "errors": errors})
                repair = prompts.repair_messages(job.messages, reply.text, errors, mode=job.mode)
                fixed, still = self._check(job, self._complete(job, repair))
                outcome.sources += fixed
                outcome.dropped += [f"rejected after one repair: {e}" for e in still]
            self._track_mode(job, outcome)
        except BudgetExhausted as err:
            outcome.exhausted = self.budget_exhausted = True
            self.budget_message = str(err)
            outcome.dropped += [f"rejected, not repaired (budget exhausted): {e}" for e in errors]
            self._emit(EventKind.BUDGET_EXHAUSTED, {"agent": job.role, "call": job.index, "message": str(err)})
        except LLMCallSkipped as err:  # never sent: a draft already read is dropped unrepaired, no call "failed"
            outcome.failed, outcome.skipped = err, True
            outcome.dropped += [f"rejected, not repaired (the LLM endpoint stopped answering): {e}" for e in errors]
        except LLMCallFailed as err:
            outcome.failed = err
            outcome.dropped += [f"rejected, repair call failed: {e}" for e in errors] or [f"LLM call failed: {err}"]
        return outcome

    def _complete(self, job: _Job, messages: list[dict]) -> LLMReply:
        if job.mode == "spec" and job.task is not None:  # constrained decoding, where the server offers it
            schema = spec_mode.spec_schema(job.task, self.per_call, job.label, list(job.vocabulary), job.views)
            reply = self.client.complete(messages, role=job.role, seed=job.seed, schema=schema)
        else:
            reply = self.client.complete(messages, role=job.role, seed=job.seed)
        self._emit(EventKind.LLM_CALL, {"agent": job.role, "call": job.index, "cached": reply.cached,
                                "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out,
                                "cost_usd": reply.cost_usd, "latency_s": round(reply.latency_s, 3)})
        return reply

    def _check(self, job: _Job, reply: LLMReply) -> tuple[list[tuple[str, str]], list[str]]:
        """Usable sources and errors of one reply, read as code or as a spec as the job asked."""
        if job.mode == "spec" and job.task is not None:
            return spec_mode.parse_specs(reply.text, job.task, job.views, cut_off=reply.finish_reason == "length",
                                        reasoning_only=reply.reasoning_only)
        good, errors = check_reply(reply.text, cut_off=reply.finish_reason == "length",
                                   reasoning_only=reply.reasoning_only)
        with self._event_lock:
            self.code_drafts["checked"] += 1
            self.code_drafts["passed"] += bool(good)
        return good, errors

    def _track_mode(self, job: _Job, outcome: _Outcome) -> None:
        """In "auto": after `AUTO_SWITCH_AFTER` free-code calls in a row with nothing usable, ask for specs."""
        if self.mode != "auto" or job.mode != "code":
            return
        with self._event_lock:
            self._code_misses = 0 if outcome.sources else self._code_misses + 1
            switch = self._code_misses >= AUTO_SWITCH_AFTER and self.writing == "code"
            if switch:
                self.writing = "spec"
        if switch:
            self._note(f"{self._code_misses} free-code replies in a row failed the checks: the model now fills "
                       "JSON specs (label, cues, view) that the engine renders into annotators (--llm-mode spec "
                       "starts there)")

    # ---- reporting -----------------------------------------------------------------------------
    def _drop(self, role: str, reason: str) -> None:
        self.last_dropped.append((role, reason))
        self._emit(EventKind.CANDIDATE_DROPPED, {"agent": role, "name": "", "reason": reason})

    def _emit(self, kind: EventKind, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            with self._event_lock:
                self.on_event(kind, payload)


def spec_mode_advice(mode: str, writing: str, code_drafts: dict[str, int]) -> str | None:
    """The advice for a run whose free-code replies all failed the checks: spec mode, and why. "Label more dev rows"
    was the wrong advice after 12 failed drafts of a 135M model: a small model cannot write the code at all."""
    if writing != "code" or not code_drafts.get("checked") or code_drafts.get("passed"):
        return None
    then = "" if mode == "code" else f" (auto switches after {AUTO_SWITCH_AFTER} such replies in a row)"
    return (f"none of the {code_drafts['checked']} free-code replies passed the checks: run with --llm-mode spec"
            f"{then}. Small models write specs they can fill (a label, its cues, a view, which the engine renders "
            "into an annotator), not free code")


def _seed(context: ProposalContext, role: str, index: int, extra: str) -> int:
    """The sample index of one call: stable across reruns, different per generation, role and call."""
    key = f"{context.seed}:{context.generation}:{role}:{index}:{extra}"
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
