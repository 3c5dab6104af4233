"""The three proposer roles (generator, improver, refiner) behind one `Proposer` seam, and the compiled path
for the offline templates they emit (compiled.py, compiled_executor.py: the default executor)."""
from engine.agents.base import ProposalContext, Proposer

__all__ = ["ProposalContext", "Proposer"]
