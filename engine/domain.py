"""Frozen domain values passed between the engine's stages.

Labels travel as integer class indices into `Task.labels`; `ABSTAIN` (-1) means "no vote".
Annotator code itself returns label *names*; the sandbox maps them to indices.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

ABSTAIN = -1
SPLITS = ("pool", "dev", "test")  # pool: unlabeled work; dev: fitness; test: holdout, only `evopool eval`
# dev's two row sets: the agents and the gate see only `fitness`; `audit` rows (a stratified share fixed at
# import) are held back from them, so the pool's selection bias does not leak into choosing the aggregator
FITNESS, AUDIT = "fitness", "audit"
AUDIT_MIN_ROWS_TO_JUDGE = 50  # below this many audit rows, macro-F1 is too noisy to choose an aggregator by
THIN_FITNESS_ROWS = 10  # below this many fitness rows, a class's precision figures are mostly chance
AGENT_ROLES = ("generator", "improver", "refiner")


@dataclass(frozen=True)
class Task:
    """What is being labeled: the label set and the words an expert (or agent) reads about it."""

    name: str
    labels: tuple[str, ...]
    label_descriptions: Mapping[str, str] = field(default_factory=dict)
    instructions: str = ""
    fields: tuple[str, ...] = ()  # extra example fields besides `text`, e.g. ("entity1", "entity2")
    multi_label: bool = False

    def label_index(self, name: str) -> int:
        return self.labels.index(name)

    def check_label(self, name: str) -> None:
        """ValueError naming the labels when `name` is not one of them."""
        if name not in self.labels:
            raise ValueError(f"unknown label {name!r}; the labels are {', '.join(self.labels)}")


@dataclass(frozen=True)
class Example:
    """One row to label. `label` is a class index, or None where unknown (pool rows)."""

    id: str
    text: str
    split: str
    label: int | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def as_input(self) -> dict[str, Any]:
        """The dict an annotator receives: `text` plus the other fields, never the label."""
        return {**self.fields, "text": self.text}


def code_hash(normalised_source: str) -> str:
    """Annotator id: the same normalised code always gets the same id."""
    return hashlib.sha256(normalised_source.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Annotator:
    """An executable labeling function: Python source defining `annotate(example) -> str | None`."""

    id: str  # code_hash(source)
    name: str
    source: str  # normalised source
    agent: str  # generator | improver | refiner | human
    generation: int
    parent_ids: tuple[str, ...] = ()
    author: str = "agent"  # agent | human
    rationale: str = ""  # why the proposer wrote it (shown to the expert)
    written_by: str = ""  # "llm:<model>" | "offline" | "person"; "" when not recorded (older workspaces)
    # mined against a text classifier's guesses for the pool sample: their agreement with it is no evidence (it was
    # chosen to agree), so the gate weighs none (engine/evolve.py `pool_evidence`)
    mined_on_guesses: bool = False

    @property
    def provenance(self) -> str:
        """Who wrote it, for people: the recorded writer, else what `author` says."""
        return self.written_by or ("person" if self.author == "human" else "agents")


@dataclass(frozen=True)
class Candidate:
    """A proposer's output before checking: raw source plus where it came from."""

    source: str
    agent: str
    name: str = ""
    parent_ids: tuple[str, ...] = ()
    rationale: str = ""
    written_by: str = ""  # "llm:<model>" | "offline" (see `Annotator.written_by`)
    mined_on_guesses: bool = False  # see `Annotator.mined_on_guesses`


@dataclass(frozen=True)
class ExecutionResult:
    """One annotator run over a batch of examples inside the sandbox."""

    annotator_id: str
    votes: np.ndarray  # (n_examples,) int, ABSTAIN = -1
    faults: int = 0  # crashes, timeouts, labels outside the label set
    first_error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class VoteMatrix:
    votes: np.ndarray  # (n_examples, n_annotators) int, ABSTAIN = -1
    example_ids: tuple[str, ...]
    annotator_ids: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return self.votes.shape


@dataclass(frozen=True)
class AnnotatorScore:
    """Fitness of one annotator on the dev split."""

    annotator_id: str
    fires: int  # dev rows where it voted
    coverage: float  # fires / n_dev
    precision: float  # correct / fires (0 when it never fires)
    label: int  # the class it votes most often, ABSTAIN if it never fires
    correct: int
    faults: int = 0


# the note of a version retired for its edit (engine/expert/review.py writes it; engine/expert/explain.py reads it)
REPLACED_BY = "replaced by edited version "

# the reason that carries a rejected candidate's first fault in its run (engine/evolve.py; expert/explain.py reads it)
FIRST_FAULT = "first fault: "

# the reasons the gate gives an annotator the expert locked (engine/gate.py): not written since complete_generation
# dropped them, but older workspaces hold them (engine/store/pool.py's undo states read past them)
REJECTED_EARLIER, APPROVED_EARLIER = "rejected by a human earlier", "approved by a human earlier"
LOCK_ECHOES = (REJECTED_EARLIER, APPROVED_EARLIER)
UNDID = "undid the expert's"  # the last reason of a verdict an undo restored
UNDO = "undo"  # who decided a verdict restored by undoing an expert's (Store.withdraw_human_verdict)


def restored_by_undo(reasons) -> bool:
    """Whether a verdict row is one an undo restored: its last reason says so."""
    return len(reasons) > 0 and str(reasons[-1]).startswith(UNDID)


@dataclass(frozen=True)
class GateDecision:
    """A verdict on one annotator, with the reasons that produced it and who decided."""

    annotator_id: str
    verdict: str  # gate: accept | reject | prune; human: approve | reject
    reasons: tuple[str, ...]
    decided_by: str = "gate"  # gate | human | undo (an expert's verdict undone: the one before it restored)
    note: str = ""  # a human's free-text reason
    pruned_by: str = ""  # a prune: the newcomer that replaces the member (it stands only while that one is in)


@dataclass(frozen=True)
class Generation:
    """The outcome of one propose -> execute -> score -> gate round."""

    number: int
    pool_ids: tuple[str, ...]  # the pool after the gate
    dev_macro_f1_before: float
    dev_macro_f1_after: float
    decisions: tuple[GateDecision, ...]
    n_candidates: int
    reverted: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class SoftLabels:
    probs: np.ndarray  # (n_examples, n_classes), rows sum to 1
    example_ids: tuple[str, ...]
    aggregator: str

    @property
    def hard(self) -> np.ndarray:
        return self.probs.argmax(axis=1)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(axis=1)


@dataclass(frozen=True)
class AutoChoice:
    """Provenance, not a figure: what the auto aggregator chose, judged on which rows, and what it left out."""

    chosen: str
    chosen_on: str | None = None  # "audit" rows, or all "dev" rows when too few; None on multi-label (always evoagg)
    left_out: tuple[str, ...] = ()  # votes-only ingredients left out: the pool was chosen on these same rows


@dataclass(frozen=True)
class Estimate:
    """What the labels are expected to score on new rows (macro-F1), with a `level` interval, from rows that
    neither fitted nor chose what they judge (metrics/estimate.py). Classes with fewer than a handful of judged rows
    (`thin`) or none (`unjudged`) cannot be judged: the interval counts that, and the studio names them."""

    macro_f1: float
    low: float
    high: float
    n_rows: int  # rows the estimate was measured on
    judged_on: str  # "dev": all dev rows (the labels read no selected votes); "audit": rows the pool never saw
    thin: tuple[int, ...] = ()  # class ids with too few judged rows to judge
    unjudged: tuple[int, ...] = ()  # class ids with no judged row at all
    level: float = 0.9
    gain: float = 0.0  # added for fitting on all of dev where the figures were fitted on 80 % of it (learning curve)

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.macro_f1, "interval": [self.low, self.high], "level": self.level,
                "n_rows": self.n_rows, "judged_on": self.judged_on, "thin_classes": list(self.thin),
                "unjudged_classes": list(self.unjudged), "learning_gain": self.gain}

    def shifted(self, gain: float) -> Estimate:
        """The same estimate for labels fitted on all of dev: `gain` added to the figure and its interval."""
        def up(value: float) -> float:
            return round(min(1.0, value + gain), 4)
        return replace(self, macro_f1=up(self.macro_f1), low=up(self.low), high=up(self.high),
                       gain=round(self.gain + gain, 4))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> Estimate | None:
        if not values or values.get("estimate") is None:
            return None
        low, high = values["interval"]
        return cls(float(values["estimate"]), float(low), float(high), int(values["n_rows"]),
                   str(values["judged_on"]), tuple(values.get("thin_classes", ())),
                   tuple(values.get("unjudged_classes", ())), float(values.get("level", 0.9)),
                   float(values.get("learning_gain", 0.0)))

    def sentence(self, labels: tuple[str, ...]) -> str:
        """The headline an expert reads: the figure, its interval, its rows, and the classes it cannot judge."""
        rows = "audit rows (held back from the agents and the gate)" if self.judged_on == AUDIT else "dev rows"
        text = (f"expected macro-F1 {self.macro_f1:.2f}, {self.level:.0%} interval {self.low:.2f}–{self.high:.2f}, "
                f"from {self.n_rows:,} {rows}")
        weak = [labels[c] for c in sorted((*self.unjudged, *self.thin)) if c < len(labels)]
        if weak:
            shown = ", ".join(weak[:6]) + (f" and {len(weak) - 6} more" if len(weak) > 6 else "")
            text += (f"; {shown} {'has' if len(weak) == 1 else 'have'} too few rows to judge (counted in the "
                     "interval)")
        return text


@dataclass(frozen=True)
class DevScores:
    """A labeling's out-of-fold figures on the dev rows (and the audit rows among them), and auto's choice.

    Every figure is None where it does not apply (single-label: accuracy, ece; multi-label: micro_f1,
    exact_match, threshold) or was not computed (labeling without dev scoring). `to_dict` gives the JSON
    the saved labels, the export manifest and the CLI have always written; `from_dict` reads it back.
    """

    macro_f1: float | None = None
    accuracy: float | None = None
    micro_f1: float | None = None
    exact_match: float | None = None
    ece: float | None = None
    n: int | None = None  # dev rows scored
    threshold: float | None = None  # multi-label: the probability a class needs to be predicted
    audit_macro_f1: float | None = None  # the honest figure: rows the agents and the gate never saw
    n_audit: int | None = None
    choice: AutoChoice | None = None
    uses_pool: bool | None = None  # whether the labels read the pool's votes (a student's teacher included)
    estimate: Estimate | None = None  # the one figure to bet on: chosen and measured on different rows

    _FIGURES = ("macro_f1", "accuracy", "micro_f1", "exact_match", "ece", "n", "threshold", "audit_macro_f1",
                "n_audit")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {key: getattr(self, key) for key in self._FIGURES if getattr(self, key) is not None}
        if self.choice is not None:
            out["chosen"] = self.choice.chosen
            if self.choice.chosen_on is not None:
                out["chosen_on"] = self.choice.chosen_on
            if self.choice.left_out:
                out["left_out"] = list(self.choice.left_out)
        if self.uses_pool is not None:
            out["uses_pool"] = self.uses_pool
        if self.estimate is not None:
            out.update(self.estimate.to_dict())
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> DevScores:
        values = dict(values or {})
        choice = None
        if "chosen" in values:
            choice = AutoChoice(values["chosen"], values.get("chosen_on"), tuple(values.get("left_out", ())))
        return cls(**{key: values[key] for key in cls._FIGURES if key in values}, choice=choice,
                   uses_pool=values.get("uses_pool"), estimate=Estimate.from_dict(values))
