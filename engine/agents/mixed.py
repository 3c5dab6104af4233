"""Several proposers side by side (e.g. the LLM and the offline miner): their candidates, concatenated.

A member whose endpoint fails (an `LLMError`: unreachable, refused key, calls failing for good) is stopped
for the rest of the run with a note, and the others carry on; only when every member has stopped does the
error reach the caller. A stopped member is skipped, and says so (`last_skipped`): its drafts dropped before it
stopped are not reported again as the later roles' own (a refiner once said "3x LLM call failed" having sent nothing).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from engine.agents.base import ProposalContext, Proposer
from engine.agents.llm.proposer import endpoint_stopped_note
from engine.domain import Candidate
from engine.events import EventKind, EventSink, quiet
from engine.llm.seam import LLMCallSkipped, LLMEndpointDown, LLMError


class MixedProposer:
    """Asks each proposer in turn for the same role; the gate then judges all candidates together."""

    name = "mixed"

    def __init__(self, *proposers: Proposer, on_event: EventSink = quiet):
        if not proposers:
            raise ValueError("MixedProposer needs at least one proposer")
        self.proposers = proposers
        self.on_event = on_event
        self.stopped: dict[str, str] = {}  # member name -> why it stopped
        self._stops: dict[str, tuple[int, str, LLMError]] = {}  # member name -> (generation, role, error)
        self._asked: list[Proposer] = []  # the members asked in the last `propose`
        self.last_skipped: list[str] = []  # the members the last `propose` skipped, each with why

    def cancel(self) -> None:
        """Cut the calls in flight of every member that has any (the LLM agents)."""
        for proposer in self.proposers:
            cancel = getattr(proposer, "cancel", None)
            if callable(cancel):
                cancel()

    def propose(self, role: str, context: ProposalContext) -> list[Candidate]:
        out: list[Candidate] = []
        self._asked, self.last_skipped = [], []
        for proposer in self.proposers:
            if proposer.name in self.stopped:
                self.last_skipped.append(f"{proposer.name} {self._skip_note(proposer.name)}")
                continue
            self._asked.append(proposer)
            try:
                proposals = proposer.propose(role, context)
            except LLMError as err:
                self._stops[proposer.name] = (context.generation, role, err)
                self.stopped[proposer.name] = (f"the {proposer.name} agents stopped at the {role} of generation "
                                               f"{context.generation}: {err}")
                if len(self.stopped) == len(self.proposers):
                    raise
                self.on_event(EventKind.AGENT_STOPPED, {"agent": proposer.name, "message":
                              self.stopped[proposer.name] + "; the other agents carry on"})
                continue
            written_by = getattr(proposer, "written_by", proposer.name)
            out.extend(c if c.written_by else dataclasses.replace(c, written_by=written_by) for c in proposals)
        return out

    def _skip_note(self, name: str) -> str:
        generation, role, err = self._stops[name]
        if isinstance(err, LLMCallSkipped):  # it had found the endpoint gone in an earlier role: that one is named
            return str(err)
        if isinstance(err, LLMEndpointDown):
            return endpoint_stopped_note(generation, role)
        return f"skipped: it stopped at the {role} of generation {generation}; no call sent"

    @property
    def last_dropped(self) -> list[tuple[str, str]]:
        """What the members asked in the last `propose` dropped there, for those that report it (a skipped member's
        list is from an earlier role)."""
        return [item for p in self._asked for item in getattr(p, "last_dropped", [])]

    @property
    def budget_exhausted(self) -> bool:
        return any(getattr(p, "budget_exhausted", False) for p in self.proposers)

    @property
    def budget_message(self) -> str:
        return "; ".join(getattr(p, "budget_message", "") for p in self.proposers if getattr(p, "budget_message", ""))

    def usage(self) -> dict[str, Any] | None:
        """The LLM member's usage summary (see `LLMProposer.usage`), plus which members stopped and why."""
        for p in self.proposers:
            usage = getattr(p, "usage", None)
            if callable(usage):
                return {**usage(), "stopped": dict(self.stopped)}
        return None
