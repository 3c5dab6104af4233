"""Cues seeded from the labels' names and descriptions (engine/agents/offline/task_words.py)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.agents.base import ProposalContext
from engine.agents.offline.candidates import build_workspace
from engine.agents.offline.roles import improver_proposals
from engine.agents.offline.selection import Proposal, SelectConfig, greedy_select, halves
from engine.agents.offline.task_words import label_words, seeded_proposals, seeded_specs, word_cue
from engine.domain import ABSTAIN, Example, Task
from engine.gate import GateConfig
from engine.sandbox.checks import check_source
from engine.specs.templates import AnnotatorSpec, parse_spec, render

ROWS = [
    ("my card has not arrived yet", "card_arrival"),
    ("when will the new card arrive", "card_arrival"),
    ("still waiting for my card to arrive", "card_arrival"),
    ("card arrival takes how long", "card_arrival"),
    ("the card arrived broken", "card_arrival"),
    ("my card was stolen yesterday", "lost_or_stolen_card"),
    ("i lost my card on the bus", "lost_or_stolen_card"),
    ("someone stole my card", "lost_or_stolen_card"),
    ("card lost please block it", "lost_or_stolen_card"),
    ("the arrival of my refund", "refund"),
    ("where is my refund", "refund"),
    ("refund still not here", "refund"),
    ("i want my money back", "refund"),
    ("send the money back now", "refund"),
]


def _workspace(descriptions: dict[str, str] | None = None):
    labels = ("card_arrival", "lost_or_stolen_card", "refund")
    task = Task(name="bank", labels=labels, label_descriptions=descriptions or {})
    inputs = [{"text": text} for text, _ in ROWS]
    y = np.array([labels.index(label) for _, label in ROWS])
    return build_workspace(task, inputs, y, inputs, ("sentence",))


def test_label_words_split_names_and_drop_function_words():
    assert label_words("lost_or_stolen_card") == ["lost", "stolen", "card"]
    assert label_words("Substrate/Product") == ["substrate", "product"]
    assert label_words("Cause-Effect(e1,e2)") == ["cause", "effect"]
    assert label_words("HumanBeing", "a person or group of people") == ["human", "being", "person", "group",
                                                                         "people"]


def test_a_negation_is_content_in_a_label_name_only():
    assert label_words("NOT") == ["not"]
    assert label_words("card_not_working") == ["card", "not", "working"]
    assert label_words("ham", "messages that are not spam") == ["ham", "messages", "spam"]


def test_word_cue_takes_the_widest_stem_but_keeps_short_words_exact():
    assert word_cue("arrival") == "arriv*"
    assert word_cue("card") == "card*"
    assert word_cue("pay") == "pay"
    # a description's word loses only an inflection: "activity" gave activ*, which fires on "activates"
    assert word_cue("activity", widest=False) == "activity*" and word_cue("activity") == "activ*"
    assert word_cue("subscribe", widest=False) == "subscrib*" and word_cue("inhibits", widest=False) == "inhibit*"
    # -es is a plural's ending only after s, x, z, ch, sh: speci* fired on "specific" and "special"
    assert word_cue("species", widest=False) == "specie*" and word_cue("wishes", widest=False) == "wish*"


def test_a_descriptions_words_seed_narrow_stems_and_the_names_wide_ones():
    task = Task(name="t", labels=("INHIBITS", "OTHER"),
                label_descriptions={"INHIBITS": "reduces the activity of an enzyme"})
    rows = [("the drug inhibits the activity of the enzyme", 0), ("it activates the receptor strongly", 1),
            ("the compound reduces enzyme activity", 0), ("no relation between the two", 1)] * 3
    inputs = [{"text": text} for text, _ in rows]
    ws = build_workspace(task, inputs, np.array([y for _, y in rows]), inputs, ("sentence",))
    cues = {spec.cues for label, spec in seeded_specs(ws) if label == 0 and not spec.also}
    assert ("activity*",) in cues and ("activ*",) not in cues
    assert ("inhibit*",) in cues  # the name's own word, widest


def test_seeded_proposals_find_the_label_words_and_need_a_second_word_where_one_is_shared():
    ws = _workspace()
    proposals = seeded_proposals(ws, min_precision=0.3)
    by_spec = {(p.spec.label, p.spec.cues, p.spec.also): p for p in proposals}
    # `arriv*` alone also fires on a refund row; with `card*` required it is exact
    alone = by_spec[("card_arrival", ("arriv*",), ())]
    paired = by_spec[("card_arrival", ("arriv*",), ("card*",))]
    assert alone.fired.sum() == 6 and paired.fired.sum() == 5
    assert np.all(ws.y[paired.fired] == 0)
    assert paired.prior > 0
    # a one-word name is its own cue; every proposal beats its class share and the floor
    assert ("refund", ("refund*",), ()) in by_spec
    for p in proposals:
        precision = float(np.mean(ws.hit(p.label)[p.fired]))
        assert precision >= 0.3 and precision > ws.class_prior[p.label]


def test_seeded_specs_render_to_checked_code_that_reads_back():
    ws = _workspace({"refund": "money returned to the customer"})
    for p in seeded_proposals(ws, min_precision=0.0):
        source = render(p.spec)
        assert check_source(source)  # raises CodeRejected on anything outside the allow-list
        assert parse_spec(source) == p.spec


def test_descriptions_add_cues_the_name_lacks():
    without = {p.spec.cues for p in seeded_proposals(_workspace(), 0.0) if p.spec.label == "refund"}
    with_desc = {p.spec.cues for p in seeded_proposals(_workspace({"refund": "your money back"}), 0.0)
                 if p.spec.label == "refund"}
    assert ("money*",) not in without
    assert ("money*",) in with_desc and ("back*",) in with_desc
    assert with_desc >= without


def test_a_description_saved_between_two_generations_reaches_the_offline_seeds():
    from dataclasses import replace

    from engine.agents.offline.proposer import OfflineProposer

    ws = _workspace()
    dev = tuple(Example(f"d{i}", text, "dev", int(y)) for i, ((text, _), y) in enumerate(zip(ROWS, ws.y, strict=True)))
    before = ProposalContext(task=ws.task, dev=dev, pool_sample=(), annotators=(), scores={},
                             dev_votes=np.zeros((len(dev), 0), dtype=np.int64), generation=1, seed=0)
    after = replace(before, task=replace(ws.task, label_descriptions={"refund": "money back"}), generation=2)
    proposer = OfflineProposer()
    cues = [{spec.cues for _, spec in seeded_specs(proposer._workspace(context))} for context in (before, after)]
    assert ("money*",) in cues[1] - cues[0]


def test_relation_tasks_seed_the_label_words_between_the_mentions_near_and_at_any_distance():
    task = Task(name="rel", labels=("Agonist", "Antagonist"), fields=("entity1", "entity2", "span1", "span2"))
    text = "drug D is an agonist of receptor R"
    inputs = [{"text": text, "span1": [5, 6], "span2": [33, 34]}]
    ws = build_workspace(task, inputs, np.array([0]), inputs, ("between", "near", "sentence", "before"))
    views = {spec.view for label, spec in seeded_specs(ws) if spec.cues == (word_cue("agonist"),) and label == 0}
    assert views == {"between", "near", "sentence"}  # not the three-word windows around the mentions


def _picked(fired: np.ndarray, gold: np.ndarray, mined: bool, cross_fit: bool, small_class_fires: int = 0) -> bool:
    spec = AnnotatorSpec("cue", "NOT", "between", ("not",))
    config = SelectConfig(min_precision=0.25, cross_fit=cross_fit, pair_lookahead=False,
                          small_class_fires=small_class_fires)
    base = np.zeros((len(gold), 2), dtype=np.int64)
    base[~fired, 0] = 1  # the pool votes the big class wherever the cue is silent
    return bool(greedy_select([Proposal(spec, 1, fired, mined=mined)], gold, 2, base, [], config))


def test_the_preview_reads_a_seeded_cue_without_the_margin_for_a_scan_of_dev():
    gold = np.array([1] * 6 + [0] * 54)
    fired = np.zeros(60, dtype=bool)
    fired[[0, 1, 2, 10, 11, 12, 13, 14]] = True  # 3 of 8: a scan's luck at z 1.5, the gate's bound at z 0.5
    assert not _picked(fired, gold, mined=True, cross_fit=False)
    assert _picked(fired, gold, mined=False, cross_fit=False)


def test_a_seeded_cue_is_credited_its_whole_dev_gain_not_the_worse_half():
    gold = np.array([1] * 6 + [0] * 54)
    first, _ = halves(gold)
    right = [i for i in first if gold[i] == 1]  # every right vote in one half: the other half gains nothing
    fired = np.zeros(60, dtype=bool)
    fired[right + [20, 21]] = True
    assert not _picked(fired, gold, mined=True, cross_fit=True)
    assert _picked(fired, gold, mined=False, cross_fit=True)


def test_a_seed_of_a_class_with_three_dev_rows_needs_three_fires_not_five_and_a_mined_cue_still_five():
    gold = np.array([1] * 3 + [0] * 57)  # ChemProt's Cofactor: 3 fitness rows
    fired = np.zeros(60, dtype=bool)
    fired[[0, 1, 20]] = True  # 2 of 3: five fires cannot show a class of three rows
    assert _picked(fired, gold, mined=False, cross_fit=False, small_class_fires=3)
    assert not _picked(fired, gold, mined=True, cross_fit=False, small_class_fires=3)  # a scan finds 2 of 3 by luck
    big = np.array([1] * 12 + [0] * 48)
    assert not _picked(fired, big, mined=False, cross_fit=False, small_class_fires=3)  # twelve rows show five fires


def test_the_preview_asks_every_seed_for_min_fires_by_default():
    gold = np.array([1] * 3 + [0] * 57)
    fired = np.zeros(60, dtype=bool)
    fired[[0, 1, 20]] = True
    assert SelectConfig().small_class_fires == 0
    assert not _picked(fired, gold, mined=False, cross_fit=False)


def test_every_seeded_proposal_is_unmined_and_the_preview_reads_it_at_the_gates_default_z():
    assert SelectConfig().unmined_z == GateConfig().precision_z
    proposals = seeded_proposals(_workspace(), 0.0)
    assert proposals and not any(p.mined for p in proposals)


def test_a_seeds_bound_pooled_with_pool_evidence_reads_the_gates_z_too():
    gold = np.array([1] * 8 + [0] * 52)
    fired = np.zeros(60, dtype=bool)
    fired[:8] = True  # 8 of 8 on dev, but the pool sample's evidence says 0.2 over 40 rows: pooled 16 of 48
    spec = AnnotatorSpec("cue", "NOT", "between", ("not",))
    config = SelectConfig(min_precision=0.25, cross_fit=False, pair_lookahead=False)
    base = np.zeros((60, 2), dtype=np.int64)
    base[~fired, 0] = 1

    def picked(mined: bool) -> bool:
        return bool(greedy_select([Proposal(spec, 1, fired, mined=mined)], gold, 2, base, [], config,
                                  pool_evidence=lambda p: (0.2, 40.0)))

    assert not picked(mined=True)  # bound at z 1.5 ~0.23 < 0.25
    assert picked(mined=False)  # at z 0.5 ~0.30


def test_the_improver_offers_the_seeds_of_its_weak_classes_only():
    ws = _workspace()
    dev = tuple(Example(f"d{i}", text, "dev", int(y)) for i, ((text, _), y) in enumerate(zip(ROWS, ws.y, strict=True)))
    votes = np.where(ws.y == 0, 0, ABSTAIN)[:, None]  # the pool gets every card_arrival row right, nothing else
    context = ProposalContext(task=ws.task, dev=dev, pool_sample=(), annotators=(), scores={}, dev_votes=votes,
                              generation=1, seed=0)
    seeded = [p for p in improver_proposals(ws, context, np.random.default_rng(0), 0.25) if not p.mined]
    assert {p.label for p in seeded} == {1, 2}  # lost_or_stolen_card and refund, not card_arrival


def _container_rows() -> list[dict]:
    words = "box bottle jar suitcase bucket team government music river happiness".split()
    return [{"text": f"the {word} is here"} for word in words for _ in range(2)]


def test_nearest_words_come_from_the_packaged_minilm_table_not_from_spelling():
    from engine.agents.offline.cues import ViewIndex
    from engine.agents.offline.word_sense import nearest_words

    index = ViewIndex(_container_rows() + [{"text": "a lone crate"}], ("sentence",))
    near = nearest_words(index, "sentence", "container", 4)
    assert set(near) == {"box", "jar", "bottle", "bucket"}  # none shares a letter run with "container"
    assert "crate" not in nearest_words(index, "sentence", "container", 20)  # on one row only: no cue to widen with
    assert nearest_words(index, "sentence", "member", 4) == ["team"]  # the rest are too far to be worth a guess


def _container_workspace(y: np.ndarray | None = None):
    task = Task(name="rel", labels=("Content-Container", "Member-Collection"),
                fields=("entity1", "entity2", "span1", "span2"))
    inputs = []
    for row in _container_rows():
        word = row["text"].split()[1]
        text = f"water in the {word}"
        inputs.append({"text": text, "entity1": "water", "entity2": word, "span1": [0, 5],
                       "span2": [13, 13 + len(word)]})
    y = np.array([0 if i < 10 else 1 for i in range(len(inputs))]) if y is None else y
    return build_workspace(task, inputs, y, inputs, ("between", "entity2"))


def _banks(ws) -> dict:
    return {spec.cues[0]: spec for label, spec in seeded_specs(ws) if label == 0 and spec.view == "entity2"}


def test_a_label_word_and_its_neighbours_in_meaning_make_one_seeded_bank_per_view():
    banks = _banks(_container_workspace())
    container = banks[word_cue("container")].cues
    assert {"box", "jar", "bottle", "bucket"} <= set(container[1:])
    assert not {"government", "music", "river"} & set(container)
    for spec in banks.values():  # still plain code the checker passes, read back by the refiner
        assert check_source(render(spec)) and parse_spec(render(spec)) == spec


def test_the_banks_read_no_label():
    ws = _container_workspace()
    shuffled = _container_workspace(np.random.default_rng(0).permutation(ws.y))
    flipped = _container_workspace(1 - ws.y)
    assert _banks(ws) and _banks(ws) == _banks(shuffled) == _banks(flipped)


def test_without_the_word_table_the_other_seeds_stay(monkeypatch):
    from engine.agents.offline import word_sense

    def missing(*_args, **_kwargs):
        raise OSError("no model files")

    monkeypatch.setattr(word_sense, "_vocabulary", missing)
    ws = _container_workspace()
    with pytest.warns(UserWarning, match="word table is not available"):
        specs = seeded_specs(ws)
    assert specs and not any(spec.view == "entity2" for _, spec in specs)  # the name's words still seed "between"


def test_a_specs_cached_id_is_the_id_of_its_rendered_code():
    from engine.agents.offline.proposer import _hash, _spec_hash

    specs = [AnnotatorSpec("cue", "refund", "sentence", ("refund*", "money back")),
             AnnotatorSpec("cue", "NOT", "between", ("not",), also=("inhibit*",), unless=("no",)),
             AnnotatorSpec("surface", "spam", feature="caps_share", op=">=", threshold=0.0),
             AnnotatorSpec("surface", "spam", feature="caps_share", op=">=", threshold=-0.0)]
    for spec in specs * 2:  # the second round reads the cache
        assert _spec_hash(spec) == _hash(render(spec))
