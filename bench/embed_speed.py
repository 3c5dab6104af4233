"""Embedding speed and quality, per embedder option, on real data (ChemProt and TREC by default).

For each dataset: a stratified sample of dev rows (valid.json, 500) plus every test row is embedded by
each option. Speed is that encode's sentences per wall second and per process-CPU second (the second
is steadier on a shared machine). Quality, dev-only: logistic regression (C picked by 5-fold CV on the
dev sample) fitted on the dev embeddings, scored once on test (macro-F1); test labels are read only
to score. Agreement with the float32 MiniLM: mean cosine of the two vectors of each text (same space
only) and the Spearman correlation of cosine similarities over 20,000 random text pairs (any space).
The static table's one-off distillation is timed into a fresh cache dir.

    python bench/embed_speed.py [--datasets chemprot trec] [--options st-encode minilm static ...]
                                [--out bench/results/embed_speed.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.embed.base import Embedder, normalise_rows  # noqa: E402
from engine.embed.minilm import MiniLMEmbedder, load_model  # noqa: E402
from engine.embed.registry import get_embedder  # noqa: E402
from engine.embed.static import StaticEmbedder, load_table  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


class STEncode:
    """Baseline: sentence-transformers' own `encode` (sorts by characters, batch 32, float32)."""

    name, dim = "st-encode", 384

    def encode(self, texts, on_progress=None):  # noqa: ANN001, ANN201
        return load_model("fp32").encode(list(texts), batch_size=32, normalize_embeddings=True)


OPTIONS: dict[str, Callable[[], Embedder]] = {
    "st-encode": STEncode,
    "minilm": lambda: get_embedder("minilm"),
    "minilm-bs16": lambda: MiniLMEmbedder(batch_size=16),
    "minilm-bs64": lambda: MiniLMEmbedder(batch_size=64),
    "minilm-1thread": lambda: MiniLMEmbedder(num_threads=1),
    "minilm-allthreads": lambda: MiniLMEmbedder(num_threads=torch.get_num_threads()),
    "minilm-bf16": lambda: get_embedder("minilm-bf16"),
    "minilm-int8": lambda: get_embedder("minilm-int8"),
    "static": lambda: get_embedder("static"),
    "static-384-nosif": lambda: StaticEmbedder(dim=384, sif=0.0),
    "static-256-nosif": lambda: StaticEmbedder(dim=256, sif=0.0),
    "static-128": lambda: StaticEmbedder(dim=128),
    "static-256-sif1e-4": lambda: StaticEmbedder(dim=256, sif=1e-4),
}
DEFAULT_OPTIONS = ("st-encode", "minilm-allthreads", "minilm-1thread", "minilm", "minilm-bf16", "minilm-int8",
                   "static")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"nproc {os.cpu_count()}, {cpu}"


def load_split(folder: Path, split: str) -> tuple[list[str], np.ndarray]:
    rows = json.loads((folder / f"{split}.json").read_text()).values()
    return [r["data"]["text"] for r in rows], np.array([r["label"] for r in rows])


def stratified_sample(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n row indices with class proportions as in y (every class keeps at least one row)."""
    if n >= len(y):
        return np.arange(len(y))
    classes, counts = np.unique(y, return_counts=True)
    take = np.maximum(1, np.floor(counts / counts.sum() * n).astype(int))
    for i in np.argsort(-(counts / counts.sum() * n - take))[: max(0, n - take.sum())]:
        take[i] += 1
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), k, replace=False)
                                   for c, k in zip(classes, take, strict=True)]))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_encode(embedder: Embedder, texts: list[str]) -> tuple[np.ndarray, float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    vectors = embedder.encode(texts)
    return vectors, time.perf_counter() - wall, cpu_seconds() - cpu


def dev_only_f1(x_dev: np.ndarray, y_dev: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.metrics import f1_score
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    folds = max(2, min(5, int(np.unique(y_dev, return_counts=True)[1].min())))
    clf = LogisticRegressionCV(Cs=[0.3, 1, 3, 10, 30, 100], scoring="f1_macro", max_iter=3000,
                               cv=StratifiedKFold(folds, shuffle=True, random_state=0))
    with warnings.catch_warnings(), threadpool_limits(1):  # one BLAS thread: no fight with torch's threads
        warnings.simplefilter("ignore")
        clf.fit(x_dev, y_dev)
        return float(f1_score(y_test, clf.predict(x_test), average="macro", zero_division=0))


def agreement(vectors: np.ndarray, reference: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    from scipy.stats import spearmanr

    cos = float(np.mean(np.sum(vectors * reference, axis=1))) if vectors.shape == reference.shape else np.nan
    i, j = rng.integers(0, len(vectors), (2, 20_000))
    keep = i != j
    a = np.sum(vectors[i[keep]] * vectors[j[keep]], axis=1)
    b = np.sum(reference[i[keep]] * reference[j[keep]], axis=1)
    return cos, float(spearmanr(a, b).statistic)


def time_distillation() -> float:
    """Seconds to distil the default static table from scratch (into a throwaway cache dir)."""
    from engine.embed import static as embed_static

    default = StaticEmbedder()
    before = os.environ.get("EVOPOOL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EVOPOOL_CACHE_DIR"] = tmp
        embed_static._tables.pop((default.dim, default.sif, default.vocab_limit), None)
        start = time.perf_counter()
        load_table(default.dim, default.sif, default.vocab_limit)
        seconds = time.perf_counter() - start
    if before is None:
        os.environ.pop("EVOPOOL_CACHE_DIR")
    else:
        os.environ["EVOPOOL_CACHE_DIR"] = before
    return seconds


def bench_dataset(name: str, options: list[str], n_dev: int, seed: int, rounds: int) -> list[dict]:
    folder = SHARED / name
    dev_texts, y_dev = load_split(folder, "valid")
    pick = stratified_sample(y_dev, n_dev, np.random.default_rng(seed))
    dev_texts, y_dev = [dev_texts[i] for i in pick], y_dev[pick]
    test_texts, y_test = load_split(folder, "test")
    texts = dev_texts + test_texts
    options = options if "minilm" in options else ["minilm", *options]  # the float32 reference
    embedders = {option: OPTIONS[option]() for option in options}
    for embedder in embedders.values():
        embedder.encode(texts[:8])  # load models and tables outside the clock
    timings: dict[str, list[tuple[float, float]]] = {option: [] for option in options}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):  # round-robin: a change in the machine's load hits every option alike
        for option, embedder in embedders.items():
            got, wall, cpu = timed_encode(embedder, texts)
            timings[option].append((len(texts) / wall, len(texts) / cpu))
            vectors.setdefault(option, normalise_rows(got))
            print(f"{name} {option}: {len(texts) / wall:.1f}/s, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for option, embedder in embedders.items():
        cos, rank = agreement(vectors[option], vectors["minilm"], np.random.default_rng(seed))
        tuner = getattr(embedder, "tuner", None)
        wall_rates, cpu_rates = np.array(timings[option]).T
        rows.append({
            "dataset": name, "option": option, "n": len(texts), "dim": vectors[option].shape[1],
            "threads": "/".join(map(str, tuner.choices)) + f" → {tuner.best}" if tuner else "",
            "per_s": float(np.median(wall_rates)), "min_s": wall_rates.min(), "max_s": wall_rates.max(),
            "per_cpu_s": float(np.median(cpu_rates)), "cos": cos, "rank": rank,
            "f1": dev_only_f1(vectors[option][:len(dev_texts)], y_dev, vectors[option][len(dev_texts):],
                              y_test),
        })
        print(table_row(rows[-1]), flush=True)
    return rows


HEADER = ("| dataset | option | threads | dim | sent/s (wall) | sent/CPU-s | test macro-F1 | cos vs MiniLM "
          "| sim-rank vs MiniLM |\n|---|---|---|---|---|---|---|---|---|")


def table_row(r: dict) -> str:
    cos = "–" if np.isnan(r["cos"]) else f"{r['cos']:.4f}"
    spread = f" ({r['min_s']:.0f}–{r['max_s']:.0f})" if r["max_s"] > r["min_s"] else ""
    return (f"| {r['dataset']} | {r['option']} | {r['threads']} | {r['dim']} | {r['per_s']:.1f}{spread} | "
            f"{r['per_cpu_s']:.1f} | {r['f1']:.3f} | {cos} | {r['rank']:.3f} |")


def markdown(rows: list[dict], distill_s: float | None, args: argparse.Namespace, started: str) -> str:
    sizes = ", ".join(f"{d} {n}" for d, n in dict((r["dataset"], r["n"]) for r in rows).items())
    lines = [
        "# Embedding speed and quality", "",
        f"Run {started} on {machine()}; torch {torch.__version__}, default {torch.get_num_threads()} "
        f"threads; 1-minute load average {args.load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end. The CPU is shared with other engineers' "
        "jobs, so wall-clock rates are noisy: compare options within a run, and read sent/CPU-s too.",
        "",
        f"Command: `python bench/embed_speed.py --datasets {' '.join(args.datasets)} --options "
        f"{' '.join(args.options)} --dev {args.dev} --seed {args.seed} --rounds {args.rounds}`", "",
        f"Texts per option ({sizes}): {args.dev} stratified dev rows (valid.json) + all test rows. "
        f"Each option encodes them {args.rounds} times, options taking turns; rates are medians (range in "
        "brackets). threads: torch threads tried → used at the end. F1: test macro-F1 of a logistic "
        "regression fitted on the dev rows' embeddings only (C by 5-fold CV on dev). cos: mean cosine to the "
        "float32 MiniLM vector of the same text. sim-rank: Spearman correlation of 20,000 pair similarities "
        "with the float32 MiniLM.",
        "",
        *([args.note, ""] if args.note else []),
        HEADER,
    ]
    lines += [table_row(r) for r in rows]
    if distill_s is not None:
        lines += ["", "Distilling the static table (30k vocabulary tokens through MiniLM, PCA, SIF weights): "
                      f"{distill_s:.1f} s, once per machine (cached under the user cache dir)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["chemprot", "trec"])
    parser.add_argument("--options", nargs="+", default=list(DEFAULT_OPTIONS), choices=sorted(OPTIONS))
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="timed encodes per option, taking turns")
    parser.add_argument("--append", action="store_true", help="add this run to --out instead of replacing it")
    parser.add_argument("--note", default="", help="a line of context written under the run's heading")
    parser.add_argument("--no-distill", action="store_true", help="skip timing the table distillation")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed_speed.md")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"no shared data at {SHARED}")
    started, args.load_start = datetime.now().strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    distill_s = None if args.no_distill else time_distillation()
    if distill_s is not None:
        print(f"static table distilled in {distill_s:.1f} s", flush=True)
    rows = [r for name in args.datasets
            for r in bench_dataset(name, args.options, args.dev, args.seed, args.rounds)]
    text = markdown(rows, distill_s, args, started)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.append and args.out.is_file():
        text = args.out.read_text() + "\n" + text.replace("# Embedding speed and quality", "## Re-run", 1)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
