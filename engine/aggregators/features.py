"""TF-IDF text features, a cheap alternative to sentence embeddings that dev cross-validation can pick."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer


def join_unit_rows(*blocks: np.ndarray) -> np.ndarray:
    """Dense views side by side, each row of each unit norm, scaled so the joined rows keep unit norm."""
    from sklearn.preprocessing import normalize

    scale = np.float32(np.sqrt(len(blocks)))
    units = [normalize(np.asarray(b, dtype=np.float32)) for b in blocks]
    # written into one float32 array (embeddings are float32): without a second 100K-row copy, half the bytes
    out = np.empty((units[0].shape[0], sum(u.shape[1] for u in units)), dtype=np.float32)
    start = 0
    for unit in units:
        np.divide(unit, scale, out=out[:, start:start + unit.shape[1]])
        start += unit.shape[1]
    return out


class TfidfFeatures:
    """Word n-grams (and optionally char n-grams) TF-IDF; rows are L2-normalised sparse vectors.

    Fit on the texts of every split you will predict on (dev + pool): TF-IDF uses no labels, so
    seeing unlabeled text is fine and keeps the vocabulary the same for fit and predict.
    """

    def __init__(self, word_ngrams: tuple[int, int] | None = (1, 2), char_ngrams: tuple[int, int] | None = None,
                 min_df: int = 2, max_features: int | None = 50_000, sublinear_tf: bool = True):
        if word_ngrams is None and char_ngrams is None:
            raise ValueError("TfidfFeatures needs word_ngrams, char_ngrams or both")
        self.word_ngrams = word_ngrams
        self.char_ngrams = char_ngrams
        self.min_df = min_df
        self.max_features = max_features
        self.sublinear_tf = sublinear_tf

    def _vectorizers(self) -> list[TfidfVectorizer]:
        out = []
        common = {"min_df": self.min_df, "max_features": self.max_features, "sublinear_tf": self.sublinear_tf,
                  "lowercase": True, "dtype": np.float64}
        if self.word_ngrams is not None:
            out.append(TfidfVectorizer(analyzer="word", ngram_range=self.word_ngrams, **common))
        if self.char_ngrams is not None:
            out.append(TfidfVectorizer(analyzer="char_wb", ngram_range=self.char_ngrams, **common))
        return out

    def fit_transform(self, texts: Sequence[str]) -> sparse.csr_matrix:
        texts = list(texts)
        self.vectorizers_ = self._vectorizers()
        blocks = []
        for vec in self.vectorizers_:
            try:
                blocks.append(vec.fit_transform(texts))
            except ValueError:  # vocabulary empty after min_df: retry keeping every term
                vec.set_params(min_df=1)
                blocks.append(vec.fit_transform(texts))
        return self._join(blocks)

    def fit(self, texts: Sequence[str]) -> TfidfFeatures:
        self.fit_transform(texts)
        return self

    def transform(self, texts: Sequence[str] | np.ndarray) -> sparse.csr_matrix:
        """Each distinct text is analysed once (a row's TF-IDF depends on its text alone): corpora repeat texts
        (retweets, template messages, ChemProt's sentences with several entity pairs)."""
        if not hasattr(self, "vectorizers_"):
            raise RuntimeError("TfidfFeatures is not fitted yet: call fit_transform(texts) first")
        position: dict[str, int] = {}
        rows = np.fromiter((position.setdefault(t, len(position)) for t in texts), dtype=np.int64)
        if not position:  # scikit-learn refuses zero rows
            return sparse.csr_matrix((0, sum(len(vec.vocabulary_) for vec in self.vectorizers_)))
        distinct = self._join([vec.transform(list(position)) for vec in self.vectorizers_])
        return distinct if len(position) == len(rows) else distinct[rows]

    @staticmethod
    def _join(blocks: list[sparse.spmatrix]) -> sparse.csr_matrix:
        """Stack word and char blocks, scaled so each row keeps unit norm."""
        if len(blocks) == 1:
            return sparse.csr_matrix(blocks[0])
        return sparse.hstack(blocks, format="csr") / np.sqrt(len(blocks))


# the relation TF-IDF (words marked by their place around an entity pair, `text_views.relation_context`) reads single
# words: bigrams of that text join words across places (bench/relation_view.py weighs both)
RELATION_NGRAMS = (1, 1)
EAGER_ROWS = 20_000  # up to this many rows TF-IDF is fitted on all of them and computed at once


class LazyTfidfRows:
    """TF-IDF rows of a large corpus, computed only for the rows asked for.

    Fitting reads dev and a sample of the unlabeled rows (a few thousand); only predicting every row with a model
    that reads TF-IDF needs all of them, and at 100K rows the analysis alone took about 9 s of `auto`'s 36 s. So
    `rows[idx]` transforms those rows, and `materialise()` (what `select_feature` calls when a model reads the
    whole matrix) transforms every row once and keeps it.
    """

    def __init__(self, features: TfidfFeatures, texts: Sequence[str] | np.ndarray):
        self.features = features
        self.texts = texts if isinstance(texts, np.ndarray) else np.asarray(list(texts), dtype=object)
        self.n_columns = sum(len(vec.vocabulary_) for vec in features.vectorizers_)
        self._all: sparse.csr_matrix | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.texts), self.n_columns)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, idx) -> sparse.csr_matrix:
        if self._all is not None:
            return self._all[idx]
        return self.features.transform(self.texts[idx])

    def subset(self, idx) -> LazyTfidfRows | sparse.csr_matrix:
        """The rows `idx`, still computed only when asked for (or taken from the matrix, once materialised)."""
        if self._all is not None:
            return self._all[idx]
        return LazyTfidfRows(self.features, self.texts[idx])

    def materialise(self) -> sparse.csr_matrix:
        if self._all is None:
            self._all = self.features.transform(self.texts)
        return self._all


def fitted_tfidf(texts: Sequence[str], seed: int = 0, word_ngrams: tuple[int, int] = (1, 2)) -> TfidfFeatures:
    """TF-IDF fitted on `texts`; when there are more than EAGER_ROWS, on their distinct texts, or a seeded sample of
    EAGER_ROWS of those (the vocabulary and IDF of 20K texts are those of 100K but for rare terms, at a fifth of the
    analysis; a text repeated across a large corpus counts once, as a template or a retweet should)."""
    texts = list(texts)
    if len(texts) <= EAGER_ROWS:
        return TfidfFeatures(word_ngrams).fit(texts)
    distinct = list(dict.fromkeys(texts))
    if len(distinct) <= EAGER_ROWS:
        return TfidfFeatures(word_ngrams).fit(distinct)
    sample = np.sort(np.random.default_rng(seed).choice(len(distinct), EAGER_ROWS, replace=False))
    return TfidfFeatures(word_ngrams).fit([distinct[i] for i in sample])


def tfidf_rows(texts: Sequence[str], seed: int = 0, fit_texts: Sequence[str] | None = None,
               word_ngrams: tuple[int, int] = (1, 2)) -> sparse.csr_matrix | LazyTfidfRows:
    """TF-IDF of `texts`, its vocabulary fitted on `fit_texts` (default: `texts`) as `fitted_tfidf` does: the
    matrix itself up to EAGER_ROWS rows, above that rows computed when asked for (`LazyTfidfRows`)."""
    texts = list(texts)
    if fit_texts is None and len(texts) <= EAGER_ROWS:
        return TfidfFeatures(word_ngrams).fit_transform(texts)
    features = fitted_tfidf(texts if fit_texts is None else fit_texts, seed, word_ngrams)
    return features.transform(texts) if len(texts) <= EAGER_ROWS else LazyTfidfRows(features, texts)
