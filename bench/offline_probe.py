"""Dev probe for the offline proposer: a simplified evolve loop, in-process, on a WRENCH dataset.

Splits as `evopool` imports them (engine.ingest: dev = a seeded stratified 500-row sample of valid.json,
the other valid rows join the unlabeled pool); candidates are executed directly with `exec` (they are our
own generated code; production runs go through engine.sandbox) and judged by engine.gate.run_gate.
Test labels are read only for the final figure. The official number comes from `evopool run`.

    .venv/bin/python bench/offline_probe.py chemprot --generations 5
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
from engine.agents.offline import OfflineProposer  # noqa: E402
from engine.code import make_annotator  # noqa: E402
from engine.gate import GateConfig, run_gate  # noqa: E402
from engine.ingest import IngestOptions, assign_splits, read_wrench, validate  # noqa: E402
from engine.score import majority_vote, marginal_contributions, per_class_f1, pool_macro_f1, score_annotator  # noqa: E402
from engine.types import ABSTAIN, AGENT_ROLES, Annotator, Example, Task  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def load(name: str, dev_size: int, seed: int) -> tuple[Task, dict[str, list[Example]]]:
    """The dataset split the way `evopool` imports it."""
    frame, labels = read_wrench(DATA / name)
    clean, labels, _ = validate(frame, IngestOptions(), labels)
    gold = dict(zip(clean["id"], clean["label"], strict=False))
    clean, _ = assign_splits(clean, dev_size, seed)
    fields = tuple(sorted({k for f in clean["fields"] for k in f}))
    task = Task(name=name, labels=labels, fields=fields)
    splits: dict[str, list[Example]] = {"pool": [], "dev": [], "test": [], "shadow": []}
    for row in clean.itertuples(index=False):
        label = None if row.split == "pool" or row.label is None else int(row.label)
        splits[row.split].append(Example(str(row.id), row.text, row.split, label, dict(row.fields)))
        if row.split == "pool" and str(row.id).startswith("valid-"):  # valid rows left out of dev
            splits["shadow"].append(Example(str(row.id), row.text, "shadow", int(gold[row.id]), dict(row.fields)))
    return task, splits


def run_votes(source: str, inputs: list[dict], labels: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """Execute annotator source on every input (our own code; the product uses the sandbox)."""
    namespace: dict = {}
    exec(compile(source, "<annotator>", "exec"), namespace)  # noqa: S102 - probe only, own generated code
    annotate = namespace["annotate"]
    votes = np.full(len(inputs), ABSTAIN, dtype=np.int64)
    faults = 0
    for i, ex in enumerate(inputs):
        try:
            out = annotate(ex)
        except Exception:  # noqa: BLE001 - a crash is a counted fault, as in the sandbox
            faults += 1
            continue
        if out is None:
            continue
        if out in labels:
            votes[i] = labels.index(out)
        else:
            faults += 1
    return votes, faults


def probe(name: str, generations: int, seed: int, dev_size: int, pool_sample: int, per_role: int,
          verbose: bool, dump: str = "", pool_order: int = -1) -> dict[str, float]:
    started = time.monotonic()
    task, splits = load(name, dev_size, seed)
    if pool_order >= 0:  # another pool-row order: how much the result depends on which rows are sampled
        order = np.random.default_rng(pool_order).permutation(len(splits["pool"]))
        splits["pool"] = [splits["pool"][i] for i in order]
    dev_inputs = [ex.as_input() for ex in splits["dev"]]
    y_dev = np.array([ex.label for ex in splits["dev"]], dtype=np.int64)
    k = len(task.labels)
    proposer = OfflineProposer(max_candidates_per_role=per_role)
    pool: list[Annotator] = []
    dev_votes: dict[str, np.ndarray] = {}
    scores = {}
    propose_seconds = 0.0
    for g in range(1, generations + 1):
        rng = np.random.default_rng(seed * 1_000_003 + g)
        take = min(pool_sample, len(splits["pool"]))
        sample = tuple(splits["pool"][i] for i in sorted(rng.choice(len(splits["pool"]), take, replace=False)))
        matrix = np.column_stack([dev_votes[a.id] for a in pool]) if pool else np.zeros((len(y_dev), 0), int)
        context = ProposalContext(task=task, dev=tuple(splits["dev"]), pool_sample=sample,
                                  annotators=tuple(pool), scores={a.id: scores[a.id] for a in pool},
                                  dev_votes=matrix, generation=g, seed=seed)
        candidates = []
        seen = {a.id for a in pool}
        for role in AGENT_ROLES:
            t0 = time.monotonic()
            proposals = proposer.propose(role, context)
            propose_seconds += time.monotonic() - t0
            for cand in proposals:
                ann = make_annotator(cand, g)
                if ann.id in seen:
                    continue
                seen.add(ann.id)
                votes, faults = run_votes(ann.source, dev_inputs, task.labels)
                dev_votes[ann.id] = votes
                score = score_annotator(ann.id, votes, y_dev, faults)
                scores[ann.id] = score
                candidates.append((ann, votes, score))
        outcome = run_gate([a.id for a in pool], matrix, context.scores, candidates, y_dev, k, GateConfig())
        by_id = {a.id: a for a in pool} | {c[0].id: c[0] for c in candidates}
        pool = [by_id[i] for i in outcome.pool_ids]
        accepted = sum(d.verdict == "accept" and d.annotator_id not in context.scores for d in outcome.decisions)
        print(f"gen {g}: candidates {len(candidates)} accepted {accepted} pool {len(pool)} "
              f"dev macro-F1 {outcome.f1_before:.3f} -> {outcome.f1_after:.3f}"
              f"{' (reverted)' if outcome.reverted else ''}", flush=True)
        if verbose:
            for d in outcome.decisions:
                if d.verdict == "accept" and d.annotator_id not in context.scores:
                    print(f"   + [{by_id[d.annotator_id].agent}] {by_id[d.annotator_id].name}")
    pool_rows = [ex.as_input() for ex in splits["pool"][:3000]]
    pool_cov = np.zeros(len(pool_rows), dtype=bool)
    for a in pool:
        pool_cov |= run_votes(a.source, pool_rows, task.labels)[0] != ABSTAIN
    print(f"unlabeled pool coverage (first {len(pool_rows)} rows): {pool_cov.mean():.3f}")
    if verbose and pool_rows:
        for i in np.flatnonzero(~pool_cov)[:15]:
            print("   uncovered:", pool_rows[i]["text"][:150])
    if dump:
        Path(dump).write_text(json.dumps([{"id": a.id, "name": a.name, "agent": a.agent, "source": a.source}
                                          for a in pool], indent=1))
    if splits["shadow"]:  # labeled valid rows outside dev: for tuning the proposer without touching test
        sh_inputs = [ex.as_input() for ex in splits["shadow"]]
        y_sh = np.array([ex.label for ex in splits["shadow"]], dtype=np.int64)
        sh_votes = [run_votes(a.source, sh_inputs, task.labels)[0] for a in pool]
        sh_matrix = np.column_stack(sh_votes) if pool else np.zeros((len(y_sh), 0), int)
        print(f"shadow (valid minus dev, n={len(y_sh)}): MV macro-F1 {pool_macro_f1(sh_matrix, y_sh, k):.3f}")
        if verbose:
            per_class = per_class_f1(y_sh, majority_vote(sh_matrix, k), k)
            print("   shadow per-class F1: " + "  ".join(f"{lab} {f:.2f}" for lab, f in zip(task.labels, per_class, strict=False)))
            pred = majority_vote(sh_matrix, k)
            confusion = np.zeros((k, k + 1), dtype=int)
            np.add.at(confusion, (y_sh, np.where(pred < 0, k, pred)), 1)
            print("   shadow confusion (rows gold, last column = no vote):")
            for lab, row in zip(task.labels, confusion, strict=False):
                print(f"   {lab[:12]:>12s} " + " ".join(f"{c:4d}" for c in row))
            margins = marginal_contributions(sh_matrix, y_sh, k)
            for a, v, m in zip(pool, sh_votes, margins, strict=False):
                sc, ss = scores[a.id], score_annotator(a.id, v, y_sh)
                print(f"   dev {sc.precision:.2f}/{sc.fires:3d}  shadow {ss.precision:.2f}/{ss.fires:3d} {m:+.3f}  "
                      f"[{a.agent[:3]}] {a.name}")
    test_inputs = [ex.as_input() for ex in splits["test"]]
    y_test = np.array([ex.label for ex in splits["test"]], dtype=np.int64)
    test_matrix = np.column_stack([run_votes(a.source, test_inputs, task.labels)[0] for a in pool]) \
        if pool else np.zeros((len(y_test), 0), int)
    dev_matrix = np.column_stack([dev_votes[a.id] for a in pool]) if pool else np.zeros((len(y_dev), 0), int)
    if verbose:
        per_class = per_class_f1(y_test, majority_vote(test_matrix, k), k)
        print("test per-class F1: " + "  ".join(f"{lab} {f:.2f}" for lab, f in zip(task.labels, per_class, strict=False)))
    result = {
        "dev_macro_f1": pool_macro_f1(dev_matrix, y_dev, k),
        "test_macro_f1": pool_macro_f1(test_matrix, y_test, k),
        "test_coverage": float((test_matrix != ABSTAIN).any(axis=1).mean()) if pool else 0.0,
        "pool_size": len(pool),
        "propose_seconds": propose_seconds,
        "seconds": time.monotonic() - started,
    }
    print(f"{name}: dev MV macro-F1 {result['dev_macro_f1']:.3f}  test MV macro-F1 {result['test_macro_f1']:.3f}  "
          f"test coverage {result['test_coverage']:.3f}  pool {len(pool)}  propose {propose_seconds:.1f}s  "
          f"total {result['seconds']:.1f}s", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", default=["chemprot", "trec", "sms", "youtube", "semeval"])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dev-size", type=int, default=500)
    parser.add_argument("--pool-sample", type=int, default=4000)
    parser.add_argument("--per-role", type=int, default=12)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--dump", default="", help="write the final pool (JSON) here")
    parser.add_argument("--pool-order", type=int, default=-1, help="shuffle pool rows with this seed first")
    args = parser.parse_args(argv)
    for name in args.datasets:
        probe(name, args.generations, args.seed, args.dev_size, args.pool_sample, args.per_role, args.verbose,
              args.dump, args.pool_order)


if __name__ == "__main__":
    main()
