"""Live progress of an evolve run, read back from the events its job wrote to the workspace."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st

from engine.events import EventKind
from engine.jobs import REGISTRY, Job
from engine.store.workspace import Store
from studio import queries

MAX_EVENTS = 20_000


@dataclass
class RunView:
    """What an evolve run has done so far, folded from its events."""

    generation: int | None = None
    agent: str | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)  # in arrival order, with score / verdict
    dropped: list[dict[str, Any]] = field(default_factory=list)
    sandbox: tuple[int, int] | None = None  # (done, total) of the current sandbox run
    completed: list[dict[str, Any]] = field(default_factory=list)  # generation_complete payloads
    finished: str | None = None  # stopped | failed
    error: str | None = None
    feed: list[str] = field(default_factory=list)


def fold_events(events: list[dict[str, Any]]) -> RunView:
    """Fold one run's events (oldest first) into what the live panel shows.

    A stored kind is its plain string; `EventKind` members equal it, and kinds this panel does not show pass.
    """
    view = RunView()
    by_id: dict[str, dict[str, Any]] = {}
    for e in events:
        kind = e["kind"]
        if kind == EventKind.GENERATION_STARTED:
            view.generation, view.agent, view.sandbox = e["generation"], None, None
            view.feed.append(f"Generation {e['generation']} started")
        elif kind == EventKind.AGENT_STARTED:
            view.agent = e["agent"]
            view.feed.append(f"The {e['agent']} is proposing…")
        elif kind == EventKind.CANDIDATE:
            row = {"generation": e["generation"], "agent": e["agent"], "id": e["annotator_id"], "name": e["name"],
                   "precision": None, "coverage": None, "fires": None, "verdict": "…", "reasons": ""}
            by_id[e["annotator_id"]] = row
            view.candidates.append(row)
        elif kind == EventKind.CANDIDATE_DROPPED:
            view.dropped.append(e)
            view.feed.append(f"Dropped a {e['agent']} candidate: {e['reason']}")
        elif kind == EventKind.AGENT_FINISHED:
            view.feed.append(f"The {e['agent']} proposed {e['proposed']} candidate(s), {e['kept']} not seen before"
                             + (f" ({e['why']})" if e.get("why") else ""))
        elif kind in (EventKind.LLM_NOTE, EventKind.AGENT_STOPPED, EventKind.BUDGET_EXHAUSTED):
            if f"LLM: {e['message']}" not in view.feed:  # a spent budget is told by every refused call
                view.feed.append(f"LLM: {e['message']}")
        elif kind == EventKind.EXECUTING:
            view.agent = None
            view.sandbox = (0, int(e.get("examples", 0)) * int(e.get("annotators", 1)) or 1)
            view.feed.append(f"Sandbox: {e['annotators']} annotator(s) × {e['examples']:,} {e['split']} rows")
        elif kind == EventKind.EXECUTE_PROGRESS:
            view.sandbox = (int(e["done"]), int(e["total"]))
        elif kind == EventKind.SCORED and e["annotator_id"] in by_id:
            by_id[e["annotator_id"]].update(precision=e["precision"], coverage=e["coverage"], fires=e["fires"])
        elif kind == EventKind.VERDICT and e["annotator_id"] in by_id:
            by_id[e["annotator_id"]].update(verdict=e["verdict"], reasons="; ".join(e["reasons"]))
        elif kind == EventKind.GENERATION_COMPLETE:
            view.completed.append(e)
            view.sandbox = None
            view.feed.append(f"Generation {e['generation']} complete: {e['accepted']}/{e['candidates']} accepted, "
                             f"pool {e['pool_size']}, dev macro-F1 {e['dev_macro_f1']:.3f}"
                             + (" (reverted: it did harm)" if e.get("reverted") else ""))
        elif kind == EventKind.STOPPED:
            view.finished = "stopped"
            view.feed.append(f"Generation {e['generation']} not complete: {e['reason']}." if e.get("reason")
                             else "Stopped.")
        elif kind == EventKind.FAILED:
            view.finished, view.error = "failed", e.get("error")
    return view


def latest_evolve_job_id(store: Store) -> str | None:
    """This server's latest evolve job on the workspace, else the latest one the workspace remembers."""
    job = REGISTRY.latest(store.path.parent, "evolve")
    if job is not None:
        return job.id
    jobs = store.jobs()
    jobs = jobs[jobs["kind"] == "evolve"] if len(jobs) else jobs
    return str(jobs.iloc[0]["id"]) if len(jobs) else None


def _stored_status(store: Store, job_id: str) -> str | None:
    jobs = store.jobs()
    found = jobs[jobs["id"] == job_id] if len(jobs) else jobs
    return str(found.iloc[0]["status"]) if len(found) else None


def run_metrics(store: Store, view: RunView, running: Job | None) -> None:
    """The figures of the run, read from the store on every poll, so they move while it runs."""
    complete = store.last_complete_generation()
    accepted = sum(c["verdict"] in ("accept", "approve") for c in view.candidates)
    cols = st.columns(4)
    cols[0].metric("Complete generations", complete,
                   help="a stopped or failed run keeps every complete generation")
    cols[1].metric("Candidates (this run)", len(view.candidates))
    cols[2].metric("Accepted (this run)", accepted)
    if running is not None:
        cols[3].metric("Running for", f"{running.elapsed_s():.0f} s")
    else:
        cols[3].metric("Pool size", len(store.pool_ids()))


def live_panel(store: Store, job: Job | None, job_id: str | None) -> None:
    """The run's progress: status line, sandbox bar, candidates with their verdicts, and a short feed."""
    view = fold_events(store.events(job_id, limit=MAX_EVENTS)) if job_id is not None else RunView()
    running = job is not None and job.running
    run_metrics(store, view, job if running else None)
    if job_id is None:
        st.caption("No run from the studio yet on this workspace.")
        return
    if running:
        if view.generation is None:
            st.info("Starting the run…", icon=":material/hourglass_top:")
        else:
            where = f"the **{view.agent}** is proposing" if view.agent else "running candidates in the sandbox"
            now = [c for c in view.candidates if c["generation"] == view.generation]
            st.info(f"Generation {view.generation}: {where}. {len(now)} candidate(s) in this generation so far.",
                    icon=":material/hourglass_top:")
        if view.sandbox:
            done, total = view.sandbox
            st.progress(min(1.0, done / max(total, 1)), text=f"Sandbox: {done:,} / {total:,}")
    elif job is None and _stored_status(store, job_id) == "running":
        st.warning("The last run was interrupted (the studio stopped while it ran). Complete generations are "
                   "kept; press Run to go on.")
    elif view.finished == "failed" or (job is not None and job.status == "failed"):
        st.error(f"The run failed: {queries.escape_md(view.error or (job.error if job else ''))}")
    elif view.completed:
        last = view.completed[-1]
        # the run's own figures; verdicts given since (approve, reject, undo, an edit) move the pool, and rows
        # labeled into dev since move its figure without a verdict: the line says what they make it now, scored as
        # the run scored it (the chart's fitness line keeps to the classes the audit rows hold: another figure)
        number = int(last["generation"])
        pool_now, f1_now = len(store.pool_ids(number)), queries.generation_dev_f1(store, number)
        since = ("" if (pool_now, round(f1_now, 3)) == (last["pool_size"], round(last["dev_macro_f1"], 3)) else
                 f" Since then, the verdicts and dev labels given after it make it pool {pool_now}, dev macro-F1 "
                 f"{f1_now:.3f}.")
        st.success(f"Last run finished{' (stopped)' if view.finished == 'stopped' else ''}: generation "
                   f"{last['generation']} ended with pool {last['pool_size']}, dev macro-F1 "
                   f"{last['dev_macro_f1']:.3f} (on the fitness rows the gate chose it on).{since}"
                   + queries.pool_audit_sentence(store, number))
    if view.candidates:
        table = pd.DataFrame(view.candidates)
        # not yet scored: an empty cell, not "None"
        table[["precision", "coverage"]] = table[["precision", "coverage"]].astype(float)
        # the gate's verdict in the run, and where the annotator stands now (an expert's verdict since overrides it)
        latest = store.latest_verdicts()
        table["now"] = [f"{latest[i][0]} (expert)" if i in latest and latest[i][1] == "human" else ""
                        for i in table["id"]]
        table = table[["generation", "agent", "name", "precision", "coverage", "verdict", "now", "reasons"]]
        st.dataframe(table.tail(200), hide_index=True, height=260,
                     column_config={"precision": st.column_config.NumberColumn(format="%.2f"),
                                    "coverage": st.column_config.NumberColumn(format="%.3f"),
                                    "verdict": st.column_config.TextColumn("gate's verdict"),
                                    "now": st.column_config.TextColumn(
                                        "now", help="the expert's verdict given since, when there is one")})
    if view.feed:
        st.caption("  \n".join(queries.escape_md(line) for line in view.feed[-6:]))
