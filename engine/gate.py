"""The gate: which candidates join the pool, which pool members leave, and why.

Deterministic, in four steps (every verdict carries its reasons with the numbers behind it):

1. viability: enough precision for the proposer's role, enough fires, not faulting on most rows, and a
   precision above chance (the share of dev its voted classes hold: "words <= 54" voting the biggest class
   is right as often as a coin weighted by that class, and says nothing);
2. diversity: no near-copy (Jaccard of fired dev rows) of a pool member or an earlier newcomer; a newcomer
   that covers a pool member's fired rows with clearly higher precision replaces (prunes) it -- such a
   member is not held against the newcomer in the Jaccard check, since replacing it is the point;
3. marginal contribution: greedily drop the newcomer whose removal raises pool dev macro-F1 the most;
4. do no harm: if the pool would get worse than before by more than a tolerance, revert the generation.

Human verdicts win: a human-rejected candidate is rejected, a human-approved one is accepted without
checks (and kept through a revert), and a human-approved pool member is never pruned. Their decisions
carry the human's verdict ("approve" / "reject") and `decided_by="human"`; `Store.complete_generation` does not
write them (the expert's own verdict already stands, and an undo given meanwhile must not be reversed).
A candidate whose id is already in the pool is judged as a pool member, not as a newcomer.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.domain import ABSTAIN, APPROVED_EARLIER, REJECTED_EARLIER, Annotator, AnnotatorScore, GateDecision
from engine.metrics.score import (
    chance_precision,
    fires_needed,
    pool_macro_f1,
    score_annotator,
    voted_class_rows,
    wilson_lower,
)

_TOL = 1e-9  # float slack, so 0.35 - 0.30 counts as a 0.05 margin


def _setting(name: str, value: Any, kind: type) -> float:
    """A gate setting as its type: a number or a number's text (a whole one for a count), else a ValueError
    naming it."""
    given = value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"gate setting {name}: {given!r} is not a number")
    if kind is int and value != int(value):
        raise ValueError(f"gate setting {name}: {given!r} is a count, so a whole number")
    return kind(value)


@dataclass(frozen=True)
class GateConfig:
    """Gate thresholds; every one is configurable per project."""

    min_precision_generator: float = 0.30
    min_precision_other: float = 0.25  # improver, refiner, human
    min_fires: int = 5
    max_jaccard: float = 0.95
    prune_cover: float = 0.95
    prune_precision_margin: float = 0.05
    marginal_epsilon: float = 0.001
    harm_tolerance: float = 0.02
    precision_z: float = 0.5  # viability reads the Wilson lower bound of precision at this z (0: the raw figure)
    # precision (its lower bound when precision_z > 0) must exceed this times chance (its voted classes' share of
    # dev); 0: off
    min_lift: float = 1.0
    # fewer fires (but at least this many) for an annotator whose biggest voted class dev holds fewer than min_fires
    # rows of (`engine.metrics.score.fires_needed`); 0: min_fires for every class
    small_class_fires: int = 3

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> GateConfig:
        """Build from a (possibly partial) mapping; unknown keys are an error, not silently ignored."""
        if values is not None and not isinstance(values, Mapping):
            raise ValueError(f"gate settings are an object of setting: number, not {type(values).__name__}")
        values = dict(values or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown gate setting(s) {unknown}; known: {sorted(fields)}")
        settings: dict[str, Any] = {k: _setting(k, v, int if isinstance(fields[k].default, int) else float)
                                    for k, v in values.items()}
        return cls(**settings)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def min_precision(self, role: str) -> float:
        return self.min_precision_generator if role == "generator" else self.min_precision_other


@dataclass(frozen=True)
class GateOutcome:
    """The gate's verdicts (candidates in order, then prunes) and the pool after it."""

    decisions: tuple[GateDecision, ...]
    pool_ids: tuple[str, ...]  # old members minus pruned, then accepted newcomers in candidate order
    f1_before: float  # pool dev macro-F1 (majority vote) before the generation
    f1_after: float
    reverted: bool = False

    @property
    def accepted_ids(self) -> tuple[str, ...]:
        return tuple(d.annotator_id for d in self.decisions if d.verdict in ("accept", "approve"))

    @property
    def pruned_ids(self) -> tuple[str, ...]:
        return tuple(d.annotator_id for d in self.decisions if d.verdict == "prune")


def _cmp(a: float, op: str, b: float) -> str:
    """'0.22 < 0.25', with more digits only where two decimals would show equal numbers."""
    for digits in (2, 3, 4, 6):
        sa, sb = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if sa != sb:
            break
    return f"{sa} {op} {sb}"


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    union = int(np.sum(a | b))
    return float(np.sum(a & b)) / union if union else 0.0


def _small_class_note(needed: int, cfg: GateConfig, class_rows: int) -> str:
    """What a fires verdict adds when the small-class rule set the count (engine/expert/explain.py reads it back)."""
    return f" (its class has {class_rows} dev rows)" if needed < cfg.min_fires else ""


def _viability(score: AnnotatorScore, role: str, n_run: int, cfg: GateConfig,
               chance: float = 0.0, evidence: tuple[float, float] | None = None,
               class_rows: int = 0) -> tuple[bool, list[str]]:
    min_p = cfg.min_precision(role)
    fails = []
    if score.faults > n_run / 2:
        fails.append(f"faults on {score.faults} of {n_run} dev rows (more than half)")
    needed = fires_needed(cfg.min_fires, class_rows, cfg.small_class_fires)
    if score.fires < needed:
        fails.append(f"fires {score.fires} < {needed}" + _small_class_note(needed, cfg, class_rows))
    # a precision seen on few fires is partly chance (5 of 5 is not 1.0): judge its lower confidence bound
    lower = wilson_lower(round(score.precision * score.fires), score.fires, cfg.precision_z)
    shown = (f"precision {score.precision:.2f}, lower bound {lower:.2f} over {score.fires} fires"
             if cfg.precision_z > 0 else "precision")
    if evidence is not None and evidence[1] > 0 and score.fires and cfg.precision_z > 0:
        # dev's few rows pooled with what a dev-fitted text classifier's guesses say on the unlabeled sample
        estimate, weight = evidence
        n = score.fires + weight
        lower = wilson_lower((score.precision * score.fires + estimate * weight), n, cfg.precision_z)
        shown = (f"precision {score.precision:.2f} over {score.fires} dev fires and about {estimate:.2f} on the "
                 f"unlabeled sample (worth {weight:.0f} rows), lower bound {lower:.2f}")
    # chance is judged on the same bound: a raw 0.60 over a class share of 0.53, from a handful of fires and a
    # guessed-label estimate, left a bound of 0.45 and a rule on digit counts in the pool
    judged = lower if cfg.precision_z > 0 else score.precision
    if cfg.min_lift > 0 and score.fires and judged <= chance * cfg.min_lift + _TOL:
        fails.insert(0, f"no better than chance: precision {'lower bound ' if cfg.precision_z > 0 else ''}"
                     f"{judged:.2f} <= {chance * cfg.min_lift:.2f}, the share of dev its classes hold"
                     + (f" x {cfg.min_lift:g}" if cfg.min_lift != 1 else ""))
    if lower < min_p - _TOL:
        fails.append(f"{shown}: {_cmp(lower, '<', min_p)} ({role})" if cfg.precision_z > 0 else
                     f"precision {_cmp(score.precision, '<', min_p)} ({role})")
    if fails:
        return False, fails
    return True, [(f"viable: {shown}: {_cmp(lower, '>=', min_p)} ({role}), " if cfg.precision_z > 0 else
                   f"viable: precision {_cmp(score.precision, '>=', min_p)} ({role}), ")
                  + f"fires {score.fires} >= {needed}" + _small_class_note(needed, cfg, class_rows)
                  + (f", precision {score.precision:.2f} vs chance {chance:.2f}" if chance > 0 else "")]


@dataclass
class CandidateRecord:
    """One candidate on its way through the four checks: what it brought, and the verdict and reasons so far."""

    annotator: Annotator
    votes: np.ndarray  # (n_dev,) class ids or ABSTAIN
    score: AnnotatorScore
    verdict: str = ""  # "" until a human lock, the pool or the viability check decides
    reasons: list[str] = field(default_factory=list)
    decided_by: str = "gate"
    forced: bool = False  # a human-approved newcomer: joins without checks and survives a revert
    in_play: bool = False  # a newcomer that goes on to diversity and marginal contribution

    @property
    def id(self) -> str:
        return self.annotator.id

    def decide(self, verdict: str, *reasons: str, decided_by: str = "gate") -> None:
        self.verdict, self.reasons, self.decided_by = verdict, list(reasons), decided_by

    def reject(self, reason: str) -> None:
        self.verdict = "reject"
        self.reasons.append(reason)

    def decision(self) -> GateDecision:
        return GateDecision(self.id, self.verdict, tuple(self.reasons), self.decided_by)


@dataclass
class GenerationState:
    """What every check reads: the dev labels, the old pool, this generation's records, and the prunes so far."""

    y: np.ndarray
    n_classes: int
    pool_ids: list[str]
    pool_votes: np.ndarray  # (n_dev, len(pool_ids))
    pool_precision: dict[str, float]
    records: list[CandidateRecord]  # one per distinct candidate id, in candidate order
    locked: dict[str, str]  # annotator id -> the human's verdict
    pruned_by: dict[str, str] = field(default_factory=dict)  # pool member -> the newcomer that replaces it
    prune_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def columns(self) -> dict[str, np.ndarray]:
        return {pid: self.pool_votes[:, j] for j, pid in enumerate(self.pool_ids)}

    def members(self, newcomers: Sequence[str], allow_prunes: bool = True) -> tuple[list[str], np.ndarray]:
        """The pool with these newcomers (ids) joined: old members (minus those they prune), then newcomers."""
        columns = self.columns
        members = [p for p in self.pool_ids if not (allow_prunes and self.pruned_by.get(p) in newcomers)]
        members += [r.id for r in self.records if r.id in newcomers]
        by_id = {r.id: r.votes for r in self.records}
        matrix = (np.column_stack([columns[m] if m in columns else by_id[m] for m in members]) if members
                  else self.pool_votes[:, :0])
        return members, matrix

    def f1(self, newcomers: Sequence[str], allow_prunes: bool = True) -> float:
        """The gate's estimate of a pool's quality: majority-vote dev macro-F1 of `members(...)`."""
        return pool_macro_f1(self.members(newcomers, allow_prunes)[1], self.y, self.n_classes)


def _intake(candidates: Sequence[tuple[Annotator, np.ndarray, AnnotatorScore]], pool_ids: Sequence[str],
            locked: Mapping[str, str], n_dev: int) -> list[CandidateRecord]:
    """One record per distinct candidate id; human locks and ids already in the pool are decided here."""
    records: list[CandidateRecord] = []
    seen: set[str] = set()
    for annotator, cand_votes, score in candidates:
        if annotator.id in seen:
            continue
        seen.add(annotator.id)
        v = np.asarray(cand_votes, dtype=np.int64).ravel()
        if v.shape[0] != n_dev:
            raise ValueError(f"candidate {annotator.id} has {v.shape[0]} dev votes, expected {n_dev}")
        record = CandidateRecord(annotator, v, score)
        lock = locked.get(annotator.id)
        if lock == "reject":
            record.decide("reject", REJECTED_EARLIER, decided_by="human")
        elif lock == "approve":
            record.decide("approve", APPROVED_EARLIER, decided_by="human")
            record.forced = record.in_play = annotator.id not in pool_ids
        elif annotator.id in pool_ids:
            record.decide("accept", "already in the pool; judged as a pool member")
        records.append(record)
    return records


def check_viability(record: CandidateRecord, n_run: int, cfg: GateConfig, chance: float = 0.0,
                    evidence: tuple[float, float] | None = None, class_rows: int = 0) -> None:
    """Check 1: enough precision for the proposer's role, enough fires, not faulting on most dev rows, better
    than chance (`chance`: the precision its votes would get on random rows). `evidence`: (precision estimate,
    weight in rows) from the pool sample's pseudo-labels (engine/pseudo_labels.py), pooled with dev's counts.
    `class_rows`: dev rows of the biggest class it votes (`voted_class_rows`; 0: min_fires applies as is).
    `n_run`: the rows its fault count is over."""
    ok, why = _viability(record.score, record.annotator.agent, n_run, cfg, chance, evidence, class_rows)
    record.decide("accept" if ok else "reject", *why)
    record.in_play = ok


def _prune_reason(member: np.ndarray, newcomer: np.ndarray, newcomer_id: str, member_precision: float,
                  newcomer_precision: float, cfg: GateConfig) -> str | None:
    """Why a newcomer (fired rows `newcomer`) replaces a pool member (fired rows `member`): it fires on at least
    `prune_cover` of the member's rows with precision higher by `prune_precision_margin`; None when it does not."""
    size = int(member.sum())
    if size == 0:
        return None
    cover = float(np.sum(member & newcomer)) / size
    if (cover >= cfg.prune_cover - _TOL
            and newcomer_precision - member_precision >= cfg.prune_precision_margin - _TOL):
        return (f"covered by {newcomer_id}: {_cmp(cover, '>=', cfg.prune_cover)} of its fired dev rows, precision "
                f"{_cmp(newcomer_precision, '>=', member_precision)} + {cfg.prune_precision_margin:g}")
    return None


def check_diversity(state: GenerationState, cfg: GateConfig) -> list[CandidateRecord]:
    """Check 2, in candidate order: reject a near-copy (Jaccard of fired dev rows) of a pool member or of a
    newcomer kept so far; record the pool members a kept newcomer replaces. Returns the kept newcomers."""
    # a pool member's id among the candidates fires where the candidate's votes do
    fired = {k: v != ABSTAIN for k, v in {**state.columns, **{r.id: r.votes for r in state.records}}.items()}
    precision = {**state.pool_precision, **{r.id: r.score.precision for r in state.records if r.in_play}}
    active = list(state.pool_ids)
    kept: list[CandidateRecord] = []
    for record in (r for r in state.records if r.in_play):
        cid = record.id
        prunable: dict[str, str] = {}
        for pid in active:
            if state.locked.get(pid) == "approve":
                continue
            reason = _prune_reason(fired[pid], fired[cid], cid, precision[pid], precision[cid], cfg)
            if reason is not None:
                prunable[pid] = reason
        if not record.forced:
            others = [p for p in active if p not in prunable] + [k.id for k in kept]
            sims = [(_jaccard(fired[cid], fired[o]), o) for o in others]
            best, other = max(sims, key=lambda t: t[0]) if sims else (0.0, None)
            if best > cfg.max_jaccard + _TOL:
                record.reject(f"fired dev rows too similar to {other}: Jaccard "
                              f"{_cmp(best, '>', cfg.max_jaccard)}")
                continue
            record.reasons.append(f"diverse: max Jaccard {_cmp(best, '<=', cfg.max_jaccard)}"
                                  + (f" (vs {other})" if other else ""))
        kept.append(record)
        for pid, reason in prunable.items():
            active.remove(pid)
            state.pruned_by[pid], state.prune_reasons[pid] = cid, reason
    return kept


def check_marginal_contribution(state: GenerationState, kept: Sequence[CandidateRecord],
                                cfg: GateConfig) -> list[CandidateRecord]:
    """Check 3: greedily drop the newcomer whose removal raises the pool's dev macro-F1 the most, while that
    gain exceeds the epsilon. Returns the newcomers that stay."""
    current = list(kept)

    def ids(records: Sequence[CandidateRecord], leave_out: CandidateRecord | None = None) -> list[str]:
        return [r.id for r in records if r is not leave_out]

    while True:
        base = state.f1(ids(current))
        gains = [(state.f1(ids(current, r)) - base, r) for r in current if not r.forced]
        if not gains:
            break
        gain, worst = max(gains, key=lambda t: t[0])  # max keeps the first of equal gains
        if gain <= cfg.marginal_epsilon + _TOL:
            break
        current.remove(worst)
        worst.reject(f"removing it raises pool dev macro-F1 {base:.3f} -> {base + gain:.3f} "
                     f"(+{gain:.3f} > {cfg.marginal_epsilon:g})")
    f1_after = state.f1(ids(current))
    for record in current:
        if not record.forced:
            without = state.f1(ids(current, record))
            record.reasons.append(f"marginal: pool dev macro-F1 {without:.3f} without it, {f1_after:.3f} with it")
    return current


def check_restored_copies(state: GenerationState, current: Sequence[CandidateRecord],
                          cfg: GateConfig) -> list[CandidateRecord]:
    """After check 3: a pool member pruned by a newcomer that did not stay is back, and check 2 compared later
    newcomers with its pruner, not with it. A staying newcomer that is a near copy of such a member replaces it when
    it passes check 2's prune test against it (covers it, more precise), else is rejected (until no rejection brings
    another member back). Returns the newcomers that stay."""
    current = list(current)
    if not state.pruned_by:  # the usual generation: nobody was pruned, so nobody can be back
        return current
    fired = {**{k: v != ABSTAIN for k, v in state.columns.items()}, **{r.id: r.votes != ABSTAIN for r in current}}
    while True:
        staying = {r.id for r in current}
        back = [p for p, by in state.pruned_by.items() if by not in staying]
        pairs = ((r, p, _jaccard(fired[r.id], fired[p])) for r in current if not r.forced for p in back)
        copy = next((pair for pair in pairs if pair[2] > cfg.max_jaccard + _TOL), None)
        if copy is None:
            return current
        record, member, similarity = copy
        replaces = _prune_reason(fired[member], fired[record.id], record.id, state.pool_precision[member],
                                 record.score.precision, cfg)
        if replaces is not None and state.locked.get(member) != "approve":
            state.pruned_by[member], state.prune_reasons[member] = record.id, replaces
            record.reasons.append(f"replaces {member}, back in the pool when the newcomer that would have replaced "
                                  "it did not stay")
            continue
        record.reject(f"fired dev rows too similar to {member} (kept: the newcomer that would replace it did not "
                      f"stay): Jaccard {_cmp(similarity, '>', cfg.max_jaccard)}")
        current.remove(record)


def check_do_no_harm(state: GenerationState, current: Sequence[CandidateRecord],
                     cfg: GateConfig) -> tuple[list[CandidateRecord], bool]:
    """Check 4: revert the generation (keeping only human-approved newcomers) if the pool would end more than
    the tolerance below the old pool plus those newcomers. Returns the newcomers that stay and whether reverted."""
    f1_after = state.f1([r.id for r in current])
    baseline = state.f1([r.id for r in state.records if r.forced], allow_prunes=False)
    if not f1_after < baseline - cfg.harm_tolerance - _TOL:
        return list(current), False
    why = (f"generation reverted: pool dev macro-F1 would fall {baseline:.3f} -> {f1_after:.3f} "
           f"(more than {cfg.harm_tolerance:g} below before)")
    for record in current:
        if not record.forced:
            record.verdict, record.reasons = "reject", [why, *record.reasons]
    return [r for r in current if r.forced], True


def run_gate(
    pool_ids: Sequence[str],
    pool_votes: np.ndarray,
    pool_scores: Mapping[str, AnnotatorScore],
    candidates: Sequence[tuple[Annotator, np.ndarray, AnnotatorScore]],
    y_dev: np.ndarray,
    n_classes: int,
    config: GateConfig = GateConfig(),
    human_locked: Mapping[str, str] | None = None,
    pool_evidence: Mapping[str, tuple[float, float]] | None = None,
    rows_run: Mapping[str, int] | None = None,
) -> GateOutcome:
    """Judge one generation's candidates against the pool on the dev split (votes: (n_dev, m) / (n_dev,)).

    y_dev: (n_dev,) class ids, or (n_dev, k) 0/1 label sets for a multi-label task (see engine/metrics/score.py).
    pool_evidence: candidate id -> (precision estimate, weight in rows) on the unlabeled pool sample, pooled with
    the dev counts in the viability check (none: dev alone).
    rows_run: candidate id -> the rows its fault count is over, when its sandbox run covered more than the fitness
    rows (a generation runs candidates on all of dev, audit rows too); default: the fitness rows.
    """
    y = np.asarray(y_dev, dtype=np.int64)
    n = y.shape[0]
    pool_ids = list(pool_ids)
    pv = np.asarray(pool_votes, dtype=np.int64).reshape(n, len(pool_ids))
    precision = {pid: (pool_scores.get(pid) or score_annotator(pid, pv[:, j], y)).precision
                 for j, pid in enumerate(pool_ids)}
    locked = dict(human_locked or {})
    records = _intake(candidates, pool_ids, locked, n)
    for record in records:
        if not record.verdict:
            check_viability(record, (rows_run or {}).get(record.id, n), config,
                            chance_precision(record.votes, y, n_classes),
                            (pool_evidence or {}).get(record.id), voted_class_rows(record.votes, y, n_classes))
    state = GenerationState(y, n_classes, pool_ids, pv, precision, records, locked)

    kept = check_diversity(state, config)
    current = check_marginal_contribution(state, kept, config)
    current = check_restored_copies(state, current, config)
    current, reverted = check_do_no_harm(state, current, config)

    members, matrix = state.members([r.id for r in current], allow_prunes=not reverted)
    decisions = [r.decision() for r in records]
    if not reverted:
        staying = {r.id for r in current}
        decisions += [GateDecision(p, "prune", (state.prune_reasons[p],), pruned_by=state.pruned_by[p])
                      for p in pool_ids if state.pruned_by.get(p) in staying]
    return GateOutcome(
        decisions=tuple(decisions),
        pool_ids=tuple(members),
        f1_before=pool_macro_f1(pv, y, n_classes),
        f1_after=pool_macro_f1(matrix, y, n_classes),
        reverted=reverted,
    )
