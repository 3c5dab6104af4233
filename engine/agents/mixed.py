"""Several proposers side by side (e.g. the LLM and the offline miner): their candidates, concatenated."""
from __future__ import annotations

from engine.agents.base import ProposalContext, Proposer
from engine.domain import Candidate


class MixedProposer:
    """Asks each proposer in turn for the same role; the gate then judges all candidates together."""

    name = "mixed"

    def __init__(self, *proposers: Proposer):
        if not proposers:
            raise ValueError("MixedProposer needs at least one proposer")
        self.proposers = proposers

    def propose(self, role: str, context: ProposalContext) -> list[Candidate]:
        out: list[Candidate] = []
        for proposer in self.proposers:
            out.extend(proposer.propose(role, context))
        return out

    @property
    def last_dropped(self) -> list[tuple[str, str]]:
        """What the members dropped in their last `propose`, for those that report it."""
        return [item for p in self.proposers for item in getattr(p, "last_dropped", [])]

    @property
    def budget_exhausted(self) -> bool:
        return any(getattr(p, "budget_exhausted", False) for p in self.proposers)
