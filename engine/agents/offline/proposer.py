"""The offline proposer: generator, improver and refiner as program synthesis from data, no LLM needed.

generator: mines cue words / phrases / keyword banks / surface thresholds per class from dev.
improver:  mines the unlabeled pool sample against a dev-fitted classifier's guesses (dev then judges each cue on rows
           that did not choose it) and seeds its weak classes' names; without guesses, mines the dev rows the pool
           gets wrong, leaves uncovered or disputes, favouring weak classes.
refiner:   widens precise but narrow pool members (more cues, a wider view, fewer conditions); the cues it adds are
           mined on one half of dev and judged on the other, like the generator's.
Every role previews the gate in-process (selection.py) and sends only candidates likely to pass.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from engine.agents.base import ProposalContext
from engine.agents.feedback import rejected_specs, repeats_rejected
from engine.agents.offline import roles
from engine.agents.offline.candidates import OfflineWorkspace, build_workspace
from engine.agents.offline.selection import Proposal, SelectConfig, greedy_select, halves, vote_counts
from engine.domain import ABSTAIN, AGENT_ROLES, Candidate, code_hash
from engine.pseudo_labels import MINED_ON_GUESSES
from engine.specs.templates import AnnotatorSpec, parse_spec, render
from engine.text_views import mined_views

ROLE_OFFSET = {"generator": 0, "improver": 7919, "refiner": 15881}
MIN_PRECISION = {"generator": 0.30, "improver": 0.25, "refiner": 0.25}  # the gate's floors per role


# dev rows below which the generator mines all of dev (the preview's halves need 20; a half of 20 rows mines little)
CROSS_FIT_ROWS = 40
# fitness rows below which the improver's guesses come from a classifier fitted on all of them, not refitted per half:
# SemEval's 178 rows in halves of 89 guessed so badly that its pool's MV on the pool rows' withheld gold fell, where
# ChemProt's 400 rose (scratch runs of bench/cross_fit.py's evolution, not a recorded bench)
GUESS_HALVES_ROWS = 300


class OfflineProposer:
    """Proposes annotators mined from the dev split and the unlabeled pool sample; deterministic per seed."""

    name = "offline"

    def __init__(self, max_candidates_per_role: int = 12, pool_rows: int = 4000, min_fires: int = 5,
                 select: SelectConfig | None = None):
        self.max_candidates_per_role = max_candidates_per_role
        self.pool_rows = pool_rows  # pool-sample rows read for word statistics and coverage
        self.select = select or SelectConfig()
        self.min_fires = min_fires
        self._cache: dict[tuple, OfflineWorkspace] = {}
        self._halves: dict[tuple, OfflineWorkspace] = {}  # dev rows -> a workspace over them, built from...
        self._halves_of: OfflineWorkspace | None = None  # ... this workspace of the whole dev

    def propose(self, role: str, context: ProposalContext) -> list[Candidate]:
        if role not in AGENT_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {AGENT_ROLES}")
        if not context.dev or not context.task.labels:
            return []
        rng = np.random.default_rng(context.seed + context.generation + ROLE_OFFSET[role])
        ws = self._workspace(context)
        config = replace(self.select, min_fires=self.min_fires, min_precision=MIN_PRECISION[role],
                         max_picks=self.max_candidates_per_role)
        if role == "refiner":  # a widened member earns its place by reach more than by dev gain
            config = replace(config, min_gain=config.min_gain * config.refiner_gain_share,
                             min_reach=config.min_reach / 2)
        halved = (config.cross_fit and config.mine_halves and context.dev_label_sets is None
                  and len(ws.y) >= CROSS_FIT_ROWS)
        floor = config.min_precision
        if role == "generator" and halved:
            proposals = self._cross_fitted(ws, context, lambda sub, rows: roles.generator_proposals(sub, rng, floor))
        elif role == "generator":
            proposals = roles.generator_proposals(ws, rng, floor)
        elif role == "improver":
            # on the pool sample's guessed labels where there are some (dev's failing rows are few and the cues fitted
            # to them look best on them; on halves of dev it had half of those: tried, not benchmarked, worse)
            on_pool = (config.improve_on_pool and context.pseudo is not None and ws.pool is not None
                       and ws.pool.n_rows > 0 and context.dev_label_sets is None)
            proposals = roles.improver_proposals(ws, context, rng, config.min_precision, mine_dev=not on_pool)
            if on_pool:
                proposals = _once(proposals + self._guessed(ws, context, config.min_precision, halved))
        else:
            proposals = self._refined(ws, context, floor, halved)
        known = {a.id for a in context.annotators} | set(context.excluded_ids)  # pool members, human-rejected
        proposals = [p for p in proposals if _spec_hash(p.spec) not in known]
        rejected = rejected_specs(context.feedback)  # the expert said no to these ideas, in any wording
        proposals = [p for p in proposals if not repeats_rejected(p.spec, rejected)]
        votes = _valid_votes(context)
        base = vote_counts(votes, ws.n_classes, len(ws.y))
        taken = [votes[:, j] != ABSTAIN for j in range(votes.shape[1])]
        gold = ws.y if context.dev_label_sets is None else ws.onehot  # score picks as the gate will
        pseudo = context.pseudo if context.pseudo is not None and ws.pool is not None else None
        evidence = None
        if pseudo is not None and pseudo.trusted:
            def evidence(p: Proposal) -> tuple[float, float]:
                if p.note == MINED_ON_GUESSES:  # chosen to agree with the guesses: their agreement says nothing
                    return 0.0, 0.0
                if p.pool_fired is None:
                    p.pool_fired = ws.fires(p.spec, "pool")
                return pseudo.evidence(p.pool_fired, p.label)
        picks = greedy_select(proposals, gold, ws.n_classes, base, taken, config,
                              pool_covered=_pool_coverage(ws, context),
                              pool_mask_of=lambda p: ws.fires(p.spec, "pool"), pool_evidence=evidence)
        return [_candidate(p, role) for p in picks]

    def _cross_fitted(self, ws: OfflineWorkspace, context: ProposalContext,
                      mine: Callable[[OfflineWorkspace, np.ndarray], list[Proposal]]) -> list[Proposal]:
        """A role's proposals mined on each half of dev (the halves the preview's gain is checked on; `mine(sub,
        rows)` mines a workspace over those dev rows), each then fired on all of dev and judged on the other half
        (`Proposal.held`); a mined cue fired at least `min_fires` times on its half and must fire half as often on
        the other. Seeded cues (not mined) are judged on all of dev. A spec found twice is kept once: seeded if it was
        ever seeded (a label's word the miner also found is no scan's luck), else as the first half found it."""
        def judged(mined_on: np.ndarray, held: np.ndarray) -> list[Proposal]:
            out = mine(self._half(ws, context, mined_on), mined_on)
            for p in out:
                p.fired = ws.fires(p.spec, "dev")
                if p.mined:
                    p.held = held
            return out

        return _over_halves(ws.y, judged)

    def _refined(self, ws: OfflineWorkspace, context: ProposalContext, floor: float, halved: bool) -> list[Proposal]:
        """The refiner's widenings. Halved: the cues it adds to a member are read off dev's labels like the generator's,
        so they are mined on one half and judged on the other (`_cross_fitted`; with
        `SelectConfig.refiner_judged_outside_member`, on that half's rows the member does not fire on); its other
        widenings read no label and all of dev judges them."""
        if not halved:
            return roles.refiner_proposals(ws, context, floor)
        free = roles.refiner_proposals(ws, context, floor, reads_labels=False)
        added = self._cross_fitted(
            ws, context, lambda sub, rows: roles.refiner_proposals(sub, context, floor, reads_labels=True))
        if self.select.refiner_judged_outside_member:
            specs = {a.id: parse_spec(a.source) for a in context.annotators}
            fires: dict[str, np.ndarray] = {}
            for p in added:
                member = p.parent_ids[0] if p.parent_ids else None
                spec = specs.get(member) if member is not None else None
                if p.held is None or member is None or spec is None:
                    continue
                if member not in fires:
                    fires[member] = ws.fires(spec)
                p.held = p.held & ~fires[member]  # a new mask: a half's proposals share theirs
                p.held_outside_member = True
        return _once(free + added)

    def _guessed(self, ws: OfflineWorkspace, context: ProposalContext, floor: float, halved: bool) -> list[Proposal]:
        """The improver's cues mined on the pool sample's guessed labels. Halved (with GUESS_HALVES_ROWS fitness rows):
        guessed by the classifier refitted on each half of dev and judged on the other half (a classifier fitted on
        dev rows has learned them, and a cue read off its guesses would look better on them than elsewhere); else
        fitted on all of dev and judged there like a cue mined on dev (5 fires, z 1.5). A spec found twice is kept as
        the first half found it."""
        pseudo = context.pseudo
        assert pseudo is not None  # called only with the pool sample's guesses (on_pool)
        same_rows = pseudo.dev_ids == tuple(ex.id for ex in context.dev)
        if not halved or len(ws.y) < GUESS_HALVES_ROWS or pseudo.dev_y is None or not same_rows:
            return roles.guessed_label_proposals(ws, pseudo.guess, floor, None)
        return _over_halves(ws.y, lambda mined_on, held: roles.guessed_label_proposals(
            ws, pseudo.guess_from(mined_on), floor, held))

    def _half(self, ws: OfflineWorkspace, context: ProposalContext, rows: np.ndarray) -> OfflineWorkspace:
        """A workspace over some dev rows only, sharing `ws`'s pool sample (cached like `_workspace`)."""
        if self._halves_of is not ws:  # a new dev or pool sample: the old halves go
            self._halves_of, self._halves = ws, {}
        key = tuple(rows.tolist())
        if key not in self._halves:
            sub = build_workspace(context.task, [context.dev[i].as_input() for i in rows], ws.y[rows], [],
                                  ws.views)
            sub.pool, sub.pool_raw = ws.pool, ws.pool_raw
            self._halves[key] = sub
        return self._halves[key]

    def _workspace(self, context: ProposalContext) -> OfflineWorkspace:
        """Index dev and the pool sample once per distinct context data (roles share it)."""
        # the descriptions too: an expert may describe a label between two generations of one run (label seeds)
        # and the labels: a row the expert labeled, took back and labeled again keeps its id but not its class
        sets = None if context.dev_label_sets is None else np.asarray(context.dev_label_sets).tobytes()
        key = (context.task.name, context.task.labels, tuple(sorted(context.task.label_descriptions.items())),
               tuple(ex.id for ex in context.dev), np.asarray(context.dev_labels).tobytes(), sets,
               tuple(ex.id for ex in context.pool_sample[: self.pool_rows]))
        if key not in self._cache:
            dev_inputs = [ex.as_input() for ex in context.dev]
            fields = _fields(context)
            views = mined_views(fields, dev_inputs)
            pool_inputs = [ex.as_input() for ex in context.pool_sample[: self.pool_rows]]
            workspace = build_workspace(context.task, dev_inputs, context.dev_labels, pool_inputs, views,
                                        context.dev_label_sets)
            self._cache = {key: workspace}
        return self._cache[key]


def _over_halves(y: np.ndarray, judged: Callable[[np.ndarray, np.ndarray], list[Proposal]]) -> list[Proposal]:
    """`judged(mined_on, held)` for each half of dev (`halves`: the ones the preview checks a pick's gain on), `held`
    the (n_dev,) mask of the other half, one per half and shared by its proposals (read only); the proposals of both,
    each spec once (`_once`)."""
    first, second = halves(y)
    out: list[Proposal] = []
    for mined_on, judged_on in ((first, second), (second, first)):
        held = np.zeros(len(y), dtype=bool)
        held[judged_on] = True
        out += judged(mined_on, held)
    return _once(out)


def _once(proposals: list[Proposal]) -> list[Proposal]:
    """Each spec once, in first-found order: as seeded if it was ever seeded (a label's word a miner also found is no
    scan's luck), else as first found."""
    kept: dict[str, Proposal] = {}
    for p in proposals:
        key = _spec_hash(p.spec)  # the rendered code's id, cached: rendering each proposal again cost ~1 ms
        if key not in kept or (kept[key].mined and not p.mined):
            kept[key] = p
    return list(kept.values())


def _pool_coverage(ws: OfflineWorkspace, context: ProposalContext) -> np.ndarray | None:
    """Pool-sample rows on which some pool member (one whose code we can read back) votes."""
    if ws.pool is None:
        return None
    covered = np.zeros(ws.pool.n_rows, dtype=bool)
    for annotator in context.annotators:
        spec = parse_spec(annotator.source)
        if spec is not None:
            covered |= ws.fires(spec, "pool")
    return covered


def _fields(context: ProposalContext) -> tuple[str, ...]:
    """The task's extra fields, or those the dev rows actually carry when the task does not list them."""
    if context.task.fields:
        return tuple(context.task.fields)
    return tuple(context.dev[0].fields) if context.dev else ()


def _valid_votes(context: ProposalContext) -> np.ndarray:
    votes = np.asarray(context.dev_votes, dtype=np.int64)
    if votes.ndim != 2 or votes.shape[0] != len(context.dev):
        return np.zeros((len(context.dev), 0), dtype=np.int64)
    return votes


def _hash(source: str) -> str:
    return code_hash(ast.unparse(ast.parse(source)) + "\n")


def _spec_hash(spec: AnnotatorSpec) -> str:
    """The id a spec's rendered code gets; the same specs come back every generation (banking77: 14,000 proposals
    in five generations, rendered and parsed again at ~1 ms each). The threshold's repr joins the key: 0.0 and -0.0
    are equal specs that render differently."""
    return _rendered_hash(spec, repr(spec.threshold))


@functools.lru_cache(maxsize=1 << 16)
def _rendered_hash(spec: AnnotatorSpec, threshold: str) -> str:
    return _hash(render(spec))


def _candidate(p: Proposal, role: str) -> Candidate:
    stats = p.stats
    dev_precision = stats.get("dev_precision", stats.get("precision", 0))
    where = "dev" if p.held is None else "the half of dev it was not mined on"
    judged = f"the rows of {where}"
    if p.held_outside_member:
        where = "the half of dev its added cues were not mined on, outside the rows its member fires on,"
        judged = "the rows of the half of dev its added cues were not mined on that its member does not fire on"
    rationale = (
        f"{role}: {p.spec.describe()}. On {where} it fires on {int(stats.get('fires', 0))} rows with precision "
        f"{dev_precision:.2f}; in the agent's own preview (the pool with its earlier picks of this call) it moved "
        f"the pool's macro-F1 there by {stats.get('gain', 0):+.3f}; the gate weighs it beside every candidate of the "
        "generation" + (" (on all of dev: a seeded cue needs no cross-fit)." if not p.mined else ".")
    )
    if "pool_precision" in stats:
        rationale += (f" On the unlabeled sample, a text classifier fitted on dev puts its precision near "
                      f"{stats['pool_precision']:.2f} (worth {stats['pool_weight']:.0f} dev rows), "
                      f"{stats['precision']:.2f} with {judged} pooled in.")
    if p.note:
        rationale += f" ({p.note})"
    return Candidate(source=render(p.spec), agent=role, name=p.spec.title(), parent_ids=p.parent_ids,
                     rationale=rationale, mined_on_guesses=p.note == MINED_ON_GUESSES)
