"""The command line: every command, its options and help, and the handler it runs."""
from __future__ import annotations

import argparse
import os
from importlib import metadata
from pathlib import Path

from engine.agents.choice import AGENT_CHOICES, DEFAULT_AGENTS
from engine.agents.llm.proposer import MODES
from engine.aggregators.registry import AGGREGATORS, DEFAULT_AGGREGATOR
from engine.cli.commands import (
    cmd_describe,
    cmd_doctor,
    cmd_eval,
    cmd_export,
    cmd_label,
    cmd_pool,
    cmd_run,
    cmd_suggest,
    cmd_teach,
    cmd_workspace,
)
from engine.corpus.engines import ENGINES
from engine.embed.registry import EMBEDDERS
from engine.export.files import EXPORT_FORMATS
from engine.llm.presets import PRESETS


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a usage error, before the workspace is opened)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evopool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workdir", required=True, type=Path, help="workspace folder (holds workspace.duckdb)")
        p.add_argument("-v", "--verbose", action="store_true", help="also print every verdict and dropped candidate")
        p.set_defaults(parser=p)

    def labeling(p: argparse.ArgumentParser) -> None:
        p.add_argument("--aggregator", choices=AGGREGATORS, default=DEFAULT_AGGREGATOR,
                       help=f"how votes become labels (default: {DEFAULT_AGGREGATOR}; multi-label: evoagg or auto)")
        p.add_argument("--threshold", type=float, default=0.5, help="multi-label: probability a class needs")
        p.add_argument("--embedder", choices=tuple(EMBEDDERS),
                       help="text embedder for the aggregators that read the text; kept as the workspace's "
                            "(default: the workspace's, else minilm)")

    run = sub.add_parser("run", help="import DATA if the workspace is new, then evolve the pool")
    run.add_argument("data", nargs="?", help="CSV / JSONL / Parquet file or WRENCH folder")
    common(run)
    run.add_argument("--generations", type=int, default=5, help="evolve until this many generations are complete")
    run.add_argument("--agents", choices=AGENT_CHOICES, default=DEFAULT_AGENTS,
                     help="offline mines dev for cues; llm asks an OpenAI-compatible endpoint; mixed runs both")
    run.add_argument("--dev-size", type=int, default=500)
    run.add_argument("--audit-fraction", type=float, default=0.2,
                     help="share of dev held back from the agents and the gate; auto chooses on it (0: none)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--text-column", default=None,
                     help="default: the column named text, else the one with the longest free text")
    run.add_argument("--label-column", default="label")
    run.add_argument("--multi-label", action="store_true",
                     help="a label cell may hold several labels (CSV: joined by --label-separator; JSONL: a list)")
    run.add_argument("--label-separator", default="|", help="between the labels of a multi-label cell")
    run.add_argument("--label", action="append", dest="labels", metavar="NAME",
                     help="the label set, one --label per class, in this order (import only; default: the labels "
                          "found in the data). A set you give is taken as given: labels that differ only in case "
                          "stay apart, a class no row holds yet is kept, and a row with another label is a problem")
    run.add_argument("--label-descriptions", metavar="FILE|JSON",
                     help='{"label": "what it means", ...}, inline or in a file: seeds the agents\' cues (import '
                          'only)')
    run.add_argument("--task-name", help="the task's name (import only; default: the file's name)")
    run.add_argument("--skip-bad-rows", action="store_true",
                     help="import the good rows and list each bad one (row and why) instead of refusing the file "
                          "(import only; a quote that swallows rows still refuses it)")
    run.add_argument("--gate-config", help="JSON file overriding gate thresholds")
    run.add_argument("--base-url", help="OpenAI-compatible endpoint (else OPENAI_BASE_URL)")
    run.add_argument("--model", help="model name (else EVOPOOL_MODEL)")
    run.add_argument("--llm-preset", choices=tuple(PRESETS),
                     help="settings for this kind of server (timeout, parallel calls, mode; base URL for local ones)")
    run.add_argument("--llm-mode", choices=MODES,
                     help="code: the model writes Python; spec: it fills JSON specs the engine renders (small "
                          "models); auto: code, switching to spec when replies keep failing (default)")
    run.add_argument("--max-calls", type=int,
                     help="LLM budget: HTTP attempts (retries count), for the workspace: kept for later runs; "
                          "-1 removes the limit")
    run.add_argument("--max-tokens", type=int, help="LLM budget: tokens, for the workspace (-1: no limit)")
    run.add_argument("--max-usd", type=float, help="LLM budget: estimated dollars, for the workspace (-1: no limit)")
    run.add_argument("--prices", help="JSON/TOML price table (model -> USD per 1M input/output tokens)")
    run.set_defaults(handler=cmd_run)

    ev = sub.add_parser("eval", help="score the pool's labels on a labeled split")
    common(ev)
    ev.add_argument("--split", choices=("test", "dev"), default="test")
    labeling(ev)
    ev.set_defaults(handler=cmd_eval)

    su = sub.add_parser("suggest", help="print the unlabeled rows worth labeling, best first (JSON lines)")
    common(su)
    su.add_argument("--n", type=int, default=25, help="how many rows (default 25)")
    su.add_argument("--strategy", choices=("queue", "uncertainty", "random"), default="queue",
                    help="queue: the studio's mix of signals, spread out (default); uncertainty: the text model's "
                         "least sure rows; random: seeded draws (the baselines bench/expert_loop.py weighs)")
    su.add_argument("--seed", type=int, default=0)
    su.set_defaults(handler=cmd_suggest)

    te = sub.add_parser("teach", help="add an expert's labels (CSV id,label) to dev, all or nothing")
    common(te)
    te.add_argument("labels", type=Path, help="CSV with a header id,label; ids of unlabeled rows")
    te.add_argument("--by", default=os.environ.get("EVOPOOL_EXPERT") or os.environ.get("USER") or "cli",
                    help="who labeled them, recorded with each row (default: $EVOPOOL_EXPERT, else $USER)")
    te.set_defaults(handler=cmd_teach)

    ex = sub.add_parser("export", help="write every example with its soft label")
    common(ex)
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--format", choices=EXPORT_FORMATS,
                    help="csv, jsonl, parquet (default: from --out's suffix, else csv) or hf: a Hugging Face "
                         "DatasetDict folder with ClassLabel features (needs the hf extra: pip install "
                         "'evopool-studio[hf]')")
    ex.add_argument("--pool-python", type=Path, metavar="FILE",
                    help="also write the pool as one runnable Python file (each annotator run in EvoPool's sandbox; "
                         "the studio's 'The pool as Python (.py)' download)")
    ex.add_argument("--spreadsheet-safe", action="store_true",
                    help="CSV only: put an apostrophe before every text cell that starts with = + - @ (or a tab), "
                         "so Excel or LibreOffice shows it as text instead of running it as a formula; those cells "
                         "then differ from the data by that apostrophe (the manifest counts them)")
    labeling(ex)
    ex.set_defaults(handler=cmd_export)

    lab = sub.add_parser("label", help="label a corpus (Parquet / CSV / JSONL, path or glob) into Parquet shards")
    common(lab)
    lab.add_argument("--input", required=True, help="a file, a folder or a glob (quote it), e.g. 'corpus/*.parquet'")
    lab.add_argument("--output", required=True, type=Path,
                     help="folder for the shards and _manifest.json (empty, or the same run's to resume it)")
    lab.add_argument("--engine", choices=ENGINES, default="local",
                     help="local: this process; ray: a Ray cluster (pip install -e '.[ray]')")
    lab.add_argument("--ray-address", help="join this Ray cluster (e.g. 10.0.0.5:6379); default: start a local one")
    lab.add_argument("--workers", type=_positive_int,
                     help="local: sandbox processes (2); ray: writer actors (all CPUs)")
    lab.add_argument("--batch-size", type=_positive_int, default=10_000, help="rows per batch and per shard")
    lab.add_argument("--text-column", default="text", help="the corpus column holding the text")
    lab.add_argument("--id-column", default="id",
                     help="the corpus column holding each row's id (kept in the output; none: <file>:<row>)")
    lab.add_argument("--seed", type=int, default=0)
    labeling(lab)
    lab.set_defaults(handler=cmd_label)

    pool = sub.add_parser("pool", help="list the current pool, one JSON object per line; `pool add FILE` submits "
                          "an annotator the way the studio's editor does and prints the gate's verdict")
    pool.add_argument("action", nargs="?", choices=("list", "add"), default="list")
    pool.add_argument("file", nargs="?", type=Path, help="add: a Python file defining annotate(example)")
    pool.add_argument("--name", help="add: the annotator's name (default: its docstring's first line)")
    pool.add_argument("--approve", action="store_true",
                      help="add: put it in the pool even if the gate rejects it (logged as the expert's verdict)")
    pool.add_argument("--gate-config", help="add: JSON file overriding gate thresholds")
    common(pool)
    pool.set_defaults(handler=cmd_pool)

    describe = sub.add_parser("describe", help="print the labels' descriptions, or describe LABEL as TEXT (the "
                              "agents try its words as cues from their next generation on)")
    describe.add_argument("label", nargs="?", help="one label (alone: print its description)")
    describe.add_argument("text", nargs="?", help="its new description")
    describe.add_argument("--remove", action="store_true", help="remove LABEL's description")
    common(describe)
    describe.set_defaults(handler=cmd_describe)

    ws = sub.add_parser("workspace", help="list the workspaces under --home, or rm (into the trash) / mv / "
                        "restore one")
    ws.add_argument("action", choices=("list", "rm", "mv", "restore", "empty-trash"))
    ws.add_argument("name", nargs="?", help="rm, mv, restore: the workspace")
    ws.add_argument("new_name", nargs="?", help="mv: its new name")
    ws.add_argument("--home", type=Path, help="the folder of workspaces (default: $EVOPOOL_HOME, else ./workspaces, "
                    "as the studio)")
    ws.set_defaults(handler=cmd_workspace, parser=ws)

    doctor = sub.add_parser("doctor", help="report the sandbox's containment layers on this machine (JSON)")
    doctor.set_defaults(handler=cmd_doctor)
    return parser


def _version() -> str:
    try:
        return metadata.version("evopool-studio")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"
