"""Turning dev statistics into candidate annotators: single cues, keyword banks, surface thresholds.

Works on an `OfflineWorkspace` (the dev and pool-sample indexes built once per proposal call) and yields
`Proposal`s, each carrying the exact dev rows it fires on, for `selection.greedy_select` to rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
from scipy import stats

from engine.agents.offline.cues import ViewIndex, class_counts, smoothed_precision
from engine.agents.offline.selection import Proposal
from engine.domain import Task
from engine.specs import surface
from engine.specs.templates import AnnotatorSpec

FLUKE_P = 0.005  # Poisson tail below which a cue's dev rate is too high for its pool rate
RELATION_SHARE = 0.3  # share of a sentence cue's pool hits that must fall between the two entities
MIN_SAMPLE_ROWS = 200  # pool-sample rows below which the sample checks (`trustworthy`) pass every cue


@dataclass
class OfflineWorkspace:
    """What mining needs from a proposal context, indexed once."""

    task: Task
    views: tuple[str, ...]  # the views cues are mined in; `dev` and `pool` index these and may index more
    y: np.ndarray  # (n_dev,) gold class ids (multi-label: each row's first label)
    onehot: np.ndarray  # (n_dev, k) 0/1: the gold class, or every label of a multi-label row
    dev: ViewIndex
    pool: ViewIndex | None
    dev_surface: dict[str, np.ndarray]  # feature -> (n_dev,) values; empty for relation tasks
    class_prior: np.ndarray  # (k,) share of dev rows per class
    dev_raw: list[str] = field(default_factory=list)  # raw texts, for surface features
    pool_raw: list[str] = field(default_factory=list)
    _pool_surface: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        return len(self.task.labels)

    def hit(self, label: int) -> np.ndarray:
        """(n_dev,) bool: rows a vote for `label` gets right (on a multi-label task: rows whose set holds it)."""
        return self.onehot[:, label] == 1

    def fires(self, spec: AnnotatorSpec, split: str = "dev") -> np.ndarray:
        """Exact fired mask of a spec on dev or on the pool sample (mirrors the rendered code)."""
        index = self.dev if split == "dev" else self.pool
        if index is None:
            return np.zeros(0, dtype=bool)
        if spec.kind == "surface":
            if split == "dev":
                values = self.dev_surface.get(spec.feature)
                if values is None:
                    values = surface.measure_all(self.dev_raw)[spec.feature]
            else:
                if not self._pool_surface:
                    self._pool_surface.update(surface.measure_all(self.pool_raw))
                values = self._pool_surface[spec.feature]
            return surface.fires(values, spec.op, spec.threshold)
        fired = index.fires(spec.view, spec.cues)
        if spec.also:
            fired &= index.fires("sentence", spec.also)
        if spec.unless:
            fired &= ~index.fires(spec.unless_view, spec.unless)
        return fired

    def pool_fires(self, view: str, cues: Sequence[str]) -> int:
        """How often cues fire on the unlabeled pool sample."""
        if self.pool is None or self.pool.n_rows == 0:
            return 0
        return int(self.pool.fires(view, cues).sum())

    def trustworthy(self, view: str, cues: Sequence[str], dev_fires: int) -> bool:
        """Pool-sample checks that a cue is not a dev-only fluke.

        1. Dev and pool come from the same distribution, so a cue firing far more often on dev than its
           pool rate predicts is a topic cluster of a few dev sources (Poisson tail test).
        2. On relation tasks, a whole-sentence cue should be a *relation* word: one that, in the pool,
           often sits between the two entities (topic words and entity names rarely do).
        """
        if self.pool is None or self.pool.n_rows < MIN_SAMPLE_ROWS:
            return True
        in_pool = self.pool_fires(view, cues)
        expected = max(in_pool, 0.5) / self.pool.n_rows * len(self.y)
        if dev_fires >= 2 * expected and stats.poisson.sf(dev_fires - 1, expected) < FLUKE_P:
            return False
        return self.relation_word(view, cues, in_pool)

    def relation_word(self, view: str, cues: Sequence[str], in_pool: int | None = None) -> bool:
        """Check 2 of `trustworthy` alone: on a relation task, a whole-sentence cue must often sit between the two
        entities in the pool sample (True when there is no sample, no relation, or another view). `in_pool`: its
        fires on the sample, when already counted."""
        if self.pool is None or self.pool.n_rows < MIN_SAMPLE_ROWS or view != "sentence" or "between" not in self.views:
            return True
        in_pool = self.pool_fires(view, cues) if in_pool is None else in_pool
        return not in_pool or self.pool_fires("between", cues) >= RELATION_SHARE * in_pool


def cue_proposals(ws: OfflineWorkspace, rows: np.ndarray | None = None, min_precision: float = 0.3,
                  per_class: int = 30, min_fires: int = 5, classes: Sequence[int] | None = None,
                  weight: np.ndarray | None = None) -> list[Proposal]:
    """Single-cue proposals per view and class, ranked by lift x support.

    `rows` (bool mask) restricts the *support* count to rows of interest (e.g. uncovered dev rows) while
    precision is still measured on all of dev, so a cue found on a few rows must hold up everywhere.
    """
    out: list[Proposal] = []
    focus = ws.onehot if rows is None else ws.onehot * rows[:, None]
    wanted = range(ws.n_classes) if classes is None else classes
    for view in ws.views:
        counts = class_counts(ws.dev, view, ws.onehot)
        focus_counts = counts if rows is None else class_counts(ws.dev, view, focus)
        fires = np.asarray(ws.dev.matrix[view].sum(axis=0)).ravel()  # not counts' row sums: label sets overlap
        cues = ws.dev.cues[view]
        for label in wanted:
            correct = counts[:, label]
            prec = smoothed_precision(correct, fires, ws.class_prior[label])
            raw = np.divide(correct, np.maximum(fires, 1))
            ok = (fires >= min_fires) & (raw >= min_precision) & (focus_counts[:, label] > 0)
            if not ok.any():
                continue
            lift = prec - ws.class_prior[label]
            boost = 1.0 if weight is None else weight[label]
            score = lift * np.sqrt(focus_counts[:, label]) * boost
            order = [j for j in np.argsort(-np.where(ok, score, -np.inf)) if ok[j]][: per_class * 3]
            kept = 0
            for j in order:
                cue = cues[j]
                if not ws.trustworthy(view, [cue], int(fires[j])):
                    continue
                spec = AnnotatorSpec("cue", ws.task.labels[label], view, (cue,))
                fired = ws.dev.fires(view, [cue])
                out.append(Proposal(spec, label, fired, prior=float(score[j])))
                kept += 1
                if kept >= per_class:
                    break
    return out


def keyword_banks(ws: OfflineWorkspace, singles: list[Proposal], max_cues: int = 6,
                  min_precision: float = 0.3) -> list[Proposal]:
    """Union of related single cues (same class and view): wider reach at similar precision."""
    by_group: dict[tuple[int, str], list[Proposal]] = {}
    for p in singles:
        by_group.setdefault((p.label, p.spec.view), []).append(p)
    banks: list[Proposal] = []
    for (label, view), group in by_group.items():
        group = sorted(group, key=lambda p: -p.prior)
        if len(group) < 2:
            continue
        for start in range(min(3, len(group))):
            bank = bank_from(ws, label, view, group[start:], max_cues, min_precision)
            if bank is not None:
                banks.append(bank)
    return banks


def bank_from(ws: OfflineWorkspace, label: int, view: str, ranked: list[Proposal], max_cues: int,
              min_precision: float) -> Proposal | None:
    """Grow a bank from the first cue, adding a cue only if it brings new correct rows at good precision."""
    seed = ranked[0]
    cues = list(seed.spec.cues)
    fired = seed.fired.copy()
    base_precision = float(np.mean(ws.hit(label)[fired])) if fired.any() else 0.0
    floor = max(min_precision, 0.8 * base_precision)
    for p in ranked[1:]:
        if len(cues) >= max_cues:
            break
        new = p.fired & ~fired
        if np.count_nonzero(new & ws.hit(label)) < 2:
            continue
        merged = fired | p.fired
        if float(np.mean(ws.hit(label)[merged])) < floor:
            continue
        cues += list(p.spec.cues)
        fired = merged
    if len(cues) < 2 or not ws.trustworthy(view, cues, int(fired.sum())):
        return None
    spec = AnnotatorSpec("cue", ws.task.labels[label], view, tuple(cues))
    correct = int(np.count_nonzero(fired & ws.hit(label)))
    prior = (float(np.mean(ws.hit(label)[fired])) - ws.class_prior[label]) * np.sqrt(correct)
    return Proposal(spec, label, fired, prior=float(prior), note="a bank of cues: any one of them votes")


def exception_variants(ws: OfflineWorkspace, proposals: list[Proposal], top: int = 40) -> list[Proposal]:
    """Cue annotators plus an `unless` word (often a negation) that vetoes most of their wrong votes: looked for in
    the whole text and, on a relation task, between the mentions ("did not inhibit" names no relation for this pair,
    while a "not" elsewhere in the sentence is about something else). The view whose best word gains more (wrong
    votes vetoed minus twice the right ones) wins; on a tie, the whole text."""
    veto_views = ["sentence"] + [v for v in ("between",) if v in ws.views]
    # one-letter vetoes are noise
    too_short = {view: np.array([len(c.strip("*")) < 2 for c in ws.dev.cues[view]], dtype=bool) for view in veto_views}
    out: list[Proposal] = []
    plain = [p for p in proposals if p.spec.kind == "cue" and not p.spec.unless]
    ranked = sorted(plain, key=lambda p: -p.prior)
    for p in ranked[:top]:
        right = p.fired & ws.hit(p.label)
        wrong = p.fired & ~ws.hit(p.label)
        if wrong.sum() < 2:
            continue
        best = max((veto for view in veto_views if (veto := _best_veto(ws, view, p, right, wrong, too_short[view]))),
                   key=lambda veto: veto[0], default=None)
        if best is None:
            continue
        _, view, cue = best
        fired = p.fired & ~ws.dev.fires(view, [cue])
        correct = int(np.count_nonzero(fired & ws.hit(p.label)))
        if fired.sum() == 0:
            continue
        precision = correct / int(fired.sum())
        prior = (precision - ws.class_prior[p.label]) * np.sqrt(correct)
        spec = replace(p.spec, unless=(cue,), unless_view=view)
        where = "" if view == "sentence" else f" {view}"
        out.append(Proposal(spec, p.label, fired, prior=float(prior), note=f"vetoed by '{cue}'{where}"))
    return out


def _best_veto(ws: OfflineWorkspace, view: str, p: Proposal, right: np.ndarray, wrong: np.ndarray,
               too_short: np.ndarray) -> tuple[float, str, str] | None:
    """(gain, view, word) of the word in `view` that vetoes the most of `p`'s wrong votes for few of its right ones
    (at least two wrong, at most a third as many right; `too_short`: the view's cues never to take), or None."""
    matrix, cues = ws.dev.matrix[view], ws.dev.cues[view]
    vetoed_wrong = np.asarray(matrix[wrong].sum(axis=0)).ravel()
    vetoed_right = np.asarray(matrix[right].sum(axis=0)).ravel()
    gain = vetoed_wrong - 2.0 * vetoed_right
    gain[(vetoed_wrong < 2) | (3 * vetoed_right > vetoed_wrong) | too_short] = -np.inf
    j = int(np.argmax(gain))
    if not np.isfinite(gain[j]) or gain[j] <= 0 or cues[j] in p.spec.cues:
        return None
    return float(gain[j]), view, cues[j]


def surface_proposals(ws: OfflineWorkspace, min_precision: float = 0.3, min_fires: int = 5) -> list[Proposal]:
    """Threshold annotators on surface features (text tasks only), best threshold per class and side."""
    out: list[Proposal] = []
    for feature, values in ws.dev_surface.items():
        for threshold in surface.threshold_grid(values):
            for op in (">=", "<="):
                fired = surface.fires(values, op, threshold)
                n = int(fired.sum())
                if n < min_fires or n > 0.9 * len(values):
                    continue
                for label in range(ws.n_classes):
                    correct = int(np.count_nonzero(fired & ws.hit(label)))
                    prec = correct / n
                    if prec < min_precision:
                        continue
                    lift = smoothed_precision(np.array(correct), np.array(n), ws.class_prior[label]) - \
                        ws.class_prior[label]
                    if lift <= 0:
                        continue
                    spec = AnnotatorSpec("surface", ws.task.labels[label], feature=feature, op=op,
                                         threshold=threshold)
                    out.append(Proposal(spec, label, fired, prior=float(lift * np.sqrt(correct))))
    return out


def build_workspace(task: Task, dev_inputs: list[dict], y: np.ndarray, pool_inputs: list[dict],
                    views: tuple[str, ...], label_sets: np.ndarray | None = None) -> OfflineWorkspace:
    """`views`: where cues are mined (and indexed up front; a pool member, an LLM's or an expert's, reading another
    view gets it indexed when its fired rows are asked for). `label_sets` (n_dev, k) 0/1 on a multi-label task: a
    cue's precision then counts every row whose set holds its class, as the gate does."""
    k = len(task.labels)
    if label_sets is not None:
        onehot = np.asarray(label_sets, dtype=np.int32).reshape(len(y), k)
    else:
        onehot = np.zeros((len(y), k), dtype=np.int32)
        onehot[np.arange(len(y)), y] = 1
    text_task = "between" not in views
    dev_raw = [str(ex.get("text") or "") for ex in dev_inputs]
    dev_surface = surface.measure_all(dev_raw) if text_task else {}
    return OfflineWorkspace(
        task=task, views=views, y=y, onehot=onehot, dev=ViewIndex(dev_inputs, views),
        pool=ViewIndex(pool_inputs, views, with_prefixes=False) if pool_inputs else None,
        dev_surface=dev_surface,
        class_prior=onehot.mean(axis=0) if len(y) else np.full(k, 1.0 / k), dev_raw=dev_raw,
        pool_raw=[str(ex.get("text") or "") for ex in pool_inputs],
    )
