"""What each offline role mines: the generator from all of dev, the improver from the pool's failures,
the refiner from the pool's precise-but-narrow members."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.agents.base import ProposalContext
from engine.agents.offline.candidates import (
    OfflineWorkspace,
    cue_proposals,
    exception_variants,
    keyword_banks,
    surface_proposals,
)
from engine.agents.offline.cues import dedupe_prefixes, stems
from engine.agents.offline.selection import Proposal, predictions, vote_counts
from engine.agents.offline.task_words import seeded_proposals
from engine.metrics.score import per_class_f1
from engine.pseudo_labels import MINED_ON_GUESSES
from engine.specs import surface
from engine.specs.templates import AnnotatorSpec, parse_spec

WEAK_F1 = 0.40
# a cue mined on the pool sample's guessed labels fires this often there (twice dev's min_fires on eight times the
# rows; 20 was tried in scratch runs, not a recorded bench, and left TREC's small ABBR class worse on pool gold)
POOL_MIN_FIRES = 10
NARROW_COVERAGE = 0.08
PRECISE = 0.55


def _jitter(proposals: list[Proposal], rng: np.random.Generator, scale: float = 0.15) -> list[Proposal]:
    """Seeded noise on the ranking prior, so generations explore different near-equal candidates."""
    for p in proposals:
        p.prior *= float(1.0 + scale * rng.normal())
    return proposals


def generator_proposals(ws: OfflineWorkspace, rng: np.random.Generator,
                        min_precision: float) -> list[Proposal]:
    """Single cues, keyword banks, vetoed variants and surface thresholds mined from `ws`'s dev rows (all of dev, or
    one half when the proposer cross-fits), and cues seeded from the labels' names and descriptions."""
    singles = cue_proposals(ws, min_precision=min_precision)
    banks = keyword_banks(ws, singles, min_precision=min_precision)
    vetoed = exception_variants(ws, singles + banks)
    seeded = seeded_proposals(ws, min_precision)
    return _jitter(singles + banks + vetoed + seeded + surface_proposals(ws, min_precision=min_precision), rng)


def _votes(ws: OfflineWorkspace, context: ProposalContext) -> np.ndarray:
    votes = np.asarray(context.dev_votes, dtype=np.int64)
    if votes.ndim != 2 or votes.shape[0] != len(ws.y):
        votes = np.zeros((len(ws.y), 0), dtype=np.int64)
    return votes


def improver_proposals(ws: OfflineWorkspace, context: ProposalContext, rng: np.random.Generator,
                       min_precision: float, mine_dev: bool = True) -> list[Proposal]:
    """Cues mined on the rows the pool leaves uncovered, disputes or gets wrong, boosted for weak classes, and
    the weak classes' cues seeded from their names (at the improver's lower floor). `mine_dev=False`: the seeds
    only (the proposer mines the pool sample's guessed labels instead: `guessed_label_proposals`)."""
    pred = predictions(vote_counts(_votes(ws, context), ws.n_classes, len(ws.y)))
    focus = np.zeros(len(ws.y), dtype=bool)
    focus[context.uncovered_dev()] = True
    focus[context.conflicting_dev()] = True
    f1 = per_class_f1(ws.y, pred, ws.n_classes)
    weak = np.flatnonzero((f1 < WEAK_F1) & (np.bincount(ws.y, minlength=ws.n_classes) > 0))
    focus |= np.isin(ws.y, weak) & (pred != ws.y)
    if not focus.any():
        return []
    seeded = seeded_proposals(ws, min_precision, classes=set(weak.tolist()))
    if not mine_dev:
        return _jitter(seeded, rng)
    weight = np.ones(ws.n_classes)
    weight[weak] = 2.0
    singles = cue_proposals(ws, rows=focus, min_precision=min_precision, weight=weight)
    for p in singles:
        p.note = "mined on uncovered / disputed / misclassified dev rows"
    banks = keyword_banks(ws, singles, min_precision=min_precision)
    conj = conjunctions(ws, singles, weak, min_precision)
    return _jitter(singles + banks + conj + seeded, rng)


def guessed_label_proposals(ws: OfflineWorkspace, guess: np.ndarray, min_precision: float,
                            judged: np.ndarray | None, min_fires: int = POOL_MIN_FIRES) -> list[Proposal]:
    """Single cues and keyword banks mined on the pool sample against a text classifier's guesses (`guess`:
    (n_pool_sample,) class ids, engine/pseudo_labels.py), each fired on dev and judged on the `judged` dev rows
    (`Proposal.held`, a shared read-only mask): those the classifier was not fitted on. `judged=None`: on all of dev,
    which the classifier was fitted on, at the full fires and bound of a cue mined on dev. Thousands of guessed rows
    give a cue wider support than a few hundred dev rows (bench/cross_fit.py). On relation tasks a sentence cue must
    be a relation word in the sample, as a dev-mined one must (`OfflineWorkspace.relation_word`)."""
    assert ws.pool is not None  # the guesses are of the pool sample's rows
    n = ws.pool.n_rows
    guess = np.asarray(guess[:n], dtype=np.int64)
    onehot = np.zeros((n, ws.n_classes), dtype=np.int32)
    onehot[np.arange(n), guess] = 1
    # the pool sample as the rows mined; its own index (words, no prefixes) and no second sample to check against
    guessed = OfflineWorkspace(task=ws.task, views=ws.views, y=guess, onehot=onehot, dev=ws.pool, pool=None,
                               dev_surface={}, class_prior=onehot.mean(axis=0))
    singles = [p for p in cue_proposals(guessed, min_precision=min_precision, min_fires=min_fires)
               if ws.relation_word(p.spec.view, p.spec.cues)]
    banks = [p for p in keyword_banks(guessed, singles, min_precision=min_precision)
             if ws.relation_word(p.spec.view, p.spec.cues)]
    scale = np.sqrt(len(ws.y) / n)  # priors grow with the square root of support: on dev's footing beside dev's cues
    for p in singles + banks:
        p.fired, p.held = ws.fires(p.spec, "dev"), judged
        p.prior *= scale
        p.note = MINED_ON_GUESSES
    return singles + banks


def conjunctions(ws: OfflineWorkspace, singles: list[Proposal], classes: np.ndarray,
                 min_precision: float, top: int = 12) -> list[Proposal]:
    """A cue plus a second, whole-text cue of the same class: higher precision for classes that need it."""
    out: list[Proposal] = []
    for label in classes:
        mine = [p for p in singles if p.label == label and p.spec.kind == "cue"]
        ranked = sorted(mine, key=lambda p: -p.prior)[:top]
        sentence_cues = [p for p in ranked if p.spec.view == "sentence"]
        for a in ranked:
            for b in sentence_cues:
                if b is a or set(b.spec.cues) & set(a.spec.cues):
                    continue
                fired = a.fired & b.fired
                if fired.sum() < 5:
                    continue
                prec = float(np.mean(ws.hit(label)[fired]))
                base = max(float(np.mean(ws.hit(label)[a.fired])), min_precision)
                if prec <= base + 0.05:
                    continue
                spec = replace(a.spec, also=b.spec.cues)
                correct = int(np.count_nonzero(fired & ws.hit(label)))
                prior = (prec - ws.class_prior[label]) * np.sqrt(correct)
                out.append(Proposal(spec, int(label), fired, prior=float(prior),
                                    note="a conjunction: both cues must appear"))
    return out


def refiner_proposals(ws: OfflineWorkspace, context: ProposalContext, min_precision: float,
                      reads_labels: bool | None = None) -> list[Proposal]:
    """Broader versions of precise, narrow pool members; each keeps its parent's id. `reads_labels` (see `broaden`):
    only the widenings that read dev's labels (True), only those that do not (False), or all (None). `ws` may be a
    workspace over half of dev (the proposer then judges what it finds on the other half)."""
    out: list[Proposal] = []
    for annotator in context.annotators:
        score = context.scores.get(annotator.id)
        if score is None or score.precision < PRECISE or score.coverage > NARROW_COVERAGE:
            continue
        spec = parse_spec(annotator.source)
        if spec is None or spec.label not in ws.task.labels:
            continue  # foreign code (LLM or human): nothing safe to widen mechanically
        label = ws.task.labels.index(spec.label)
        for wider, how in broaden(ws, spec, label, min_precision, reads_labels):
            fired = ws.fires(wider)
            if fired.sum() < 5:
                continue
            correct = int(np.count_nonzero(fired & ws.hit(label)))
            prec = correct / max(int(fired.sum()), 1)
            prior = (prec - ws.class_prior[label]) * np.sqrt(correct)
            out.append(Proposal(wider, label, fired, prior=float(prior), parent_ids=(annotator.id,),
                                note=f"refines {annotator.name or annotator.id}: {how}"))
    return out


def broaden(ws: OfflineWorkspace, spec: AnnotatorSpec, label: int, min_precision: float,
            reads_labels: bool | None = None) -> list[tuple[AnnotatorSpec, str]]:
    """Wider variants: drop conditions, widen the view, stem the cues, add words that keep the cues company in the
    unlabeled pool sample, add cues of the class mined on dev. Only the last reads dev's labels: `reads_labels=True`
    gives only those, False only the others, None all of them."""
    out: list[tuple[AnnotatorSpec, str]] = []
    if reads_labels is not True:
        out += _label_free_widenings(ws, spec)
    if reads_labels is not False and spec.kind != "surface":
        out += _added_cues(ws, spec, label, min_precision)
    return out


def _label_free_widenings(ws: OfflineWorkspace, spec: AnnotatorSpec) -> list[tuple[AnnotatorSpec, str]]:
    """Widenings that read no dev label: a looser threshold, fewer conditions, a wider view, word stems, words the
    cues keep company with in the pool sample."""
    out: list[tuple[AnnotatorSpec, str]] = []
    if spec.kind == "surface":
        grid = surface.threshold_grid(ws.dev_surface.get(spec.feature, np.array([spec.threshold])))
        looser = [t for t in grid if (t < spec.threshold if spec.op == ">=" else t > spec.threshold)]
        if looser:
            step = max(looser) if spec.op == ">=" else min(looser)
            out.append((replace(spec, threshold=step), "looser threshold"))
        return out
    if spec.also or spec.unless:
        out.append((replace(spec, also=(), unless=(), unless_view="sentence"), "dropped the extra conditions"))
    if spec.view == "near" and "between" in ws.dev.views:  # the next step out: any distance between the two
        out.append((replace(spec, view="between"), "between the two entity mentions at any distance, not only "
                    "when close"))
    if spec.view not in ("sentence", "lead") and "sentence" in ws.dev.views:
        out.append((replace(spec, view="sentence", also=(), unless=(), unless_view="sentence"),
                    f"anywhere in the text, not only {spec.view}"))
    stemmed = tuple(sorted({s for cue in spec.cues if "*" not in cue and " " not in cue for s in stems(cue)}
                           | {c for c in spec.cues}, key=lambda c: (len(c), c)))  # ties by name: not set order
    if stemmed != spec.cues and len(stemmed) <= 10:
        out.append((replace(spec, cues=dedupe_prefixes(stemmed)), "word stems instead of exact words"))
    company = cooccurring_words(ws, spec)
    if company:
        out.append((replace(spec, cues=spec.cues + company),
                    f"added words it keeps company with in the pool: {', '.join(company)}"))
    return out


def _added_cues(ws: OfflineWorkspace, spec: AnnotatorSpec, label: int,
                min_precision: float) -> list[tuple[AnnotatorSpec, str]]:
    """The spec with up to four more cues of its class in its view, mined on `ws`'s dev rows: each variant adds
    the next cue that is right on some row the spec misses."""
    out: list[tuple[AnnotatorSpec, str]] = []
    base = ws.fires(spec)
    extra = cue_proposals(ws, min_precision=max(min_precision, 0.5 * float(np.mean(ws.hit(label)[base])))
                          if base.any() else min_precision, per_class=15, classes=[label])
    added = [p for p in extra if p.spec.view == spec.view and not set(p.spec.cues) & set(spec.cues)]
    added.sort(key=lambda p: -p.prior)
    grown = list(spec.cues)
    fired = base.copy()
    for p in added[:8]:
        if np.count_nonzero(p.fired & ~fired & ws.hit(label)) >= 1 and len(grown) < len(spec.cues) + 4:
            grown += list(p.spec.cues)
            fired |= p.fired
            if len(grown) > len(spec.cues):
                how = f"added cues {', '.join(grown[len(spec.cues):])}"
                out.append((replace(spec, cues=tuple(grown)), how))
    return out


def cooccurring_words(ws: OfflineWorkspace, spec: AnnotatorSpec, limit: int = 3,
                      min_together: int = 3, min_share: float = 0.3) -> tuple[str, ...]:
    """Words of the same view that, in the unlabeled pool sample, mostly appear where the spec's cues do."""
    if ws.pool is None:
        return ()
    hits = ws.fires(spec, "pool")  # indexes the spec's view on the pool sample if nobody mines it
    if hits.sum() < min_together:
        return ()
    matrix = ws.pool.matrix[spec.view]
    together = np.asarray(matrix[hits].sum(axis=0)).ravel()
    total = np.asarray(matrix.sum(axis=0)).ravel()
    share = together / np.maximum(total, 1)
    cues = ws.pool.cues[spec.view]
    order = np.argsort(-(share * np.sqrt(together)))
    known = ws.pool.fires(spec.view, spec.cues)
    out: list[str] = []
    for j in order:
        if share[j] < min_share or len(out) >= limit:
            break
        word = cues[j]
        if together[j] < min_together or " " in word or len(word) < 3 or word.isdigit():
            continue
        if known[matrix[:, j].indices].all():  # the spec already fires wherever the word occurs
            continue
        out.append(word)
    return tuple(out)


