"""The expert's judgement as the agents use it: a rejected idea is not proposed again, in any wording.

A rejected annotator written from a template (engine/specs/templates.py) is read back into its spec; a new
proposal repeats it when it votes the same class the same way: the same surface feature, or cues in the same
view that mostly overlap (Jaccard >= 0.5). Free-form code is matched by its exact hash only (in the proposer).
"""
from __future__ import annotations

from engine.agents.base import ExpertFeedback
from engine.specs.templates import AnnotatorSpec, parse_spec

SAME_IDEA_JACCARD = 0.5


def rejected_specs(feedback: ExpertFeedback) -> list[AnnotatorSpec]:
    """The specs of the rejected annotators that were written from a template."""
    specs = (parse_spec(annotator.source) for annotator, _ in feedback.rejected)
    return [spec for spec in specs if spec is not None]


def repeats_rejected(spec: AnnotatorSpec, rejected: list[AnnotatorSpec]) -> bool:
    """True when `spec` is, in substance, an idea the expert rejected."""
    for old in rejected:
        if old.kind != spec.kind or old.label != spec.label:
            continue
        if spec.kind == "surface":
            if old.feature == spec.feature and old.op == spec.op:
                return True
            continue
        if old.view != spec.view:
            continue
        a, b = set(old.cues), set(spec.cues)
        if a and b and len(a & b) / len(a | b) >= SAME_IDEA_JACCARD:
            return True
    return False
