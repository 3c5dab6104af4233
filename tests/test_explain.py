"""The gate's verdicts in plain words: each check's reason turns into a sentence with the gate's own numbers,
and an annotator no better than chance is flagged. Verdicts come from the real gate on a small dev split."""
from __future__ import annotations

import numpy as np

from engine.domain import ABSTAIN, Annotator
from engine.expert.explain import explain
from engine.gate import GateConfig, run_gate
from engine.metrics.score import chance_precision, score_annotator

# 30 dev rows: 20 of class 0 ("ham"), 10 of class 1 ("spam")
Y = np.array([0] * 20 + [1] * 10)
LABELS = ("ham", "spam")
RAW = GateConfig(precision_z=0)


def column(spam_rows: list[int]) -> np.ndarray:
    out = np.full(Y.shape[0], ABSTAIN)
    out[spam_rows] = 1
    return out


def judge(candidates: dict[str, np.ndarray], config: GateConfig = RAW) -> dict:
    """{id: (decision, Explanation)} from the real gate over an empty pool."""
    entries = [(Annotator(id=i, name=i, source="", agent="generator", generation=1), v, score_annotator(i, v, Y))
               for i, v in candidates.items()]
    outcome = run_gate([], np.zeros((30, 0), dtype=int), {}, entries, Y, 2, config)
    out = {}
    for d in outcome.decisions:
        v = candidates[d.annotator_id]
        s = score_annotator(d.annotator_id, v, Y)
        out[d.annotator_id] = (d, explain(d.verdict, d.reasons, s, LABELS[s.label], 30, chance_precision(v, Y, 2),
                                          names={"good": "spam words"}))
    return out


def test_an_annotator_at_the_class_share_is_rejected_and_called_no_better_than_chance():
    # votes spam on 6 rows, 2 of them spam: precision 0.33, spam is 33% of dev; a length rule looks like this
    judged = judge({"length": column([0, 1, 2, 3, 20, 21])})
    decision, words = judged["length"]
    assert decision.verdict == "reject"
    assert words.at_chance and abs(words.chance - 1 / 3) < 1e-9
    text = words.text()
    assert "no better than chance" in text and "33% of dev is spam" in text
    assert "right on 2 of them (precision 0.33)" in text


def test_accept_says_how_far_above_chance_and_the_gates_diversity_and_contribution_numbers():
    judged = judge({"good": column([20, 21, 22, 23, 24, 25, 0])})  # 6 of 7 right
    decision, words = judged["good"]
    assert decision.verdict == "accept" and not words.at_chance
    text = words.text()
    assert "2.6x better than chance" in text  # 0.857 / 0.333
    assert text.count("Accepted") == 1 and "dev macro-F1" in text


def test_each_rejecting_check_is_named_with_its_numbers():
    judged = judge({"good": column([20, 21, 22, 23, 24, 25, 26]),
                    "copy": column([20, 21, 22, 23, 24, 25, 26]),  # the same rows as good
                    "rare": column([20, 21, 22])})
    _, copy_words = judged["copy"]
    assert judged["copy"][0].verdict == "reject"
    assert "nearly the same rows as spam words (overlap 100%)" in copy_words.text()
    assert "fires on only 3 dev rows; the gate needs 5" in judged["rare"][1].text()


def test_an_experts_verdict_is_said_to_be_the_experts():
    words = explain("reject", ("too noisy",), None, "spam", 30, 0.3, decided_by="human")
    assert words.lines == ("You (the expert) rejected it: the gate will not let it back.",)


def test_a_small_class_rejection_says_the_gate_asks_as_many_fires_as_the_class_has_rows():
    y = np.array([0] * 27 + [1] * 3)  # spam: 3 dev rows
    votes = np.full(30, ABSTAIN)
    votes[[27, 28]] = 1
    entry = (Annotator(id="tiny", name="tiny", source="", agent="generator", generation=1), votes,
             score_annotator("tiny", votes, y))
    decision = run_gate([], np.zeros((30, 0), dtype=int), {}, [entry], y, 2, RAW).decisions[0]
    words = explain(decision.verdict, decision.reasons, entry[2], "spam", 30, chance_precision(votes, y, 2))
    assert "fires on only 2 dev rows; the gate needs 3 (its class has only 3 dev rows: label more" in words.text()


def test_a_precision_weighed_with_the_unlabeled_samples_guesses_is_explained_with_both():
    """The gate's usual precision verdict pools dev's fires with a text classifier's agreement on the unlabeled
    sample; its wording had matched neither of explain's patterns, so the expert read the raw reason, or nothing
    of it beside another failure."""
    entries = [(Annotator(id="c", name="c", source="", agent="generator", generation=1), column([20, 21, 22, 0]),
                score_annotator("c", column([20, 21, 22, 0]), Y))]
    decision = run_gate([], np.zeros((30, 0), dtype=int), {}, entries, Y, 2, GateConfig(),
                        pool_evidence={"c": (0.05, 100)}).decisions[0]
    assert decision.verdict == "reject" and any("unlabeled sample" in r for r in decision.reasons)
    text = explain(decision.verdict, decision.reasons, entries[0][2], "spam", 30, 1 / 3, names={}).text()
    assert "right on 0.75 of its 4 dev fires" in text and "agrees with about 0.05 of its votes" in text
    assert "under the 0.30 a generator must reach" in text
    assert "fires on only 4 dev rows" in text  # the other failure stays


def test_an_accepted_verdict_names_the_bar_it_cleared_not_precise_enough():
    """"Accepted: precise enough" read wrong for an annotator right on 16 of 46 rows (a browser walk): the words
    give the bound and the bar, with the role's article."""
    from engine.expert.explain import why_the_verdict

    reasons = ["viable: precision 0.35, lower bound 0.31 over 46 fires: 0.31 >= 0.25 (improver), fires 46 >= 5",
               "marginal: pool dev macro-F1 0.600 without it, 0.620 with it"]
    (line,) = why_the_verdict("accept", reasons, "gate", {})
    assert line.startswith("Accepted: allowing for luck, its precision is at least 0.31, over the 0.25 an improver "
                           "must reach; the pool's dev macro-F1 is 0.620 with it")
    assert "precise enough" not in line
    (raw,) = why_the_verdict("accept", ["viable: precision 0.80 >= 0.30 (generator), fires 9 >= 5"], "gate", {})
    assert raw == "Accepted: its precision is at least 0.80, over the 0.30 a generator must reach."


def test_a_rejection_at_chance_on_the_bound_and_a_version_retired_for_its_edit_read_right():
    from engine.domain import REPLACED_BY
    from engine.expert.explain import why_the_verdict

    (line,) = why_the_verdict("reject", ["no better than chance: precision lower bound 0.52 <= 0.53, the share of dev "
                                         "its classes hold"], "gate", {})
    assert line == ("Rejected: allowing for luck, its precision may be as low as 0.52, no better than chance (0.53, "
                    "the share of dev its classes hold).")
    # retired by an edit: nobody rejected it (it read "You (the expert) rejected it: the gate will not let it back.")
    (line,) = why_the_verdict("reject", [], "human", {"e1": "SPAM: wider"}, f"{REPLACED_BY}e1")
    assert line.startswith("Retired when its edited version SPAM: wider took its place (nobody rejected it)")
