"""The gate: which candidates join the pool, which pool members leave, and why.

Deterministic, in four steps (every verdict carries its reasons with the numbers behind it):

1. viability: enough precision for the proposer's role, enough fires, not faulting on most rows;
2. diversity: no near-copy (Jaccard of fired dev rows) of a pool member or an earlier newcomer; a newcomer
   that covers a pool member's fired rows with clearly higher precision replaces (prunes) it -- such a
   member is not held against the newcomer in the Jaccard check, since replacing it is the point;
3. marginal contribution: greedily drop the newcomer whose removal raises pool dev macro-F1 the most;
4. do no harm: if the pool would get worse than before by more than a tolerance, revert the generation.

Human verdicts win: a human-rejected candidate is rejected, a human-approved one is accepted without
checks (and kept through a revert), and a human-approved pool member is never pruned. Their decisions
carry the human's verdict ("approve" / "reject") and `decided_by="human"`, so recording them again keeps
the lock. A candidate whose id is already in the pool is judged as a pool member, not as a newcomer.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.domain import ABSTAIN, Annotator, AnnotatorScore, GateDecision
from engine.score import pool_macro_f1, score_annotator

_TOL = 1e-9  # float slack, so 0.35 - 0.30 counts as a 0.05 margin


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

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> GateConfig:
        """Build from a (possibly partial) mapping; unknown keys are an error, not silently ignored."""
        values = dict(values or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown gate setting(s) {unknown}; known: {sorted(fields)}")
        typed = {k: (int(v) if isinstance(fields[k].default, int) else float(v)) for k, v in values.items()}
        return cls(**typed)

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


def _viability(score: AnnotatorScore, role: str, n_dev: int, cfg: GateConfig) -> tuple[bool, list[str]]:
    min_p = cfg.min_precision(role)
    fails = []
    if score.faults > n_dev / 2:
        fails.append(f"faults on {score.faults} of {n_dev} dev rows (more than half)")
    if score.fires < cfg.min_fires:
        fails.append(f"fires {score.fires} < {cfg.min_fires}")
    if score.precision < min_p - _TOL:
        fails.append(f"precision {_cmp(score.precision, '<', min_p)} ({role})")
    if fails:
        return False, fails
    return True, [(f"viable: precision {_cmp(score.precision, '>=', min_p)} ({role}), "
                   f"fires {score.fires} >= {cfg.min_fires}")]


def run_gate(
    pool_ids: Sequence[str],
    pool_votes: np.ndarray,
    pool_scores: Mapping[str, AnnotatorScore],
    candidates: Sequence[tuple[Annotator, np.ndarray, AnnotatorScore]],
    y_dev: np.ndarray,
    n_classes: int,
    config: GateConfig = GateConfig(),
    human_locked: Mapping[str, str] | None = None,
) -> GateOutcome:
    """Judge one generation's candidates against the pool on the dev split (votes: (n_dev, m) / (n_dev,)).

    y_dev: (n_dev,) class ids, or (n_dev, k) 0/1 label sets for a multi-label task (see engine/score.py).
    """
    cfg, locked = config, dict(human_locked or {})
    y = np.asarray(y_dev, dtype=np.int64)
    n = y.shape[0]
    pool_ids = list(pool_ids)
    pv = np.asarray(pool_votes, dtype=np.int64).reshape(n, len(pool_ids))
    col = {pid: pv[:, j] for j, pid in enumerate(pool_ids)}
    prec = {pid: (pool_scores.get(pid) or score_annotator(pid, col[pid], y)).precision for pid in pool_ids}
    f1_before = pool_macro_f1(pv, y, n_classes)

    # one entry per distinct candidate id, in candidate order
    ids: list[str] = []
    votes: dict[str, np.ndarray] = {}
    verdict: dict[str, str] = {}
    reasons: dict[str, list[str]] = {}
    by: dict[str, str] = {}
    forced: set[str] = set()
    live: list[str] = []  # passed viability, in order
    for ann, cand_votes, score in candidates:
        if ann.id in votes:
            continue
        v = np.asarray(cand_votes, dtype=np.int64).ravel()
        if v.shape[0] != n:
            raise ValueError(f"candidate {ann.id} has {v.shape[0]} dev votes, expected {n}")
        ids.append(ann.id)
        votes[ann.id], by[ann.id] = v, "gate"
        lock = locked.get(ann.id)
        if lock == "reject":
            verdict[ann.id], reasons[ann.id], by[ann.id] = "reject", ["rejected by a human earlier"], "human"
        elif lock == "approve":
            verdict[ann.id], reasons[ann.id], by[ann.id] = "approve", ["approved by a human earlier"], "human"
            prec.setdefault(ann.id, score.precision)
            if ann.id not in col:
                forced.add(ann.id)
                live.append(ann.id)
        elif ann.id in col:
            verdict[ann.id], reasons[ann.id] = "accept", ["already in the pool; judged as a pool member"]
        else:
            ok, why = _viability(score, ann.agent, n, cfg)
            verdict[ann.id], reasons[ann.id] = ("accept" if ok else "reject"), why
            if ok:
                live.append(ann.id)
            prec[ann.id] = score.precision

    # diversity, in candidate order: Jaccard against the current pool and the newcomers kept so far
    fired = {k: v != ABSTAIN for k, v in {**col, **votes}.items()}
    active = list(pool_ids)
    pruned_by: dict[str, str] = {}
    prune_why: dict[str, str] = {}
    kept: list[str] = []
    for cid in live:
        prunable = []
        for pid in active:
            size = int(fired[pid].sum())
            if locked.get(pid) == "approve" or size == 0:
                continue
            cover = float(np.sum(fired[pid] & fired[cid])) / size
            if cover >= cfg.prune_cover - _TOL and prec[cid] - prec[pid] >= cfg.prune_precision_margin - _TOL:
                prunable.append(pid)
                prune_why[pid] = (f"covered by {cid}: {_cmp(cover, '>=', cfg.prune_cover)} of its fired dev "
                                  f"rows, precision {_cmp(prec[cid], '>=', prec[pid])} + "
                                  f"{cfg.prune_precision_margin:g}")
        if cid not in forced:
            others = [p for p in active if p not in prunable] + kept
            sims = [(_jaccard(fired[cid], fired[o]), o) for o in others]
            best, other = max(sims, key=lambda t: t[0]) if sims else (0.0, None)
            if best > cfg.max_jaccard + _TOL:
                verdict[cid] = "reject"
                reasons[cid].append(f"fired dev rows too similar to {other}: Jaccard "
                                    f"{_cmp(best, '>', cfg.max_jaccard)}")
                continue
            reasons[cid].append(f"diverse: max Jaccard {_cmp(best, '<=', cfg.max_jaccard)}"
                                + (f" (vs {other})" if other else ""))
        kept.append(cid)
        for pid in prunable:
            active.remove(pid)
            pruned_by[pid] = cid

    def pool_of(newcomers: Sequence[str], allow_prunes: bool = True) -> tuple[list[str], np.ndarray]:
        members = [p for p in pool_ids if not (allow_prunes and pruned_by.get(p) in newcomers)]
        members += [c for c in ids if c in newcomers]
        matrix = np.column_stack([col.get(m, votes.get(m)) for m in members]) if members else pv[:, :0]
        return members, matrix

    def f1_of(newcomers: Sequence[str], allow_prunes: bool = True) -> float:
        return pool_macro_f1(pool_of(newcomers, allow_prunes)[1], y, n_classes)

    # marginal contribution: greedily drop the newcomer whose removal helps most
    current = list(kept)
    while True:
        base = f1_of(current)
        gains = [(f1_of([c for c in current if c != cid]) - base, cid) for cid in current if cid not in forced]
        if not gains:
            break
        gain, worst = max(gains, key=lambda t: t[0])  # max keeps the first of equal gains
        if gain <= cfg.marginal_epsilon + _TOL:
            break
        current.remove(worst)
        verdict[worst] = "reject"
        reasons[worst].append(f"removing it raises pool dev macro-F1 {base:.3f} -> {base + gain:.3f} "
                              f"(+{gain:.3f} > {cfg.marginal_epsilon:g})")
    f1_after = f1_of(current)
    for cid in current:
        if cid not in forced:
            without = f1_of([c for c in current if c != cid])
            reasons[cid].append(f"marginal: pool dev macro-F1 {without:.3f} without it, {f1_after:.3f} with it")

    # do no harm: compare with the old pool plus the human-approved newcomers
    baseline = f1_of(sorted(forced), allow_prunes=False)
    reverted = f1_after < baseline - cfg.harm_tolerance - _TOL
    if reverted:
        why = (f"generation reverted: pool dev macro-F1 would fall {baseline:.3f} -> {f1_after:.3f} "
               f"(more than {cfg.harm_tolerance:g} below before)")
        for cid in current:
            if cid not in forced:
                verdict[cid], reasons[cid] = "reject", [why, *reasons[cid]]
        current = [c for c in current if c in forced]
    members, matrix = pool_of(current, allow_prunes=not reverted)
    decisions = [GateDecision(cid, verdict[cid], tuple(reasons[cid]), by[cid]) for cid in ids]
    if not reverted:
        decisions += [GateDecision(p, "prune", (prune_why[p],)) for p in pool_ids if pruned_by.get(p) in current]
    return GateOutcome(
        decisions=tuple(decisions),
        pool_ids=tuple(members),
        f1_before=f1_before,
        f1_after=pool_macro_f1(matrix, y, n_classes),
        reverted=reverted,
    )
