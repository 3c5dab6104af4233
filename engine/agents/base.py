"""The proposer seam: what every agent (offline or LLM) receives and returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.domain import ABSTAIN, Annotator, AnnotatorScore, Candidate, Example, Task

if TYPE_CHECKING:
    from engine.pseudo_labels import PseudoLabels


@dataclass(frozen=True)
class ExpertFeedback:
    """The expert's judgement, handed to every agent: what they rejected and why (never propose it again), what
    they approved, how they edited an annotator (follow the direction), and where they aimed the next generation."""

    rejected: tuple[tuple[Annotator, str], ...] = ()  # (annotator, the reason the expert typed)
    approved: tuple[tuple[Annotator, str], ...] = ()
    edits: tuple[tuple[Annotator, Annotator, str], ...] = ()  # (before, after, note)
    focus_terms: tuple[str, ...] = ()  # the words of the group of rows the expert aimed at
    focus_examples: tuple[Example, ...] = ()  # unlabeled rows of that group (label None)

    def __bool__(self) -> bool:
        return bool(self.rejected or self.approved or self.edits or self.focus_terms)


@dataclass(frozen=True)
class ProposalContext:
    """Everything an agent may see. Never holds test (holdout) labels."""

    task: Task
    dev: tuple[Example, ...]  # labeled fitness split
    pool_sample: tuple[Example, ...]  # unlabeled pool rows (label is None), a seeded sample
    annotators: tuple[Annotator, ...]  # the current pool
    scores: dict[str, AnnotatorScore]  # dev fitness of each pool annotator
    dev_votes: np.ndarray  # (n_dev, n_pool) int, ABSTAIN = -1, columns in `annotators` order
    generation: int
    seed: int
    excluded_ids: frozenset[str] = field(default_factory=frozenset)  # rejected by a human: never re-propose
    dev_label_sets: np.ndarray | None = None  # multi-label task: (n_dev, k) 0/1, each Example.label its first
    feedback: ExpertFeedback = field(default_factory=ExpertFeedback)
    pseudo: PseudoLabels | None = None  # a dev-fitted text classifier's guesses for `pool_sample` (no label read)

    @property
    def dev_labels(self) -> np.ndarray:
        return np.array([ex.label for ex in self.dev], dtype=np.int64)

    def uncovered_dev(self) -> np.ndarray:
        """Indices of dev rows on which every pool annotator abstains."""
        if self.dev_votes.size == 0:
            return np.arange(len(self.dev))
        return np.flatnonzero((self.dev_votes == ABSTAIN).all(axis=1))

    def conflicting_dev(self) -> np.ndarray:
        """Indices of dev rows that receive votes for two or more different classes."""
        out = []
        for i, row in enumerate(self.dev_votes):
            fired = row[row != ABSTAIN]
            if fired.size and np.unique(fired).size > 1:
                out.append(i)
        return np.array(out, dtype=np.int64)


class Proposer(Protocol):
    """One seam for all agents. `role` is generator | improver | refiner."""

    name: str

    def propose(self, role: str, context: ProposalContext) -> list[Candidate]: ...
