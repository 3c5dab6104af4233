"""A simulated expert: what an hour of labeling buys, row choice by row choice.

For each dataset of ../shared/data and seed: import with a small dev (`--dev`, 100 rows), evolve `--generations`
with the offline agents (once, then copied for each strategy), and score `auto` on test. Then in rounds of `--batch`
rows: `suggest` the rows to label (the studio's queue, the text model's least sure rows, or random rows), answer
them from the gold labels the bench holds back from the workspace (the WRENCH train labels of the pool rows, never
dev or test), `teach` them into dev, run one more generation, and score `auto` on test again. Test labels are read
only to score. The table gives test macro-F1 after each budget of labels, per strategy; `--plot` draws the curves.

    python bench/expert_loop.py [--datasets youtube sms] [--seeds 0 1 2] [--budgets 25 50 100]
                                [--out bench/results/expert_loop.md] [--plot docs/expert_loop.png]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, commit, machine  # noqa: E402
from bench.quality import import_banking77, load_embedding_cache, save_embedding_cache  # noqa: E402
from bench.student_validation import pool_gold  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.evolve import EvolveConfig, evolve  # noqa: E402
from engine.expert.queue import STRATEGIES, suggest_rows, teach  # noqa: E402
from engine.ingest.importer import IngestOptions, import_path  # noqa: E402
from engine.labeling.evaluate import evaluate  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

WHO = "simulated expert"


def evolved_base(workdir: Path, name: str, seed: int, dev: int, generations: int) -> Path:
    """The dataset imported with a `dev`-row dev split and evolved: the start every strategy copies."""
    base = workdir / f"{name}-s{seed}-d{dev}"
    if (base / "done").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    store = Store.open(base)
    if name == "banking77":
        import_banking77(store, SHARED / name, dev, seed, IngestOptions.audit_fraction)
    else:
        import_path(store, SHARED / name, IngestOptions(dev_size=dev, seed=seed))
    load_embedding_cache(store, workdir / f"embeddings-{name}.npz")
    with CompiledExecutor() as executor:
        evolve(store, OfflineProposer(), executor, generations, EvolveConfig(seed=seed))
    save_embedding_cache(store, workdir / f"embeddings-{name}.npz")
    Store.close_all()
    (base / "done").touch()
    return base


def run(workdir: Path, name: str, seed: int, strategy: str, dev: int, generations: int, budgets: list[int],
        batch: int) -> dict:
    base = evolved_base(workdir, name, seed, dev, generations)
    here = workdir / f"{name}-s{seed}-d{dev}-{strategy}"
    shutil.rmtree(here, ignore_errors=True)
    shutil.copytree(base, here, ignore=shutil.ignore_patterns("done"))
    store = Store.open(here)
    labels = store.load_task().labels
    row: dict = {"dataset": name, "seed": seed, "strategy": strategy, "dev": store.count_examples("dev")}
    started = time.monotonic()
    with CompiledExecutor() as executor:
        def score(at: int) -> None:
            result = evaluate(store, executor, "test", "auto", seed)
            row[f"f1@{at}"], row[f"estimate@{at}"] = result["macro_f1"], result.get("estimate")

        score(0)
        taught = 0
        for budget in budgets:
            while taught < budget:
                picked = suggest_rows(store, executor, min(batch, budget - taught), strategy, seed + taught)
                if not picked:
                    break
                gold = pool_gold(name, np.array([s.id for s in picked]), labels)
                teach(store, executor, {s.id: labels[g] for s, g in zip(picked, gold, strict=True)}, WHO,
                      f"{strategy} round")
                taught += len(picked)
                evolve(store, OfflineProposer(), executor, store.last_complete_generation() + 1,
                       EvolveConfig(seed=seed))
            score(budget)
    row["seconds"] = round(time.monotonic() - started, 1)
    Store.close_all()
    return row


def table(rows: list[dict], budgets: list[int]) -> str:
    head = ["dataset", "strategy", "seeds", "test macro-F1 at 0", *[f"at {b}" for b in budgets],
            f"gain at {budgets[-1]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = dict.fromkeys((r["dataset"], r["strategy"]) for r in rows)
    for name, strategy in keys:
        mine = [r for r in rows if (r["dataset"], r["strategy"]) == (name, strategy)]
        cells = [name, strategy, ",".join(str(r["seed"]) for r in mine)]
        for at in [0, *budgets]:
            values = [r.get(f"f1@{at}") for r in mine if r.get(f"f1@{at}") is not None]
            cells.append(f"{np.mean(values):.3f}" if values else "–")
        gains = [r[f"f1@{budgets[-1]}"] - r["f1@0"] for r in mine if r.get(f"f1@{budgets[-1]}") is not None]
        cells.append(f"{np.mean(gains):+.3f}" if gains else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], budgets: list[int], path: Path) -> None:
    from plotly.subplots import make_subplots

    names = list(dict.fromkeys(r["dataset"] for r in rows))
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names)
    colors = {"queue": "#1b7f5b", "uncertainty": "#c77c02", "random": "#7a7a7a"}
    for col, name in enumerate(names, start=1):
        for strategy in STRATEGIES:
            mine = [r for r in rows if r["dataset"] == name and r["strategy"] == strategy]
            if not mine:
                continue
            xs = [0, *budgets]
            ys = [np.mean([r[f"f1@{x}"] for r in mine if r.get(f"f1@{x}") is not None]) for x in xs]
            fig.add_scatter(x=xs, y=ys, name=strategy, legendgroup=strategy, showlegend=col == 1, row=1, col=col,
                            line={"color": colors[strategy]}, mode="lines+markers")
    fig.update_layout(title="Test macro-F1 of auto after each budget of simulated expert labels", height=380,
                      width=360 * len(names) + 120)
    fig.update_xaxes(title="labels")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".png":
        fig.write_html(str(path), include_plotlyjs="cdn")
        return
    # a picture without kaleido: the figure's page (plotly.js inline) shot by the headless Chromium the e2e test uses
    from playwright.sync_api import sync_playwright

    page_file = path.with_suffix(".tmp.html")
    fig.write_html(str(page_file), include_plotlyjs=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": int(fig.layout.width), "height": int(fig.layout.height)})
            page.goto(page_file.resolve().as_uri())
            page.wait_for_selector(".main-svg")
            page.screenshot(path=str(path))
            browser.close()
    finally:
        page_file.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=["youtube", "sms", "trec", "semeval", "chemprot",
                                                          "banking77"])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES))
    parser.add_argument("--dev", type=int, default=100, help="dev rows to start from")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="*", default=[25, 50, 100, 200])
    parser.add_argument("--batch", type=int, default=25, help="rows labeled per round (then one generation)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp" / "expert_loop")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "expert_loop.md")
    parser.add_argument("--plot", type=Path, default=None,
                        help="the curves as .png (drawn in headless Chromium) or .html")
    parser.add_argument("--replot", type=Path, default=None, help="draw --plot from this .json of an earlier run")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.budgets, args.plot)
        return
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    at_commit, rows = commit(), []
    for name in args.datasets:
        for seed in args.seeds:
            for strategy in args.strategies:
                print(f"== {name} seed {seed} {strategy}", file=sys.stderr, flush=True)
                rows.append(run(args.workdir, name, seed, strategy, args.dev, args.generations, args.budgets,
                                args.batch) | {"commit": at_commit})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                text = (f"Measured at commit {at_commit} on {machine()} with `python bench/expert_loop.py --datasets "
                        f"{' '.join(args.datasets)} --seeds {' '.join(map(str, args.seeds))} --dev {args.dev} "
                        f"--budgets {' '.join(map(str, args.budgets))}` ({args.generations} generations first, one "
                        f"more after each round of {args.batch} labels; `auto` on test).\n\n"
                        + table(rows, args.budgets) + "\n")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(text)
                args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.budgets, args.plot)
    print(text)


if __name__ == "__main__":
    main()
