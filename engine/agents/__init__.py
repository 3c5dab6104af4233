"""The three proposer roles (generator, improver, refiner) behind one `Proposer` seam."""
from engine.agents.base import ProposalContext, Proposer

__all__ = ["ProposalContext", "Proposer"]
