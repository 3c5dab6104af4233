"""Each gate rule on its own, on a 20-row dev split: rows 0-9 are class 0, rows 10-19 class 1."""
from __future__ import annotations

import re

import numpy as np
import pytest

from engine.domain import ABSTAIN, Annotator
from engine.gate import GateConfig, GateOutcome, run_gate
from engine.metrics.score import score_annotator

Y = np.array([0] * 10 + [1] * 10)
K = 2


def votes(**spans: list[int]) -> np.ndarray:
    """A dev vote column: votes(c0=[rows voting 0], c1=[rows voting 1]); other rows abstain."""
    out = np.full(Y.shape[0], ABSTAIN)
    for name, rows in spans.items():
        out[list(rows)] = int(name[1:])
    return out


def cand(cid: str, v: np.ndarray, agent: str = "generator", faults: int = 0):
    annotator = Annotator(id=cid, name=cid, source="", agent=agent, generation=1)
    return annotator, v, score_annotator(cid, v, Y, faults=faults)


def gate(pool: dict[str, np.ndarray], candidates, **kwargs) -> GateOutcome:
    ids = list(pool)
    matrix = np.column_stack([pool[i] for i in ids]) if ids else np.zeros((Y.shape[0], 0), dtype=int)
    scores = {i: score_annotator(i, pool[i], Y) for i in ids}
    return run_gate(ids, matrix, scores, candidates, Y, K, **kwargs)


def decision(outcome: GateOutcome, cid: str, verdict: str | None = None):
    found = [d for d in outcome.decisions if d.annotator_id == cid and (verdict is None or d.verdict == verdict)]
    assert len(found) == 1, outcome.decisions
    return found[0]


def reasons(outcome: GateOutcome, cid: str, verdict: str | None = None) -> str:
    return " | ".join(decision(outcome, cid, verdict).reasons)


P = votes(c0=range(10))  # perfect on class 0, silent on class 1
R = votes(c1=range(10, 20))  # perfect on class 1


RAW = GateConfig(precision_z=0, min_lift=0)  # the raw precision, no confidence bound, no chance check
NO_LIFT = GateConfig(min_lift=0)  # for rules shown with annotators no better than chance (0.5 on 2 classes)


def test_viability_threshold_depends_on_the_role():
    weak = votes(c1=[10, 11], c0=range(12, 17))  # fires 7, 2 correct: precision 0.2857
    as_generator = gate({"P": P}, [cand("G", weak, "generator")], config=RAW)
    assert decision(as_generator, "G").verdict == "reject"
    assert "precision 0.29 < 0.30 (generator)" in reasons(as_generator, "G")
    assert as_generator.pool_ids == ("P",)

    as_improver = gate({"P": P}, [cand("I", weak, "improver")], config=RAW)
    assert decision(as_improver, "I").verdict == "accept"
    assert "precision 0.29 >= 0.25 (improver)" in reasons(as_improver, "I")
    assert as_improver.pool_ids == ("P", "I")
    # MV with I: class 0 F1 20/25 = 0.8, class 1 F1 4/12; before: class 0 F1 1, class 1 F1 0
    assert as_improver.f1_before == pytest.approx(0.5)
    assert as_improver.f1_after == pytest.approx((0.8 + 1 / 3) / 2)


def test_viability_judges_the_lower_bound_of_precision_not_the_raw_figure():
    lucky = votes(c1=[10, 11, 0, 1, 2])  # 2 of 5 right: raw 0.40 >= 0.30, but 0.22 at the lower bound
    judged = gate({}, [cand("L", lucky)], config=GateConfig(precision_z=1.0, min_lift=0))
    assert decision(judged, "L").verdict == "reject"
    assert "precision 0.40, lower bound 0.22 over 5 fires: 0.22 < 0.30 (generator)" in reasons(judged, "L")
    assert decision(gate({}, [cand("L", lucky)], config=RAW), "L").verdict == "accept"
    steady = votes(c1=[10, 11, 12, 0, 1])  # 3 of 5: lower bound 0.38
    assert decision(gate({}, [cand("S", steady)], config=GateConfig(precision_z=1.0, min_lift=0)),
                    "S").verdict == "accept"


def test_chance_is_judged_on_the_precision_bound_not_the_raw_figure():
    """6 of 10 right (0.60) for a class holding 16 of 30 dev rows (0.53): the raw figure clears chance, its lower
    bound (0.52) does not, so a handful of lucky fires cannot carry a near-chance rule into the pool."""
    y = np.array([0] * 14 + [1] * 16)
    near = np.full(30, ABSTAIN)
    near[[0, 1, 2, 3, 14, 15, 16, 17, 18, 19]] = 1
    annotator = Annotator(id="A", name="A", source="", agent="improver", generation=1)
    out = run_gate([], np.zeros((30, 0), dtype=int), {}, [(annotator, near, score_annotator("A", near, y))], y, 2,
                   GateConfig())
    assert decision(out, "A").verdict == "reject"
    assert "no better than chance: precision lower bound 0.52 <= 0.53" in " | ".join(decision(out, "A").reasons)


def test_viability_rejects_a_precision_no_better_than_the_class_share():
    # 8 class-1 rows of 20: a rule voting class 1 on rows picked regardless of content is right 40% of the time
    y = np.array([0] * 12 + [1] * 8)
    at_chance = np.full(20, ABSTAIN)
    at_chance[[0, 1, 2, 12, 13]] = 1  # 2 of 5 right: precision 0.40, exactly the class's share
    better = np.full(20, ABSTAIN)
    better[[0, 12, 13, 14, 15, 16]] = 1  # 5 of 6 right: 0.83, about 2x chance
    annotator = Annotator(id="A", name="A", source="", agent="improver", generation=1)
    other = Annotator(id="B", name="B", source="", agent="improver", generation=1)
    raw = GateConfig(precision_z=0)
    out = run_gate([], np.zeros((20, 0), dtype=int), {}, [(annotator, at_chance, score_annotator("A", at_chance, y)),
                   (other, better, score_annotator("B", better, y))], y, 2, raw)
    assert decision(out, "A").verdict == "reject"
    assert "no better than chance: precision 0.40 <= 0.40" in " | ".join(decision(out, "A").reasons)
    assert decision(out, "B").verdict == "accept"
    assert "precision 0.83 vs chance 0.40" in " | ".join(decision(out, "B").reasons)
    # the check can be turned off; then 0.40 >= 0.25 (improver) passes
    off = run_gate([], np.zeros((20, 0), dtype=int), {}, [(annotator, at_chance, score_annotator("A", at_chance, y))],
                   y, 2, GateConfig(precision_z=0, min_lift=0))
    assert decision(off, "A").verdict == "accept"


def test_viability_rejects_few_fires_and_mostly_faulting():
    rare = gate({}, [cand("F", votes(c1=[10, 11, 12, 13]))])
    assert decision(rare, "F").verdict == "reject" and "fires 4 < 5" in reasons(rare, "F")
    faulty = gate({}, [cand("X", R, faults=11)])
    assert decision(faulty, "X").verdict == "reject"
    assert "faults on 11 of 20 dev rows" in reasons(faulty, "X")
    strict = gate({}, [cand("S", votes(c1=range(10, 15)))], config=GateConfig(min_fires=6))
    assert "fires 5 < 6" in reasons(strict, "S")


def test_a_class_with_fewer_dev_rows_than_min_fires_asks_as_many_fires_as_it_has_rows():
    y = np.array([0] * 17 + [1] * 3)  # class 1: 3 dev rows, so 5 fires would need 2 wrong ones at best
    small = np.full(20, ABSTAIN)
    small[[17, 18, 0]] = [1, 1, 1]  # 3 fires, 2 right
    annotator = Annotator(id="S", name="S", source="", agent="generator", generation=1)
    candidate = (annotator, small, score_annotator("S", small, y))
    empty = np.zeros((20, 0), dtype=int)
    kept = run_gate([], empty, {}, [candidate], y, K)
    assert decision(kept, "S").verdict == "accept"
    assert "fires 3 >= 3 (its class has 3 dev rows)" in reasons(kept, "S")
    off = run_gate([], empty, {}, [candidate], y, K, config=GateConfig(small_class_fires=0))
    assert "fires 3 < 5" in reasons(off, "S")
    two = np.full(20, ABSTAIN)
    two[[17, 18]] = 1  # never fewer than small_class_fires (3), however small the class
    lone = run_gate([], empty, {}, [(annotator, two, score_annotator("S", two, y))], y, K)
    assert "fires 2 < 3 (its class has 3 dev rows)" in reasons(lone, "S")
    mixed = small.copy()
    mixed[[1, 2, 3]] = 0  # also votes the big class (17 rows): five fires, as for any class that big
    both = run_gate([], empty, {}, [(annotator, mixed, score_annotator("S", mixed, y))], y, K,
                    config=GateConfig(min_fires=7))
    assert "fires 6 < 7" in reasons(both, "S") and "its class has" not in reasons(both, "S")


def test_the_small_class_rule_reads_the_biggest_class_an_annotator_votes_and_label_sets_too():
    from engine.metrics.score import fires_needed, voted_class_rows

    y = np.array([0] * 12 + [1] * 2 + [2] * 6)
    assert voted_class_rows(np.array([1, 1, 1] + [ABSTAIN] * 17), y, 3) == 2
    assert voted_class_rows(np.array([1, 1, 1, 0] + [ABSTAIN] * 16), y, 3) == 12  # not the mean of 2 and 12
    assert voted_class_rows(np.full(20, ABSTAIN), y, 3) == 0
    assert fires_needed(5, 2, 3) == 3 and fires_needed(5, 0, 3) == 5  # a class dev lacks excuses nothing
    assert fires_needed(5, 2, 0) == 5 and fires_needed(5, 40, 3) == 5
    sets = np.zeros((20, 3), dtype=int)
    sets[:4, 1] = 1
    sets[:, 0] = 1
    assert voted_class_rows(np.array([1] * 3 + [ABSTAIN] * 17), sets, 3) == 4  # rows whose set holds the class


def test_near_copy_of_a_pool_member_is_rejected_by_jaccard():
    out = gate({"P": P}, [cand("copy", P.copy(), "improver")])
    assert decision(out, "copy").verdict == "reject"
    assert "too similar to P: Jaccard 1.00 > 0.95" in reasons(out, "copy")
    assert out.pool_ids == ("P",) and not out.pruned_ids


def test_near_copy_of_an_earlier_newcomer_is_rejected():
    out = gate({"P": P}, [cand("R1", R), cand("R2", R.copy())])
    assert decision(out, "R1").verdict == "accept"
    assert "max Jaccard 0.00 <= 0.95" in reasons(out, "R1")
    assert decision(out, "R2").verdict == "reject" and "too similar to R1" in reasons(out, "R2")
    assert out.pool_ids == ("P", "R1") and out.f1_after == pytest.approx(1.0)


def test_newcomer_covering_a_pool_member_with_higher_precision_prunes_it():
    Q = votes(c0=list(range(10)) + [10, 11])  # fires 12, 10 correct: precision 0.833
    N = votes(c0=range(10), c1=[10, 11])  # same rows, all correct: precision 1.0
    out = gate({"Q": Q}, [cand("N", N, "improver")])
    assert decision(out, "N").verdict == "accept"
    assert decision(out, "Q", "prune").reasons[0].startswith("covered by N: 1.00 >= 0.95 of its fired dev rows")
    assert "precision 1.00 >= 0.83 + 0.05" in reasons(out, "Q", "prune")
    assert out.pool_ids == ("N",) and out.pruned_ids == ("Q",)
    assert out.f1_before == pytest.approx((20 / 22) / 2)
    assert out.f1_after == pytest.approx((1.0 + 4 / 12) / 2)

    # a human-approved member is never pruned, so the newcomer is then a near-copy of it
    locked = gate({"Q": Q}, [cand("N", N, "improver")], human_locked={"Q": "approve"})
    assert not locked.pruned_ids and locked.pool_ids == ("Q",)
    assert "too similar to Q" in reasons(locked, "N")

    # not precise enough by the margin: no prune, and the near-copy is rejected
    small_gain = gate({"Q": Q}, [cand("N", N)], config=GateConfig(prune_precision_margin=0.2))
    assert not small_gain.pruned_ids and decision(small_gain, "N").verdict == "reject"


def test_marginal_step_drops_a_newcomer_whose_removal_raises_f1():
    W = votes(c0=list(range(5)) + list(range(10, 15)))  # precision 0.5, ties R down to class 0 on rows 10-14
    out = gate({"P": P, "R": R}, [cand("W", W)], config=NO_LIFT)
    assert decision(out, "W").verdict == "reject"
    # with W: class 0 F1 20/25 = 0.8, class 1 F1 10/15 -> 0.733
    assert "removing it raises pool dev macro-F1 0.733 -> 1.000" in reasons(out, "W")
    assert out.pool_ids == ("P", "R") and out.f1_after == pytest.approx(1.0) and not out.reverted


def test_marginal_step_keeps_a_neutral_newcomer():
    neutral = votes(c1=range(12, 20))  # agrees with R where it fires
    out = gate({"P": P, "R": R}, [cand("ok", neutral)])
    assert decision(out, "ok").verdict == "accept"
    assert "marginal: pool dev macro-F1 1.000 without it, 1.000 with it" in reasons(out, "ok")


def test_do_no_harm_reverts_the_generation():
    # each harms only together with the other: removing either alone leaves a 1-1 tie that still says 0
    W1 = votes(c0=list(range(5)) + list(range(10, 15)))
    W2 = votes(c0=list(range(5, 10)) + list(range(10, 15)))
    out = gate({"P": P, "R": R}, [cand("W1", W1), cand("W2", W2)], config=NO_LIFT)
    assert out.reverted
    for cid in ("W1", "W2"):
        assert decision(out, cid).verdict == "reject"
        assert reasons(out, cid).startswith("generation reverted: pool dev macro-F1 would fall 1.000 -> 0.733")
    assert out.pool_ids == ("P", "R")
    assert out.f1_before == pytest.approx(1.0) and out.f1_after == pytest.approx(1.0)

    # with a looser tolerance the same generation stands
    loose = gate({"P": P, "R": R}, [cand("W1", W1), cand("W2", W2)], config=GateConfig(harm_tolerance=0.5, min_lift=0))
    assert not loose.reverted and loose.pool_ids == ("P", "R", "W1", "W2")


def test_revert_keeps_human_approved_newcomers():
    W1 = votes(c0=list(range(5)) + list(range(10, 15)))
    W2 = votes(c0=list(range(5, 10)) + list(range(10, 15)))
    H = votes(c1=range(15, 20))
    out = gate({"P": P, "R": R}, [cand("W1", W1), cand("H", H), cand("W2", W2)], human_locked={"H": "approve"},
               config=NO_LIFT)
    assert out.reverted and out.pool_ids == ("P", "R", "H")
    assert decision(out, "H").verdict == "approve" and decision(out, "H").decided_by == "human"


def test_human_locks_override_the_checks():
    useless = votes(c0=[10])  # 1 fire, precision 0: would fail viability
    good = R
    out = gate({"P": P}, [cand("U", useless), cand("G", good)], human_locked={"U": "approve", "G": "reject"})
    u, g = decision(out, "U"), decision(out, "G")
    assert (u.verdict, u.decided_by, u.reasons) == ("approve", "human", ("approved by a human earlier",))
    assert (g.verdict, g.decided_by, g.reasons) == ("reject", "human", ("rejected by a human earlier",))
    assert out.pool_ids == ("P", "U")
    assert out.accepted_ids == ("U",)


def test_candidate_already_in_the_pool_keeps_its_place():
    out = gate({"P": P, "R": R}, [cand("P", P.copy())])
    assert decision(out, "P").verdict == "accept" and out.pool_ids == ("P", "R")


def test_every_decision_has_reasons_and_candidates_come_first():
    W = votes(c0=list(range(5)) + list(range(10, 15)))
    N = votes(c0=range(10), c1=[10, 11])
    Q = votes(c0=list(range(10)) + [10, 11])
    out = gate({"Q": Q, "R": R}, [cand("W", W), cand("N", N), cand("F", votes(c1=[10]))])
    assert [d.annotator_id for d in out.decisions][:3] == ["W", "N", "F"]
    assert all(d.reasons for d in out.decisions)


def test_gate_config_from_dict():
    cfg = GateConfig.from_dict({"min_fires": "3", "max_jaccard": 0.9})
    assert cfg.min_fires == 3 and isinstance(cfg.min_fires, int) and cfg.max_jaccard == 0.9
    assert cfg.min_precision("generator") == 0.30 and cfg.min_precision("refiner") == 0.25
    assert GateConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown gate setting"):
        GateConfig.from_dict({"min_firez": 3})
    # valid JSON of the wrong shape is a ValueError naming what is wrong (the CLI prints it), not a TypeError
    for bad, says in (([1, 2], "an object"), ({"min_fires": None}, "min_fires: None is not a number"),
                      ({"min_fires": "abc"}, "min_fires: 'abc' is not a number"),
                      ({"min_fires": 2.7}, "a whole number"), ({"max_jaccard": True}, "not a number"),
                      ({"min_fires": float("inf")}, "not a number"), ({"max_jaccard": float("nan")}, "not a number")):
        with pytest.raises(ValueError, match=re.escape(says)):
            GateConfig.from_dict(bad)


def test_pool_evidence_can_sink_a_candidate_that_dev_alone_would_keep():
    lucky = votes(c0=range(6))  # 6 of 6 on dev
    kept = gate({}, [cand("L", lucky)])
    assert decision(kept, "L").verdict == "accept"
    # the pool sample's pseudo-labels say it is right on 10 % of 200 rows, worth 100 dev rows
    sunk = gate({}, [cand("L", lucky)], pool_evidence={"L": (0.10, 100.0)})
    assert decision(sunk, "L").verdict == "reject"
    assert "about 0.10 on the unlabeled sample (worth 100 rows)" in reasons(sunk, "L")
    # evidence that agrees with dev keeps it, and an annotator without evidence is judged on dev alone
    agreed = gate({}, [cand("L", lucky), cand("R", R)], pool_evidence={"L": (0.95, 100.0)})
    assert decision(agreed, "L").verdict == "accept" and decision(agreed, "R").verdict == "accept"


def test_a_copy_of_a_member_whose_replacer_is_dropped_is_rejected():
    # C1 covers pool member P with higher precision, so check 2 lets it replace P and compares the later C2 (P's
    # exact copy) with C1, not P; check 3 then drops C1, P stays, and C2 would have joined as P's copy
    y = np.zeros(200, dtype=int)
    y[0:12] = 1
    y[20:73] = 1

    def fires(rows: range, label: int) -> np.ndarray:
        out = np.full(200, ABSTAIN)
        out[list(rows)] = label
        return out

    pool = {"P": fires(range(0, 20), 1), "Q": fires(range(100, 200), 0)}
    made = [(Annotator(id=c, name=c, source="", agent="generator", generation=1), v, score_annotator(c, v, y))
            for c, v in (("C1", fires(range(0, 100), 1)), ("C3", fires(range(20, 73), 1)),
                         ("C2", fires(range(0, 20), 1)))]
    out = run_gate(list(pool), np.column_stack(list(pool.values())), {}, made, y, 2)
    by_id = {d.annotator_id: d for d in out.decisions}
    assert by_id["C1"].verdict == "reject" and "P" in out.pool_ids  # dropped at the margin: P is not pruned
    assert by_id["C2"].verdict == "reject" and "too similar to P" in by_id["C2"].reasons[-1]
    assert "C2" not in out.pool_ids and "C3" in out.pool_ids
    # a copy that is right where P is wrong passes check 2's prune test against P: it replaces P instead
    better = fires(range(0, 20), 1)
    better[12:20] = 0
    made[2] = (made[2][0], better, score_annotator("C2", better, y))
    out = run_gate(list(pool), np.column_stack(list(pool.values())), {}, made, y, 2)
    by_id = {d.annotator_id: d for d in out.decisions}
    assert by_id["C2"].verdict == "accept" and by_id["P"].verdict == "prune"
    assert "covered by C2" in by_id["P"].reasons[0]
    assert "P" not in out.pool_ids and {"C2", "C3", "Q"} <= set(out.pool_ids)


def test_faults_are_weighed_against_the_rows_the_annotator_ran_on():
    # a generation runs a candidate on all of dev (audit rows too) but judges it on the fitness rows: 12 faults
    # over 40 rows run is under half, though more than half of the 20 fitness rows
    flaky = cand("F", R, faults=12)
    assert "faults on 12 of 20" in reasons(gate({}, [flaky]), "F")
    judged = gate({}, [flaky], rows_run={"F": 40})
    assert decision(judged, "F").verdict == "accept" and "faults" not in reasons(judged, "F")
    assert "faults on 25 of 40" in reasons(gate({}, [cand("F", R, faults=25)], rows_run={"F": 40}), "F")
