"""Dev probe for the offline proposer: a simplified evolve loop, in-process, on a WRENCH dataset.

Splits as `evopool` imports them (engine.ingest.importer: dev = a seeded stratified sample of valid.json, the
other valid rows join the unlabeled pool). Candidates are executed directly with `exec` (they are the
proposer's own generated code; production runs go through engine.sandbox.executor) and judged by the real
engine.gate.run_gate. The "shadow" split is the labeled valid rows left out of dev: a tuning signal that
never touches test. Test labels are read only for the final figure; the official number comes from
`evopool run` + `evopool eval`.

    .venv/bin/python bench/offline_probe.py chemprot trec --seed 0 -v
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.agents.base import ProposalContext  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.domain import ABSTAIN, AGENT_ROLES, Annotator, Example, Task  # noqa: E402
from engine.gate import GateConfig, run_gate  # noqa: E402
from engine.ingest.importer import IngestOptions, validate  # noqa: E402
from engine.ingest.readers import read_wrench  # noqa: E402
from engine.ingest.splits import assign_splits  # noqa: E402
from engine.metrics.score import (  # noqa: E402
    majority_vote,
    marginal_contributions,
    per_class_f1,
    pool_macro_f1,
    score_annotator,  # noqa: E402
)
from engine.sandbox.annotators import make_annotator  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def load(name: str, dev_size: int, seed: int) -> tuple[Task, dict[str, list[Example]]]:
    """The dataset split the way `evopool` imports it, plus the labeled "shadow" rows (valid minus dev)."""
    frame, labels = read_wrench(DATA / name)
    clean, labels, _ = validate(frame, IngestOptions(), labels)
    gold = dict(zip(clean["id"], clean["label"], strict=True))
    clean, _ = assign_splits(clean, dev_size, seed)
    task = Task(name=name, labels=labels, fields=tuple(sorted({k for f in clean["fields"] for k in f})))
    splits: dict[str, list[Example]] = {"pool": [], "dev": [], "test": [], "shadow": []}
    for row in clean.itertuples(index=False):
        label = None if row.split == "pool" or row.label is None else int(row.label)
        splits[row.split].append(Example(str(row.id), row.text, row.split, label, dict(row.fields)))
        if row.split == "pool" and str(row.id).startswith("valid-"):
            shadow = Example(str(row.id), row.text, "shadow", int(gold[row.id]), dict(row.fields))
            splits["shadow"].append(shadow)
    return task, splits


def run_votes(source: str, inputs: list[dict], labels: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """Execute annotator source on every input (own generated code; the product uses the sandbox)."""
    namespace: dict = {}
    exec(compile(source, "<annotator>", "exec"), namespace)  # noqa: S102
    annotate = namespace["annotate"]
    votes = np.full(len(inputs), ABSTAIN, dtype=np.int64)
    faults = 0
    for i, ex in enumerate(inputs):
        try:
            out = annotate(ex)
        except Exception:  # noqa: BLE001 - a crash is a counted fault, as in the sandbox
            faults += 1
            continue
        if out in labels:
            votes[i] = labels.index(out)
        elif out is not None:
            faults += 1
    return votes, faults


def matrix_of(pool: list[Annotator], rows: list[Example], labels: tuple[str, ...]) -> np.ndarray:
    inputs = [ex.as_input() for ex in rows]
    if not pool:
        return np.zeros((len(inputs), 0), dtype=np.int64)
    return np.column_stack([run_votes(a.source, inputs, labels)[0] for a in pool])


def evolve(task: Task, splits: dict[str, list[Example]],
           args: argparse.Namespace) -> tuple[list[Annotator], dict]:
    """The simplified loop: propose (3 roles) -> execute on dev -> score -> gate, `args.generations` times."""
    dev = tuple(splits["dev"])
    dev_inputs = [ex.as_input() for ex in dev]
    y_dev = np.array([ex.label for ex in dev], dtype=np.int64)
    proposer = OfflineProposer(max_candidates_per_role=args.per_role)
    pool: list[Annotator] = []
    votes: dict[str, np.ndarray] = {}
    scores: dict = {}
    seconds = 0.0
    for g in range(1, args.generations + 1):
        rng = np.random.default_rng(args.seed * 1_000_003 + g)  # as engine.evolve.build_context samples
        take = min(args.pool_sample, len(splits["pool"]))
        picked = sorted(rng.choice(len(splits["pool"]), take, replace=False))
        matrix = np.column_stack([votes[a.id] for a in pool]) if pool else np.zeros((len(dev), 0), np.int64)
        context = ProposalContext(task=task, dev=dev, pool_sample=tuple(splits["pool"][i] for i in picked),
                                  annotators=tuple(pool), scores={a.id: scores[a.id] for a in pool},
                                  dev_votes=matrix, generation=g, seed=args.seed)
        candidates, seen = [], {a.id for a in pool}
        for role in AGENT_ROLES:
            started = time.monotonic()
            proposals = proposer.propose(role, context)
            seconds += time.monotonic() - started
            for ann in (make_annotator(c, g) for c in proposals):
                if ann.id in seen:
                    continue
                seen.add(ann.id)
                votes[ann.id], faults = run_votes(ann.source, dev_inputs, task.labels)
                scores[ann.id] = score_annotator(ann.id, votes[ann.id], y_dev, faults)
                candidates.append((ann, votes[ann.id], scores[ann.id]))
        outcome = run_gate([a.id for a in pool], matrix, context.scores, candidates, y_dev, len(task.labels),
                           GateConfig())
        by_id = {a.id: a for a in pool} | {c[0].id: c[0] for c in candidates}
        pool = [by_id[i] for i in outcome.pool_ids]
        new = [by_id[d.annotator_id] for d in outcome.decisions
               if d.verdict == "accept" and d.annotator_id not in context.scores]
        print(f"gen {g}: candidates {len(candidates)} accepted {len(new)} pool {len(pool)} dev macro-F1 "
              f"{outcome.f1_before:.3f} -> {outcome.f1_after:.3f}{' (reverted)' if outcome.reverted else ''}")
        if args.verbose:
            for ann in new:
                print(f"   + [{ann.agent}] {ann.name}")
    return pool, {"scores": scores, "propose_seconds": seconds}


def report_shadow(task: Task, splits: dict[str, list[Example]], pool: list[Annotator], scores: dict,
                  verbose: bool) -> None:
    """Labeled valid rows outside dev: per-class F1, confusion and each member's precision there."""
    k = len(task.labels)
    y = np.array([ex.label for ex in splits["shadow"]], dtype=np.int64)
    matrix = matrix_of(pool, splits["shadow"], task.labels)
    print(f"shadow (valid minus dev, n={len(y)}): MV macro-F1 {pool_macro_f1(matrix, y, k):.3f}")
    if not verbose:
        return
    pred = majority_vote(matrix, k)
    f1 = per_class_f1(y, pred, k)
    shown = "  ".join(f"{lab} {f:.2f}" for lab, f in zip(task.labels, f1, strict=True))
    print(f"   shadow per-class F1: {shown}")
    confusion = np.zeros((k, k + 1), dtype=int)
    np.add.at(confusion, (y, np.where(pred < 0, k, pred)), 1)
    print("   shadow confusion (rows gold, last column = no vote):")
    for lab, row in zip(task.labels, confusion, strict=True):
        print(f"   {lab[:12]:>12s} " + " ".join(f"{c:4d}" for c in row))
    margins = marginal_contributions(matrix, y, k)
    for j, ann in enumerate(pool):
        dev_score, sh = scores[ann.id], score_annotator(ann.id, matrix[:, j], y)
        print(f"   dev {dev_score.precision:.2f}/{dev_score.fires:3d}  shadow {sh.precision:.2f}/"
              f"{sh.fires:3d} {margins[j]:+.3f}  [{ann.agent[:3]}] {ann.name}")


def probe(name: str, args: argparse.Namespace) -> dict[str, float]:
    started = time.monotonic()
    task, splits = load(name, args.dev_size, args.seed)
    if args.pool_order >= 0:  # another pool-row order: how much the result depends on the sampled rows
        order = np.random.default_rng(args.pool_order).permutation(len(splits["pool"]))
        splits["pool"] = [splits["pool"][i] for i in order]
    pool, info = evolve(task, splits, args)
    k = len(task.labels)
    sample = splits["pool"][:3000]
    covered = (matrix_of(pool, sample, task.labels) != ABSTAIN).any(axis=1) if pool else np.zeros(len(sample))
    print(f"unlabeled pool coverage (first {len(sample)} rows): {np.mean(covered):.3f}")
    if args.dump:
        Path(args.dump).write_text(json.dumps([{"id": a.id, "name": a.name, "agent": a.agent,
                                                 "source": a.source} for a in pool], indent=1))
    if splits["shadow"]:
        report_shadow(task, splits, pool, info["scores"], args.verbose)
    y_test = np.array([ex.label for ex in splits["test"]], dtype=np.int64)
    test = matrix_of(pool, splits["test"], task.labels)
    y_dev = np.array([ex.label for ex in splits["dev"]], dtype=np.int64)
    result = {
        "dev_macro_f1": pool_macro_f1(matrix_of(pool, splits["dev"], task.labels), y_dev, k),
        "test_macro_f1": pool_macro_f1(test, y_test, k),
        "test_coverage": float((test != ABSTAIN).any(axis=1).mean()) if pool else 0.0,
        "pool_size": len(pool),
        "propose_seconds": info["propose_seconds"],
        "seconds": time.monotonic() - started,
    }
    print(f"{name}: dev MV macro-F1 {result['dev_macro_f1']:.3f}  test MV macro-F1 "
          f"{result['test_macro_f1']:.3f}  test coverage {result['test_coverage']:.3f}  pool {len(pool)}"
          "  propose "
          f"{result['propose_seconds']:.1f}s  total {result['seconds']:.1f}s", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", default=["chemprot", "trec", "sms", "youtube", "semeval"])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="dev sample and evolve seed")
    parser.add_argument("--dev-size", type=int, default=500)
    parser.add_argument("--pool-sample", type=int, default=4000)
    parser.add_argument("--per-role", type=int, default=12)
    parser.add_argument("--pool-order", type=int, default=-1, help="shuffle pool rows with this seed first")
    parser.add_argument("--dump", default="", help="write the final pool (JSON) here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not DATA.exists():
        raise SystemExit(f"{DATA} is absent: the probe needs the WRENCH data in ../shared/data")
    for name in args.datasets:
        probe(name, args)


if __name__ == "__main__":
    main()
