"""The three proposer roles (generator, improver, refiner) behind one `Proposer` seam (`base`), played offline
(`offline/`), by an LLM (`llm/`) or both side by side (`mixed`); `choice` builds the one the user picked and
`feedback` keeps the expert's rejected ideas out of later proposals."""
from engine.agents.base import ProposalContext, Proposer

__all__ = ["ProposalContext", "Proposer"]
