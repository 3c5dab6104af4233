"""The rows worth an expert's label, best first, each with the reason it was picked.

A labeled row does three jobs here: it teaches the aggregator, it judges the annotators that fire on it, and it seeds
the next generation's cues. So the queue scores every unlabeled row on four signals, each in [0, 1]:
  uncertain   1 - the text model's top probability (a logistic regression on the sentence embeddings, fitted on dev)
  disputed    the pool's majority vote names another class than the text model
  thin        the row's likely class (the pool's vote, else the text's) has fewer than THIN_FITNESS_ROWS fitness rows
  unchecked   annotators fire on it that fired on fewer than UNCHECKED_FIRES dev rows (nobody has checked them)
and picks greedily by the weighted sum, skipping a row too like one already picked (cosine of the embeddings above
`SAME_CLUSTER`), so one cluster does not fill the queue (the batch-diversity idea of BatchBALD-style selection, in its
cheapest form). `uncertainty` ranks by the first signal alone and `random` draws seeded rows: the baselines the
simulated expert (bench/expert_loop.py) weighs the queue against.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.aggregators.evoagg import TextOnly
from engine.apply.votes import ensure_votes
from engine.domain import ABSTAIN, FITNESS, THIN_FITNESS_ROWS
from engine.expert.rows import label_rows
from engine.labeling.features import text_features
from engine.metrics.score import vote_counts
from engine.sandbox.executor import Executor
from engine.store.workspace import Store

STRATEGIES = ("queue", "uncertainty", "random")
WEIGHTS = {"uncertain": 1.0, "disputed": 0.5, "thin": 0.75, "unchecked": 0.25}
UNCHECKED_FIRES = 3  # an annotator with fewer dev fires than this has not been checked by anyone
SAME_CLUSTER = 0.9  # cosine above which a row is a near copy of one already picked
CANDIDATES_PER_PICK = 20  # how deep the greedy pass reads the ranking for each row it picks


@dataclass(frozen=True)
class Suggestion:
    """One row to label: its id, text, the reason it was picked and its score (higher first)."""

    id: str
    text: str
    why: str
    score: float

    def to_dict(self) -> dict:
        return {"id": self.id, "text": self.text, "why": self.why, "score": round(self.score, 4)}


@dataclass(frozen=True)
class _Signals:
    uncertain: np.ndarray  # (n,) each in [0, 1]
    disputed: np.ndarray
    thin: np.ndarray
    unchecked: np.ndarray
    text_class: np.ndarray  # (n,) the text model's class
    pool_class: np.ndarray  # (n,) the pool's majority class, ABSTAIN where nobody votes
    likely: np.ndarray  # (n,) the pool's class, else the text's
    confidence: np.ndarray  # (n,) the text model's top probability
    firing: np.ndarray  # (n,) unchecked annotators firing


def suggest_rows(store: Store, executor: Executor, n: int = 25, strategy: str = "queue", seed: int = 0,
                 exclude: set[str] | None = None) -> list[Suggestion]:
    """Up to `n` unlabeled rows to label, best first. `exclude`: ids not to suggest (skipped this session)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    task = store.load_task()
    if task.multi_label:
        raise ValueError("the queue ranks single-label rows; on a multi-label task label rows from the Labels screen")
    frame = store.examples_frame("pool")
    if exclude:
        frame = frame[~frame["id"].isin(exclude)].reset_index(drop=True)
    if frame.empty or n <= 0:
        return []
    if strategy == "random":
        rows = np.random.default_rng(seed).permutation(len(frame))[:n]
        return [Suggestion(frame["id"][i], frame["text"][i], "drawn at random", 0.0) for i in rows]
    k = len(task.labels)
    dev = store.examples_frame("dev")
    embed = np.asarray(text_features(store, frame, ("embedding",))["embedding"])
    signals = _signals(store, executor, frame, dev, embed, k, seed)
    if strategy == "uncertainty":
        order = np.argsort(-signals.uncertain, kind="stable")[:n]
        return [_suggestion(frame, i, signals, task.labels, float(signals.uncertain[i]), only="uncertain")
                for i in order]
    score = sum(WEIGHTS[name] * getattr(signals, name) for name in WEIGHTS)
    picked = _diverse(score, embed, n)
    return [_suggestion(frame, i, signals, task.labels, float(score[i])) for i in picked]


def _signals(store: Store, executor: Executor, frame, dev, embed: np.ndarray, k: int, seed: int) -> _Signals:
    y = dev["label"].to_numpy().astype(int)
    dev_embed = text_features(store, dev, ("embedding",))["embedding"]
    text = TextOnly(k, feature="embedding", Cs=(1.0,), seed=seed).fit(np.zeros((len(y), 0), dtype=int), y,
                                                                       {"embedding": dev_embed})
    proba = text.predict_proba(np.zeros((len(frame), 0), dtype=int), {"embedding": embed})
    text_class, confidence = proba.argmax(axis=1), proba.max(axis=1)
    pool = store.pool_ids()
    if pool:
        ensure_votes(store, executor, pool, "pool")
        votes = store.vote_matrix(pool, example_ids=list(frame["id"])).votes
    else:
        votes = np.zeros((len(frame), 0), dtype=int)
    counts = vote_counts(votes, k)
    voted = counts.sum(axis=1) > 0
    pool_class = np.where(voted, counts.argmax(axis=1), ABSTAIN)
    likely = np.where(voted, pool_class, text_class)
    class_rows = np.bincount(store.gold(FITNESS), minlength=k)[:k]
    scores = store.scores(pool)
    unchecked_ids = np.array([scores[a].fires < UNCHECKED_FIRES if a in scores else True for a in pool], dtype=bool)
    firing = ((votes != ABSTAIN) & unchecked_ids[None, :]).sum(axis=1) if pool else np.zeros(len(frame), dtype=int)
    return _Signals(uncertain=1.0 - confidence, disputed=(voted & (pool_class != text_class)).astype(float),
                    thin=(class_rows[likely] < THIN_FITNESS_ROWS).astype(float),
                    unchecked=np.minimum(firing, 2) / 2.0, text_class=text_class, pool_class=pool_class,
                    likely=likely, confidence=confidence, firing=firing)


def _diverse(score: np.ndarray, embed: np.ndarray, n: int) -> list[int]:
    """The best-scored rows, greedily, skipping any too like one already picked; the ranking's next rows fill in
    when the skips leave too few."""
    order = np.argsort(-score, kind="stable")[: max(n * CANDIDATES_PER_PICK, n)]
    unit = embed[order] / np.maximum(np.linalg.norm(embed[order], axis=1, keepdims=True), 1e-12)
    picked: list[int] = []  # positions in `order`
    for position in range(len(order)):
        if len(picked) == n:
            break
        if picked and float((unit[picked] @ unit[position]).max()) > SAME_CLUSTER:
            continue
        picked.append(position)
    taken = set(picked)
    rest = [position for position in range(len(order)) if position not in taken]
    return [int(order[position]) for position in picked + rest[: n - len(picked)]]


def _suggestion(frame, i: int, s: _Signals, labels: tuple[str, ...], score: float, only: str | None = None
                ) -> Suggestion:
    """The row with the reasons that picked it, strongest first, in words."""
    reasons = []
    if s.disputed[i] and only is None:
        reasons.append(f"the pool says {labels[s.pool_class[i]]}, the text says {labels[s.text_class[i]]}")
    if s.thin[i] and only is None:
        reasons.append(f"likely {labels[s.likely[i]]}, a class with too few dev rows to judge")
    if s.unchecked[i] and only is None:
        reasons.append(f"{int(s.firing[i])} annotator(s) fire here that nobody has checked on dev")
    if s.uncertain[i] > 0.5 or only == "uncertain" or not reasons:
        reasons.append(f"the text model is unsure: {s.confidence[i]:.2f} for {labels[s.text_class[i]]}")
    return Suggestion(str(frame["id"][i]), str(frame["text"][i]), "; ".join(reasons), score)


def read_teach_csv(path) -> dict[str, str]:
    """A CSV of `id,label` rows: {id: label}. Every fault names its line and why; nothing is returned on any."""
    import csv

    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise ValueError(f"{path}: empty; expected a header `id,label` and one row per labeled example")
    header = [cell.strip() for cell in rows[0]]
    if header != ["id", "label"]:
        raise ValueError(f"{path}, line 1: the header must be `id,label`, got {','.join(header)!r}")
    out: dict[str, str] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 2:
            raise ValueError(f"{path}, line {line}: {len(row)} fields where `id,label` has 2")
        example_id, label = row[0].strip(), row[1].strip()
        if not example_id or not label:
            raise ValueError(f"{path}, line {line}: an empty {'id' if not example_id else 'label'}")
        if out.get(example_id, label) != label:
            raise ValueError(f"{path}, line {line}: row {example_id} labeled twice ({out[example_id]!r} and {label!r})")
        out[example_id] = label
    if not out:
        raise ValueError(f"{path}: no labeled row under the header")
    return out


def teach(store: Store, executor: Executor, labeled: dict[str, str], by: str, note: str = "") -> dict[str, int]:
    """The expert's labels of unlabeled rows join dev's fitness rows, as the studio adds them (who and when
    recorded; the annotators vote on them and are rescored). All or nothing: an unknown id or label, or a row that
    is not unlabeled (already in dev, or in test), is an error and nothing is written. Returns rows added per class."""
    task = store.load_task()
    unknown_labels = sorted({label for label in labeled.values() if label not in task.labels})
    if unknown_labels:
        raise ValueError(f"label(s) {', '.join(map(repr, unknown_labels))} not in the label set {list(task.labels)}")
    found = store.examples_frame(ids=list(labeled))
    split_of = dict(zip(found["id"], found["split"], strict=True))
    missing = [example_id for example_id in labeled if example_id not in split_of]
    if missing:
        raise ValueError(f"no row with id {', '.join(map(repr, missing[:5]))}" + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else "") + " in this workspace")
    taken = [(example_id, split_of[example_id]) for example_id in labeled if split_of[example_id] != "pool"]
    if taken:
        raise ValueError("only unlabeled rows can be taught: " + ", ".join(
            f"{example_id!r} is in {split}" for example_id, split in taken[:5]) + (
            f" and {len(taken) - 5} more" if len(taken) > 5 else ""))
    moved = label_rows(store, executor, labeled, by, note)
    per_class = {label: 0 for label in task.labels}
    for example_id in moved:
        per_class[labeled[example_id]] += 1
    return {label: count for label, count in per_class.items() if count}
