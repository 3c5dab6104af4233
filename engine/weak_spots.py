"""Where the pool is weak: clusters of rows that no annotator votes on, or on which the votes disagree.

The unlabeled rows are grouped by their words (TF-IDF, k-means), and each group is described by what an expert
can act on: how many of its rows get no vote, how many get conflicting votes, the words that mark it, and the
rows the pool is least sure of. Pure numpy / scikit-learn over arrays the caller reads from the store.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.cluster import MiniBatchKMeans
from sklearn.feature_extraction.text import TfidfVectorizer

from engine.domain import ABSTAIN
from engine.metrics.score import disagreement

MAX_ROWS = 20_000  # a seeded sample above this: the picture is the same and the page stays fast
N_TERMS = 6
N_EXAMPLES = 8


@dataclass(frozen=True)
class WeakSpot:
    """One cluster of rows and how the pool does on it."""

    cluster: int
    size: int
    no_vote_share: float  # rows with no vote at all
    conflict_share: float  # rows whose votes name two or more classes
    mean_entropy: float  # bits, of the vote distribution, over rows with votes
    terms: tuple[str, ...]  # the words that mark the cluster
    example_rows: tuple[int, ...]  # indices into the caller's rows, weakest first
    top_label: int  # the class most voted in the cluster (ABSTAIN when nobody votes there)

    @property
    def weak_rows(self) -> int:
        """Rows lost to the pool here: no vote, or votes that disagree."""
        return int(round(self.size * (self.no_vote_share + self.conflict_share)))


def weak_spots(votes: np.ndarray, texts: list[str], n_classes: int, n_clusters: int = 12,
               seed: int = 0) -> tuple[list[WeakSpot], np.ndarray]:
    """Clusters ranked by weak rows (most first), and the sampled row indices they describe.

    votes: (n, m) int, ABSTAIN = -1; texts: n strings. Rows beyond MAX_ROWS are sampled (seeded).
    """
    n = len(texts)
    rows = np.arange(n)
    if n > MAX_ROWS:
        rows = np.sort(np.random.default_rng(seed).choice(n, MAX_ROWS, replace=False))
    if len(rows) < 2:
        return [], rows
    sample_texts = [texts[i] for i in rows]
    sample_votes = votes[rows] if votes.size else np.full((len(rows), 0), ABSTAIN)
    vectorizer = TfidfVectorizer(stop_words="english", min_df=2, max_features=20_000, sublinear_tf=True)
    try:
        tfidf = vectorizer.fit_transform(sample_texts)
    except ValueError:  # no word occurs twice: nothing to group by
        return [], rows
    k = max(1, min(n_clusters, len(rows) // 20 or 1))
    model = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3, batch_size=2048).fit(tfidf)
    vocabulary = np.array(vectorizer.get_feature_names_out())
    has_vote = (sample_votes != ABSTAIN).any(axis=1) if sample_votes.shape[1] else np.zeros(len(rows), bool)
    entropy = disagreement(sample_votes) if sample_votes.shape[1] else np.zeros(len(rows))
    spots = []
    for cluster in range(k):
        members = np.flatnonzero(model.labels_ == cluster)
        if not len(members):
            continue
        voted = has_vote[members]
        conflicting = entropy[members] > 0
        weakest = members[np.lexsort((-entropy[members], voted))]  # no vote first, then most disputed
        cluster_votes = sample_votes[members].ravel()
        cluster_votes = cluster_votes[cluster_votes != ABSTAIN]
        top = int(np.bincount(cluster_votes, minlength=n_classes).argmax()) if cluster_votes.size else ABSTAIN
        centre = model.cluster_centers_[cluster]
        spots.append(WeakSpot(
            cluster=cluster, size=int(len(members)), no_vote_share=float(1 - voted.mean()),
            conflict_share=float(conflicting.mean()),
            mean_entropy=float(entropy[members][voted].mean()) if voted.any() else 0.0,
            terms=tuple(vocabulary[np.argsort(-centre)[:N_TERMS]]),
            example_rows=tuple(int(rows[i]) for i in weakest[:N_EXAMPLES]), top_label=top))
    spots.sort(key=lambda s: (-s.weak_rows, s.cluster))
    return spots, rows
