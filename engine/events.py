"""Progress events: the kinds the engine reports while it works, named once for every writer and reader.

The evolve loop, labeling, the LLM agents and the job runner emit `(kind, payload)` pairs to an `EventSink`;
jobs persist them (`store.add_event`, the kind as its plain string, the payload as JSON) and the CLI and the
studio read them back. `EventKind` is a `StrEnum`, so a kind equals the string stored for it and workspaces
written before this module existed read the same. Bottom layer: imports nothing from the project.
"""
from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    """What happened; the payload keys each kind carries are listed beside it."""

    GENERATION_STARTED = "generation_started"  # generation
    AGENT_STARTED = "agent_started"  # generation, agent
    CANDIDATE = "candidate"  # generation, agent, annotator_id, name
    CANDIDATE_DROPPED = "candidate_dropped"  # agent, name, reason
    AGENT_FINISHED = "agent_finished"  # generation, agent, proposed, kept
    EXECUTING = "executing"  # split, annotators, examples
    EXECUTE_PROGRESS = "execute_progress"  # split, done, total
    SCORED = "scored"  # generation, annotator_id, name, agent, precision, fires, coverage, faults, first_error
    VERDICT = "verdict"  # generation, annotator_id, verdict, reasons
    GENERATION_COMPLETE = "generation_complete"  # generation, pool_size, dev_macro_f1, reverted, accepted, ...
    STOPPED = "stopped"  # generation (between generations) or now (at once)
    FAILED = "failed"  # error, trace
    EMBEDDING = "embedding"  # done, total
    AGGREGATING = "aggregating"  # aggregator, rows
    LLM_CALL = "llm_call"  # agent, call, cached, ...
    LLM_REPAIR = "llm_repair"  # agent, call, errors
    BUDGET_EXHAUSTED = "budget_exhausted"  # agent, call, message
    LLM_NOTE = "llm_note"  # agent, message: how the LLM agents adapted (to the server, to the model)
    AGENT_STOPPED = "agent_stopped"  # agent, message: a mixed run's member that stopped (the others carry on)


EventSink = Callable[[EventKind, dict[str, Any]], None]


def quiet(kind: EventKind, payload: dict[str, Any]) -> None:
    """The default event sink: drop events."""


class RunStopped(Exception):
    """Raised through an event sink when the expert asked a run to stop at once (engine.jobs.JobStopped): a stop,
    not a failure, so the generation it cut short stays to be redone."""
