"""Aggregators: one contract suite over every aggregator, then hand-computed and synthetic behaviour."""
from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from engine.aggregators.choice_names import reads_votes
from engine.aggregators.registry import (
    AGGREGATORS,
    AutoAggregator,
    DawidSkene,
    EvoAgg,
    MajorityVote,
    MultiLabelEvoAgg,
    TextOnly,
    TfidfFeatures,
    WeightedMajorityVote,
    aggregator_entry,
    expected_calibration_error,
    make_aggregator,
    predict_labels,
    reliability,
)
from engine.domain import ABSTAIN, Task
from engine.labeling.features import distinct_pairs, feature_kinds, relation_texts, text_features
from engine.metrics.score import accuracy, macro_f1
from engine.text_views import relation_context, view_text

K = 3


def synthetic(seed: int, n: int, m: int, accuracies=None, cover: float = 0.7, silent_rows: int = 3):
    """Labels, noisy votes (first `silent_rows` rows all-abstain) and a dict of text-like features."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    accuracies = accuracies if accuracies is not None else np.linspace(0.8, 0.5, m)
    wrong = (y[:, None] + rng.integers(1, K, (n, m))) % K
    votes = np.where(rng.random((n, m)) < accuracies, y[:, None], wrong)
    votes[rng.random((n, m)) > cover] = ABSTAIN
    votes[:silent_rows] = ABSTAIN
    embedding = np.eye(K)[y] @ rng.normal(size=(K, 5)) + rng.normal(0, 0.8, (n, 5))
    tfidf = sparse.csr_matrix(np.abs(embedding) * (rng.random((n, 5)) < 0.6))
    return y, votes, {"embedding": embedding, "tfidf": tfidf}


def _take(X, rows):
    return {name: mat[rows] for name, mat in X.items()}


Y_B, VOTES_B, X_B = synthetic(1, 75, 4)
FIT, TEST = np.arange(60), np.arange(60, 75)
TEST = np.r_[np.arange(3), TEST]  # include the all-abstain rows in the prediction rows too
Y_A, VOTES_A, X_A = synthetic(2, 40, 3)

CASES = {name: (lambda name=name: make_aggregator(name, K, seed=0)) for name in AGGREGATORS}
CASES["evoagg[votes]"] = lambda: EvoAgg(K, feature=None)
CASES["evoagg[tfidf]"] = lambda: EvoAgg(K, feature="tfidf")
CASES["ds[unlabeled]"] = lambda: DawidSkene(K)


def fit_b(name: str):
    y = None if name == "ds[unlabeled]" else Y_B[FIT]
    return CASES[name]().fit(VOTES_B[FIT], y, _take(X_B, FIT))


@cache
def fitted_b(name: str):
    return fit_b(name)


def predict_b(model) -> np.ndarray:
    return model.predict_proba(VOTES_B[TEST], _take(X_B, TEST))


@pytest.mark.parametrize("name", sorted(CASES))
class TestContract:
    def test_probabilities_have_shape_n_by_k_and_rows_sum_to_one(self, name):
        proba = predict_b(fitted_b(name))
        assert proba.shape == (TEST.size, K)
        assert np.all(np.isfinite(proba)) and np.all(proba >= 0)
        assert proba.sum(axis=1) == pytest.approx(np.ones(TEST.size))

    def test_all_abstain_rows_get_a_distribution(self, name):
        silent = np.full((4, VOTES_B.shape[1]), ABSTAIN)
        proba = fitted_b(name).predict_proba(silent, _take(X_B, np.arange(4)))
        assert proba.shape == (4, K) and proba.sum(axis=1) == pytest.approx(np.ones(4))

    def test_refit_forgets_the_previous_fit(self, name):
        model = CASES[name]()
        y_a = None if name == "ds[unlabeled]" else Y_A
        model.fit(VOTES_A, y_a, X_A)  # other rows, other annotator count
        model.fit(VOTES_B[FIT], None if y_a is None else Y_B[FIT], _take(X_B, FIT))
        np.testing.assert_allclose(predict_b(model), predict_b(fitted_b(name)), rtol=0, atol=1e-12)

    def test_deterministic(self, name):
        assert np.array_equal(predict_b(fit_b(name)), predict_b(fitted_b(name)))

    def test_scikit_learn_estimator_contract(self, name):
        model = fitted_b(name)
        params = model.get_params()
        assert params["n_classes"] == K
        learned = set(vars(model)) - set(params)
        assert learned and all(attr.endswith("_") for attr in learned), learned
        fresh = clone(model)
        assert not any(attr.endswith("_") for attr in vars(fresh))
        with pytest.raises(NotFittedError, match="not fitted"):
            fresh.predict_proba(VOTES_B[TEST], _take(X_B, TEST))
        with pytest.raises(ValueError, match="annotators"):
            model.predict_proba(VOTES_B[TEST, :2], _take(X_B, TEST))

    def test_bad_input_is_rejected_with_a_value_error(self, name):
        y = None if name == "ds[unlabeled]" else Y_B[FIT]
        with pytest.raises(ValueError, match="0 sample"):
            CASES[name]().fit(VOTES_B[:0], None if y is None else y[:0], _take(X_B, np.arange(0)))
        nan_votes = VOTES_B[FIT].astype(float)
        nan_votes[5, 1] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            CASES[name]().fit(nan_votes, y, _take(X_B, FIT))
        if y is not None:
            with pytest.raises(ValueError, match="y must lie in"):
                CASES[name]().fit(VOTES_B[FIT], np.where(np.arange(FIT.size) == 7, K, y), _take(X_B, FIT))


def test_majority_vote_probabilities_hand_computed():
    votes = np.array([[0, 0, 1], [ABSTAIN, ABSTAIN, ABSTAIN]])
    mv = MajorityVote(3, smoothing=0.1).fit(np.array([[0, 0, 0]] * 3), np.array([0, 0, 1]))
    proba = mv.predict_proba(votes)
    assert proba[0] == pytest.approx(np.array([2.1, 1.1, 0.1]) / 3.3)
    assert proba[1] == pytest.approx([3 / 6, 2 / 6, 1 / 6])  # Laplace-smoothed dev prior (2, 1, 0)


def test_weighted_majority_vote_weights_hand_computed():
    y = np.array([0, 1, 0, 1, 0, 1])
    votes = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [ABSTAIN, ABSTAIN], [ABSTAIN, ABSTAIN]])
    wmv = WeightedMajorityVote(2, smoothing=2.0).fit(votes, y)
    # a0: 4 fires, 4 correct; a1: 4 fires, 2 correct; pooled precision (6 + 1) / (8 + 2) = 0.7
    acc0, acc1 = (4 + 1.4) / 6, (2 + 1.4) / 6
    assert wmv.weights_ == pytest.approx([np.log(acc0 / (1 - acc0)), np.log(acc1 / (1 - acc1))])
    proba = wmv.predict_proba(np.array([[1, 0]]))[0]
    odds0, odds1 = acc0 / (1 - acc0), acc1 / (1 - acc1)
    assert proba[1] == pytest.approx(odds0 / (odds0 + odds1))


def test_dawid_skene_trusts_the_good_annotator_without_labels():
    rng = np.random.default_rng(7)
    n = 600
    y = rng.integers(0, K, n)
    columns = []
    for acc in (0.95, 0.5, 0.5, 0.5, 0.5):
        wrong = (y + rng.integers(1, K, n)) % K
        columns.append(np.where(rng.random(n) < acc, y, wrong))
    votes = np.column_stack(columns)
    ds = DawidSkene(K).fit(votes)  # unlabeled
    mv_acc = accuracy(y, MajorityVote(K).fit(votes).predict(votes))
    ds_acc = accuracy(y, ds.predict(votes))
    assert ds_acc >= 0.9 and ds_acc > mv_acc + 0.1
    diag = [np.diag(conf[:, :K]).mean() for conf in ds.confusion_]
    assert diag[0] > 0.85 and max(diag[1:]) < 0.7


def single_class_votes(n: int = 400, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(y, votes) of two classes and four annotators that each only ever vote one class (two per class): the
    information is in whether one fires (70 % of its class's rows, 10 % of the other's)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    votes = np.full((n, 4), ABSTAIN)
    for j, cls in enumerate((0, 0, 1, 1)):
        fires = rng.random(n) < np.where(y == cls, 0.7, 0.1)
        votes[fires, j] = cls
    return y, votes


def test_dawid_skene_reads_single_class_annotators_through_abstention():
    y, votes = single_class_votes()
    ds = DawidSkene(2).fit(votes)
    assert macro_f1(y, ds.predict(votes), 2) > 0.75


def test_dawid_skene_gives_no_row_to_a_class_nobody_votes_for():
    """The same single-class annotators, with a third class in the label set that none votes and no label holds:
    EM must not make it the class of "everyone abstains" (it took rows and the macro-F1 fell)."""
    _, votes = single_class_votes()
    two = DawidSkene(2).fit(votes).predict_proba(votes)
    three = DawidSkene(3).fit(votes)
    proba = three.predict_proba(votes)
    assert (proba[:, 2] == 0).all() and (proba.argmax(axis=1) == two.argmax(axis=1)).all()
    labeled = np.where(np.arange(400) < 5, 2, -1)  # a label of the third class makes it a class again
    assert DawidSkene(3).fit(votes, labeled).predict_proba(votes)[:, 2].max() > 0


def test_evoagg_out_of_fold_differs_from_in_sample():
    y, votes, X = synthetic(5, 90, 4)
    model = EvoAgg(K).fit(votes, y, X)
    before = model.predict_proba(votes, X)
    oof = model.oof_predict_proba(votes, y, X)
    assert oof.shape == before.shape and oof.sum(axis=1) == pytest.approx(np.ones(len(y)))
    assert not np.allclose(oof, before, atol=1e-3)
    assert accuracy(y, before.argmax(axis=1)) >= accuracy(y, oof.argmax(axis=1))
    np.testing.assert_array_equal(model.predict_proba(votes, X), before)  # the oof fits left self alone


def test_feature_convention_dict_or_bare_matrix():
    y, votes, X = synthetic(6, 60, 3)
    by_dict = EvoAgg(K, feature="embedding").fit(votes, y, X).predict_proba(votes, X)
    bare = EvoAgg(K).fit(votes, y, X["embedding"]).predict_proba(votes, X["embedding"])
    np.testing.assert_allclose(by_dict, bare)
    with pytest.raises(KeyError, match="no feature 'bert'"):
        EvoAgg(K, feature="bert").fit(votes, y, X)
    with pytest.raises(ValueError, match="pass X"):
        EvoAgg(K).fit(votes, y, X).predict_proba(votes)
    with pytest.raises(ValueError, match="no input"):
        TextOnly(K).fit(votes, y)
    # votes only: X is ignored
    votes_only = EvoAgg(K, feature=None).fit(votes, y, X)
    np.testing.assert_array_equal(votes_only.predict_proba(votes), votes_only.predict_proba(votes, X))


def test_registry():
    assert AGGREGATORS == ("mv", "wmv", "ds", "evoagg", "embedding", "auto", "auto-text", "auto-pool")
    # the choosers that read the votes are MultiLabelEvoAgg on a multi-label task ("auto:evoagg")
    assert {n for n in AGGREGATORS if aggregator_entry(n).evoagg_on_multi_label} == {"auto", "auto-pool"}
    assert isinstance(make_aggregator("ds", 4), DawidSkene) and make_aggregator("auto", 4, seed=3).seed == 3
    with pytest.raises(ValueError, match="unknown aggregator 'vote'"):
        make_aggregator("vote", 2)
    with pytest.raises(ValueError, match="y is required"):
        make_aggregator("evoagg", 2).fit(np.zeros((3, 1), dtype=int), None)


@pytest.mark.parametrize("name", AGGREGATORS)
def test_registry_entry_says_what_the_aggregator_reads(name):
    """needs_labels, reads_votes and reads_text are true of the aggregator they describe."""
    entry = aggregator_entry(name)
    votes, y, features = VOTES_B, Y_B, X_B
    if entry.needs_labels:
        with pytest.raises(ValueError, match="y is required|needs dev labels"):
            entry.make(K).fit(votes, None, features)
    else:
        entry.make(K).fit(votes, None, features)  # fits without labels
    model = entry.make(K).fit(votes, y, features)
    if isinstance(model, AutoAggregator) and not model.text_only:  # it reads what its chosen ingredient reads
        text, pool = model._models(features)
        assert text and pool and entry.reads_votes and entry.reads_text
        return
    proba = model.predict_proba(votes, features)
    shuffled = np.random.default_rng(0).permutation(votes, axis=0)
    assert np.allclose(model.predict_proba(shuffled, features), proba) != entry.reads_votes
    if entry.reads_text:
        other = {name: np.random.default_rng(1).permutation(matrix.toarray() if sparse.issparse(matrix) else matrix,
                                                            axis=0) for name, matrix in features.items()}
        assert not np.allclose(model.predict_proba(votes, other), proba)
    else:
        assert np.allclose(model.predict_proba(votes, None), proba)


def test_multi_label_evoagg_and_thresholds():
    rng = np.random.default_rng(4)
    n = 120
    Y = (rng.random((n, K)) < 0.4).astype(int)
    votes = np.where(rng.random((n, K)) < 0.8, np.where(Y == 1, np.arange(K), ABSTAIN), ABSTAIN)
    X = Y + rng.normal(0, 0.3, (n, K))
    model = MultiLabelEvoAgg(K).fit(votes, Y, X)
    proba = model.predict_proba(votes, X)
    assert proba.shape == (n, K) and np.all((proba >= 0) & (proba <= 1))
    assert (predict_labels(proba) == Y).mean() > 0.9
    assert predict_labels(np.array([[0.5, 0.49, 0.9]]), threshold=0.5).tolist() == [[1, 0, 1]]


def test_reliability_and_ece_hand_computed():
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.45, 0.55]])
    y = np.array([0, 0, 0, 1])  # right, wrong, right, right
    table = reliability(y, proba, n_bins=5)
    assert table["count"].tolist() == [0, 0, 2, 1, 1]
    assert table.loc[2, "confidence"] == pytest.approx(0.575) and table.loc[2, "accuracy"] == 1.0
    assert table.loc[3, "accuracy"] == 0.0 and table.loc[4, "confidence"] == pytest.approx(0.9)
    assert np.isnan(table.loc[0, "accuracy"])
    assert expected_calibration_error(y, proba, n_bins=5) == pytest.approx((2 * 0.425 + 0.8 + 0.1) / 4)


def test_tfidf_features():
    texts = ["free prize call now", "call me later", "win a free prize", "see you later", "free call"]
    words = TfidfFeatures(min_df=1)
    T = words.fit_transform(texts)
    assert T.shape[0] == 5 and sparse.issparse(T)
    assert np.asarray(sparse.linalg.norm(T, axis=1)) == pytest.approx(np.ones(5))
    assert words.transform(["free prize"]).shape[1] == T.shape[1]
    both = TfidfFeatures(min_df=1, char_ngrams=(2, 4)).fit_transform(texts)
    assert both.shape[1] > T.shape[1]
    assert np.asarray(sparse.linalg.norm(both, axis=1)) == pytest.approx(np.ones(5))


def test_large_corpora_compute_tfidf_rows_only_when_asked(monkeypatch):
    """Above EAGER_ROWS the vocabulary comes from a seeded sample and rows are computed on demand; a model
    reading the whole matrix gets it through select_feature, once. Up to it, the matrix is the eager one."""
    import engine.aggregators.features as features
    from engine.aggregators.base import select_feature, take_rows

    rng = np.random.default_rng(0)
    words = np.array(["free", "prize", "call", "now", "later", "win", "see", "you", "me", "cash"])
    texts = [" ".join(rng.choice(words, 5)) for _ in range(60)]
    eager = features.tfidf_rows(texts)
    assert sparse.issparse(eager)
    assert (eager != TfidfFeatures().fit_transform(texts)).nnz == 0

    monkeypatch.setattr(features, "EAGER_ROWS", 40)
    lazy = features.tfidf_rows(texts)
    assert isinstance(lazy, features.LazyTfidfRows) and lazy.shape[0] == 60
    rows = np.array([3, 50, 7])
    part = take_rows({"tfidf": lazy}, rows)["tfidf"]
    assert sparse.issparse(part) and part.shape == (3, lazy.shape[1])
    assert lazy._all is None  # asking for three rows computed three rows
    whole = select_feature({"tfidf": lazy}, "tfidf", 60)
    assert sparse.issparse(whole) and whole.shape == lazy.shape
    assert select_feature({"tfidf": lazy}, "tfidf", 60) is whole
    np.testing.assert_allclose(whole[rows].toarray(), part.toarray())
    assert np.asarray(sparse.linalg.norm(whole, axis=1)) == pytest.approx(np.ones(60))
    # a large corpus of repeats (a template sent 30 times) is fitted on its distinct texts: the repeats count once
    # toward a term's document frequency, so "cash", in two distinct texts, keeps the IDF it has among those
    repeated = ["win cash now"] * 30 + ["see you later", "cash me later"] * 10 + texts[:5]
    distinct = list(dict.fromkeys(repeated))
    fitted = features.fitted_tfidf(repeated)
    assert fitted.vectorizers_[0].idf_.tolist() == TfidfFeatures().fit(distinct).vectorizers_[0].idf_.tolist()
    assert fitted.vectorizers_[0].idf_.tolist() != TfidfFeatures().fit(repeated).vectorizers_[0].idf_.tolist()
    # more distinct texts than EAGER_ROWS: a seeded sample of EAGER_ROWS of them
    seen: list[list[str]] = []
    monkeypatch.setattr(features.TfidfFeatures, "fit", lambda self, texts: seen.append(list(texts)) or self)
    features.fitted_tfidf(texts * 2)
    assert len(seen[-1]) == 40 and len(set(seen[-1])) == 40 and set(seen[-1]) <= set(texts)


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_predicting_in_chunks_gives_every_row_the_same_probabilities(monkeypatch, name):
    """`predict_rows` cuts large corpora into chunks (and large TF-IDF into per-chunk lazy rows): every
    aggregator must label each row as it does in one piece, and a chunk computes only the TF-IDF it reads."""
    import engine.aggregators.features as features
    from engine.labeling.fit import predict_rows

    rng = np.random.default_rng(3)
    words = np.array(["free", "prize", "call", "now", "later", "win", "see", "you", "me", "cash", "ok", "go"])
    texts = [" ".join(rng.choice(words, 6)) for _ in range(75)]
    monkeypatch.setattr(features, "EAGER_ROWS", 40)
    X = {"embedding": X_B["embedding"], "tfidf": features.tfidf_rows(texts)}
    model = make_aggregator(name, K, seed=0)
    if aggregator_entry(name).fits_unlabeled:
        model.fit(VOTES_B, None, X)
    else:
        model.fit(VOTES_B[FIT], Y_B[FIT], {n: m[FIT] for n, m in X.items()})
    chunked = predict_rows(model, VOTES_B, X, chunk=20)
    assert X["tfidf"]._all is None  # per-chunk rows only: the whole matrix was never built
    whole = model.predict_proba(VOTES_B, {"embedding": X["embedding"], "tfidf": X["tfidf"].materialise()})
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-12)


def test_relation_tasks_add_a_view_of_the_words_around_the_mentions_for_auto():
    relation = Task(name="r", labels=("a", "b"), fields=("entity1", "entity2", "span1", "span2"))
    plain = Task(name="p", labels=("a", "b"))
    assert feature_kinds(relation, "auto") == ("embedding", "tfidf", "relation", "masked")
    assert feature_kinds(plain, "auto") == ("embedding", "tfidf")
    assert feature_kinds(relation, "evoagg") == ("embedding",) and feature_kinds(relation, "mv") == ()
    texts = ["aspirin strongly inhibits COX in cells", "caffeine binds to the receptor", "X inhibits Y"]
    mentions = [("aspirin", "COX"), ("caffeine", "receptor"), ("X", "Y")]

    def span(text: str, mention: str) -> list[int]:
        return [text.index(mention), text.index(mention) + len(mention)]

    spans = [(span(t, a), span(t, b)) for t, (a, b) in zip(texts, mentions, strict=True)]
    frame = pd.DataFrame({"text": texts, "fields": [{"span1": a, "span2": b} for a, b in spans]})
    features = text_features(None, frame, ("relation",))  # TF-IDF only: no store needed
    assert features["relation"].shape[0] == 3
    # the words between and around the mentions, by place: the mentions themselves never enter
    between = [view_text({**f, "text": t}, "between") for f, t in zip(frame["fields"], texts, strict=True)]
    assert between == ["strongly inhibits", "binds to the", "inhibits"]
    # min_df 2 keeps what two rows share: the order token (all three), "inhibits" between the mentions (rows 0 and 2)
    # and, for those two near ones, "inhibits" under the order; "cells" after the pair in row 0 alone goes
    context = [relation_context({**f, "text": t}) for f, t in zip(frame["fields"], texts, strict=True)]
    assert "r_in" in context[0].split() and "aspirin" not in " ".join(context) and "cox" not in " ".join(context)
    assert features["relation"].shape[1] == 4  # order_xy, b_inhibits, n_inhibits, xy_n_inhibits
    dense = features["relation"].toarray()
    assert dense[0] @ dense[2] > dense[0] @ dense[1] > 0
    # worked out once per distinct (text, spans): a repeated row gets its own spans' text, not its twin's
    twins = pd.DataFrame({"text": [texts[0]] * 3, "fields": [frame["fields"][0], {"span1": spans[0][1],
                                                                                  "span2": spans[0][0]},
                                                             frame["fields"][0]]})
    assert relation_texts(twins) == [context[0], context[0].replace("order_xy", "order_yx").replace("xy_n_", "yx_n_"),
                                     context[0]]
    first, inverse = distinct_pairs(twins)  # the twins' first row is worked out once, for itself and the third
    assert first == [0, 1] and inverse.tolist() == [0, 1, 0]


def test_relation_context_marks_each_word_by_its_place_and_the_mention_order():
    text = "we found that aspirin strongly inhibits COX in these cells today"
    first, second = [text.index("aspirin"), text.index("aspirin") + 7], [text.index("COX"), text.index("COX") + 3]
    forward = relation_context({"text": text, "span1": first, "span2": second})
    assert forward.split() == ["order_xy", "b_strongly", "b_inhibits", "l_we", "l_found", "l_that", "r_in", "r_these",
                               "r_cells", "n_strongly", "n_inhibits", "xy_n_strongly", "xy_n_inhibits"]
    # the same sentence with the arguments the other way round: the same places, another order
    backward = relation_context({"text": text, "span1": second, "span2": first}).split()
    assert backward[0] == "order_yx" and backward[-2:] == ["yx_n_strongly", "yx_n_inhibits"]
    assert backward[1:-2] == forward.split()[1:-2]
    # past NEAR words between the mentions nothing is near
    far = "aspirin " + "a b c d e f " + "inhibits COX"
    spans = {"span1": [0, 7], "span2": [far.index("COX"), len(far)]}
    assert not [w for w in relation_context({"text": far, **spans}).split() if "n_" in w]
    # spans a view could not cut the text by give nothing at all, not a lone order token
    for broken in ({"span1": None}, {"span1": [str(first[0]), str(first[1])]}, {"span1": [float(first[0]), first[1]]},
                   {"span1": first[:1]}, {"span1": [None, first[1]]}, {"text": None}, {"text": ""}):
        assert relation_context({"text": text, "span1": first, "span2": second, **broken}) == "", broken
    # spans that start together are ordered by where they end, as the masked views order them
    together = {"text": text, "span1": [first[0], first[1] + 9], "span2": first}
    assert relation_context(together).split()[0] == "order_yx"


def test_masked_views_replace_the_mentions_by_their_argument_roles():
    from engine.text_views import masked_views

    text = "aspirin strongly inhibits COX in cells"
    aspirin, cox = [0, 7], [26, 29]
    assert masked_views({"text": text, "span1": aspirin, "span2": cox}) == (
        "X strongly inhibits Y in cells", "X strongly inhibits Y")
    # span1 is X wherever it stands: the direction of the relation survives the masking
    assert masked_views({"text": text, "span1": cox, "span2": aspirin}) == (
        "Y strongly inhibits X in cells", "Y strongly inhibits X")
    for broken in ({"text": text}, {"text": text, "span1": [0, 70], "span2": cox},
                   {"text": text, "span1": "x", "span2": cox}, {"text": text, "span1": [20, 30], "span2": [25, 28]}):
        assert masked_views(broken) == (text, text)


def test_masked_feature_embeds_what_the_relation_says_not_who_it_is_about(tmp_path):
    """Two sentences that differ only in the names of their entities get the same "masked" vector (real MiniLM,
    cached in a real workspace); a different relation gets another."""
    from engine.store.workspace import Store

    texts = ["aspirin inhibits COX in cells", "ibuprofen inhibits PTGS2 in cells", "aspirin activates COX in cells"]
    mentions = [("aspirin", "COX"), ("ibuprofen", "PTGS2"), ("aspirin", "COX")]
    fields = [{"span1": [t.index(a), t.index(a) + len(a)], "span2": [t.index(b), t.index(b) + len(b)]}
              for t, (a, b) in zip(texts, mentions, strict=True)]
    frame = pd.DataFrame({"text": texts, "fields": fields})
    masked = text_features(Store.open(tmp_path / "ws"), frame, ("masked",))["masked"]
    assert masked.shape == (3, 768)
    assert np.linalg.norm(masked, axis=1) == pytest.approx(np.ones(3), abs=1e-5)
    np.testing.assert_allclose(masked[0], masked[1], atol=1e-6)
    assert masked[0] @ masked[2] < 0.99
    # joined once per distinct (text, spans) and spread to its rows: a repeat gets its twin's vector, the same
    # sentence with the mentions swapped its own
    swapped = {"span1": fields[0]["span2"], "span2": fields[0]["span1"]}
    repeats = pd.DataFrame({"text": [texts[0], texts[2], texts[0], texts[0]],
                            "fields": [fields[0], fields[2], fields[0], swapped]})
    again = text_features(Store.open(tmp_path / "ws"), repeats, ("masked",))["masked"]
    np.testing.assert_allclose(again[[0, 1, 2]], masked[[0, 2, 0]], atol=1e-6)
    assert again[3] @ again[0] < 0.999


def _proba(pred: np.ndarray, k: int = 2) -> np.ndarray:
    out = np.full((len(pred), k), 0.1)
    out[np.arange(len(pred)), pred] = 0.9
    return out


def test_auto_fits_in_worker_processes_give_the_same_choice_and_probabilities():
    """Above PARALLEL_MIN_CELLS the candidates' out-of-fold fits and the students' folds run on loky workers;
    the result must not depend on how many ran at once (read back in the order the fits were listed)."""
    from engine.aggregators.parallel import PARALLEL_MIN_CELLS

    y, votes, X = synthetic(4, PARALLEL_MIN_CELLS // K + 20, 5, cover=0.6)
    unlabeled = synthetic(5, 600, 5, cover=0.6)
    extra = {"unlabeled_votes": unlabeled[1], "unlabeled_X": unlabeled[2]}
    serial = AutoAggregator(K, seed=0, n_jobs=1).fit(votes, y, X, **extra)
    parallel = AutoAggregator(K, seed=0, n_jobs=2).fit(votes, y, X, **extra)
    assert any(name.startswith("student<") for name in serial.oof_scores_)
    assert parallel.chosen_ == serial.chosen_
    assert parallel.oof_scores_ == serial.oof_scores_
    np.testing.assert_array_equal(parallel.oof_proba_, serial.oof_proba_)
    np.testing.assert_array_equal(parallel.predict_proba(votes, X), serial.predict_proba(votes, X))


def test_auto_choice_is_told_in_words_the_expert_can_check():
    from engine.aggregators.choice_names import describe_choice

    said = describe_choice("student<avg(evoagg[masked],tfidf-only)>[masked+relation]")
    assert said.startswith("a student") and "(reading masked+relation)" in said
    assert "EvoAgg: the pool's votes with MiniLM embeddings of the sentence with the two entities replaced" in said
    assert "TF-IDF of the text's words and word pairs alone (no votes)" in said
    assert describe_choice("evoagg[votes]") == "EvoAgg over the pool's votes alone"
    assert describe_choice("mv") == "majority vote of the pool"
    assert describe_choice("something-new") == "something-new"  # an unknown name is shown as it is


@pytest.mark.parametrize("feature", [None, "embedding", "tfidf"])
def test_oof_path_lands_where_fresh_fits_do(feature):
    """auto scores each C along a warm-started path: the L2 problem has one optimum, so each C's out-of-fold
    probabilities must match fitting that C from scratch (to the optimizer's tolerance), in the order asked."""
    from engine.aggregators.base import make_folds, oof_proba

    y, votes, X = synthetic(7, 240, 5)
    folds = make_folds(y, 5, 0)
    Cs = (1.0, 0.1, 10.0)  # any order: the path climbs C, the answer follows the order asked
    path = EvoAgg(K, feature=feature, Cs=(Cs[0],)).oof_path(votes, y, X, folds, Cs)
    for C, proba in zip(Cs, path, strict=True):
        fresh = oof_proba(lambda C=C: EvoAgg(K, feature=feature, Cs=(C,)), votes, y, X, folds)
        # lbfgs stops at a gradient of 1e-4, not at the optimum: near it, and flatter the weaker the penalty
        np.testing.assert_allclose(proba, fresh, atol=0.02)
        assert (proba.argmax(axis=1) == fresh.argmax(axis=1)).mean() >= 0.98


def test_evoagg_vote_weight_scales_only_the_vote_block_beside_text():
    y, votes, X = synthetic(8, 60, 3)
    for weight in (1.0, 0.25):
        model = EvoAgg(K, vote_weight=weight)
        design = model._design(votes, X["embedding"])
        vote_block = sparse.csr_matrix(design)[:, X["embedding"].shape[1]:]
        assert set(np.unique(vote_block.data)) == {weight}
        # votes alone: C alone sets their scale, so the weight does not apply
        assert set(np.unique(model._design(votes, None).data)) == {1.0}


def test_a_lighter_vote_block_trusts_votes_chosen_on_dev_less():
    """Votes right on every dev row (where the pool was chosen) and right on 45 % of new rows; the text is
    a noisy but honest signal. At weight 1 EvoAgg follows the votes on new rows; at 0.25 the text keeps a say."""
    rng = np.random.default_rng(3)
    n_dev, n_new = 150, 2000
    y = rng.integers(0, K, n_dev + n_new)
    centers = rng.normal(size=(K, 16)) * 1.2
    X = centers[y] + rng.normal(size=(len(y), 16))
    votes = np.full((len(y), 4), ABSTAIN)
    for j in range(4):
        fires = rng.random(len(y)) < 0.6
        right = np.concatenate([np.ones(n_dev, bool), rng.random(n_new) < 0.45])
        votes[fires, j] = np.where(right, y, (y + rng.integers(1, K, len(y))) % K)[fires]
    dev, new = slice(0, n_dev), slice(n_dev, None)
    scores = {w: macro_f1(y[new], EvoAgg(K, vote_weight=w).fit(votes[dev], y[dev], X[dev])
                          .predict(votes[new], X[new]), K) for w in (1.0, 0.25)}
    assert scores[0.25] > scores[1.0] + 0.03, scores


def test_tfidf_transform_analyses_each_distinct_text_once_and_gives_every_row_its_own():
    texts = ["refund my card", "goal for the team", "refund my card", "the card fee", "goal for the team"]
    features = TfidfFeatures(word_ngrams=(1, 2), char_ngrams=(2, 3), min_df=1).fit(texts)
    together = features.transform(texts)
    one_by_one = sparse.vstack([features.transform([t]) for t in texts], format="csr")
    assert together.shape == one_by_one.shape == (5, features.transform(texts[:1]).shape[1])
    assert abs(together - one_by_one).max() == 0
    np.testing.assert_array_equal(together[0].toarray(), together[2].toarray())
    assert features.transform([]).shape[0] == 0


def test_auto_on_an_empty_pool_chooses_from_the_text_and_evoagg_of_silent_votes_answers_the_prior():
    # right after import, or once the expert rejected every member: `evopool eval` and `export` default to auto
    rng = np.random.default_rng(0)
    n = 60
    y = rng.integers(0, 2, n)
    X = {"embedding": rng.normal(size=(n, 8)) + 2 * y[:, None]}
    auto = AutoAggregator(2, seed=0).fit(np.zeros((n, 0), dtype=int), y, X, audit=np.arange(n) < 25)
    assert not reads_votes(auto.chosen_) and not auto.uses_votes_
    assert auto.predict_proba(np.zeros((n, 0), dtype=int), X).argmax(axis=1).tolist() != [0] * n
    silent = np.full((n, 1), -1)
    silent[0, 0] = 1  # fires on one row only: a fold's training rows may hold no vote at all
    proba = EvoAgg(2, feature=None).fit(silent[1:], y[1:]).predict_proba(silent)
    assert np.allclose(proba, proba[0]) and proba[0].sum() == pytest.approx(1.0)


