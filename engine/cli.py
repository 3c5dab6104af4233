"""`evopool`: the headless contract. Progress goes to stderr; the last stdout line of each command is JSON.

Exit codes: 0 done; 1 a domain error (bad data, a locked workspace, an LLM refusal...), told in one line on
stderr with no traceback; 2 a usage error (argparse's: a wrong flag or choice, or DATA missing for a new
workspace); 130 interrupted (Ctrl-C: LLM requests in flight are cancelled, what completed is kept).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.agents.choice import AGENT_CHOICES, DEFAULT_AGENTS, make_proposer
from engine.agents.llm.proposer import MODES
from engine.aggregators.registry import AGGREGATORS, DEFAULT_AGGREGATOR
from engine.corpus.engines import ENGINES, EngineUnavailable
from engine.corpus.reading import CorpusError
from engine.corpus.shards import OutputError
from engine.embed.registry import EMBEDDERS
from engine.events import EventKind
from engine.evolve import EvolveConfig, current_dev_macro_f1, evolve
from engine.export.files import EXPORT_FORMATS, check_destination, check_pool_destination
from engine.gate import GateConfig
from engine.ingest.errors import IngestError
from engine.ingest.importer import IngestOptions, import_path
from engine.llm.presets import PRESETS
from engine.llm.seam import LLMError
from engine.store import workspaces
from engine.store.actor import command_line_expert, set_acting_expert
from engine.store.workspace import DB_NAME, Store, WorkspaceUnavailable

# What a command reports as "error: <one line>" with exit code 1; anything else is a bug and shows its traceback.
DOMAIN_ERRORS = (IngestError, WorkspaceUnavailable, LLMError, ValueError, OSError,  # ValueError: e.g. a bad gate file
                 CorpusError, OutputError, EngineUnavailable)


class UsageError(Exception):
    """The command line lacks something only the workspace's state shows is needed (exit 2, with usage)."""


class NotAdded(Exception):
    """`pool add`: the checks refused the code or the gate rejected it without --approve (exit 1)."""


class MissingExtra(Exception):
    """An option needs an optional extra that is not installed (exit 1, with how to install it)."""


class NoData(Exception):
    """The workspace holds no data yet, so there is nothing to evaluate, export or list (exit 1)."""


# Kinds printed as one line each, and those printed only with --verbose.
_SHOWN = frozenset({EventKind.GENERATION_STARTED, EventKind.AGENT_FINISHED, EventKind.EXECUTING,
                    EventKind.EMBEDDING, EventKind.AGGREGATING})
_NOTES = frozenset({EventKind.LLM_NOTE, EventKind.AGENT_STOPPED})  # printed as their message
_VERBOSE = frozenset({EventKind.CANDIDATE_DROPPED, EventKind.VERDICT, EventKind.LLM_CALL, EventKind.LLM_REPAIR})


def _progress(verbose: bool):
    started = time.monotonic()
    told: set[str] = set()

    def on_event(kind: EventKind, payload: dict[str, Any]) -> None:
        stamp = f"[{time.monotonic() - started:7.1f}s]"
        if kind == EventKind.GENERATION_COMPLETE:
            print(f"{stamp} generation {payload['generation']}: {payload['accepted']}/{payload['candidates']} "
                  f"accepted, pool {payload['pool_size']}, dev macro-F1 {payload['dev_macro_f1']:.3f}"
                  + (" (reverted)" if payload["reverted"] else ""), file=sys.stderr, flush=True)
        elif kind in _SHOWN:
            detail = ", ".join(f"{k}={v}" for k, v in payload.items())
            print(f"{stamp} {kind.replace('_', ' ')}: {detail}", file=sys.stderr, flush=True)
        elif kind in _NOTES:
            print(f"{stamp} {payload['agent']}: {payload['message']}", file=sys.stderr, flush=True)
        elif kind == EventKind.STOPPED and payload.get("reason"):
            print(f"{stamp} generation {payload['generation']} not complete: {payload['reason']}; a rerun with "
                  "budget left continues it", file=sys.stderr, flush=True)
        elif kind == EventKind.BUDGET_EXHAUSTED and payload["message"] not in told:  # once, not per refused call
            told.add(payload["message"])
            print(f"{stamp} {payload['message']}: the LLM agents stop proposing", file=sys.stderr, flush=True)
        elif verbose and kind in _VERBOSE:
            print(f"{stamp} {kind}: {json.dumps(payload)}", file=sys.stderr, flush=True)

    return on_event


def _proposer(args: argparse.Namespace, on_event):
    """The agents named by --agents; the LLM ones get the endpoint, mode and prices from the flags, and the
    workspace's budget (the limits given here are stored as the workspace's, for later runs too)."""
    from engine.llm.costs import Budget, PriceTable

    budget = Budget.for_workspace(args.store, max_calls=args.max_calls, max_tokens=args.max_tokens,
                                  max_usd=args.max_usd)
    prices = PriceTable.from_file(args.prices) if args.prices else None
    overrides = {"base_url": args.base_url, "model": args.model, "mode": args.llm_mode, "preset": args.llm_preset}
    proposer = make_proposer(args.agents, args.store, llm_overrides=overrides, budget=budget, prices=prices,
                             on_event=on_event)
    for member in getattr(proposer, "proposers", (proposer,)):
        client = getattr(member, "client", None)
        config = getattr(client, "config", None)
        if config is not None:
            preset = f", preset {config.preset}" if config.preset else ""
            print(f"LLM {config.model} at {config.base_url or 'the OpenAI API'}: {config.max_parallel} request(s) "
                  f"at a time, {config.timeout_s:.0f} s timeout, {config.max_retries} retries, mode {config.mode}"
                  f"{preset}; workspace budget: {budget.describe()}", file=sys.stderr, flush=True)
            prices = getattr(client, "prices", None)
            if budget.max_usd is not None and prices is not None and prices.price(config.model) is None:
                print(f"--max-usd: no price is known for {config.model}, so its calls count as $0 and the dollar "
                      "limit never stops them; give its prices with --prices FILE, or limit --max-calls",
                      file=sys.stderr, flush=True)
    return proposer


def _llm_summary(proposer: Any) -> dict | None:
    """The LLM agents' usage (calls, attempts, tokens, cost, failures, budget), also told on stderr."""
    usage = getattr(proposer, "usage", None)
    summary = usage() if callable(usage) else None
    if summary is None:
        return None
    failures = ", ".join(f"{n} {kind}" for kind, n in summary.get("failures", {}).items()) or "none"
    budget = summary.get("budget", {})
    remaining = budget.get("remaining", {})
    left = "; ".join(f"{remaining[k]} {k} left of {budget['limits'][k]}" for k in ("calls", "tokens", "usd")
                     if budget.get("limits", {}).get(k) is not None) or "no limit set"
    print(f"LLM {summary['model']} ({summary['writing']}): {summary.get('calls', 0)} calls "
          f"({summary.get('cached', 0)} cached, {summary.get('failed_calls', 0)} failed), "
          f"{summary.get('attempts', 0)} HTTP attempts, {summary.get('tokens_in', 0)}+{summary.get('tokens_out', 0)} "
          f"tokens, ${summary.get('cost_usd', 0.0):.4f}; failed attempts: {failures}; workspace budget: {left}",
          file=sys.stderr, flush=True)
    if summary.get("notes"):
        shape = summary.get("format_shape")
        print(f"LLM adapted to the server ({len(summary['notes'])} change(s), told above): now "
              f"{summary.get('parallel', '?')} request(s) at a time, {summary.get('timeout_s', 0):.0f} s timeout, "
              f"specs {'constrained via response_format ' + repr(shape) if shape else 'not constrained'}",
              file=sys.stderr, flush=True)
    for why in summary.get("stopped", {}).values():
        print(f"LLM stopped: {why}", file=sys.stderr, flush=True)
    if summary.get("advice"):  # last: the run's closing word (spec mode, where free code all failed)
        print(f"advice: {summary['advice']}", file=sys.stderr, flush=True)
    return summary


def _warn_weak_sandbox(executor: Any) -> None:
    """One stderr line naming the sandbox layers that are off on this machine, and why each."""
    from engine.sandbox.executor import weak_layers

    off = weak_layers(executor.containment(), frozenset({"all"}))
    if off:
        print(f"sandbox: layers off on this machine: {', '.join(off)} (`evopool doctor` says more; "
              "EVOPOOL_SANDBOX_REQUIRE=all refuses to run without them)", file=sys.stderr, flush=True)


def _label_descriptions(path: str | None) -> dict[str, str]:
    """A JSON object {label: description}, written inline or in a file; the offline agents seed cues from it, the
    LLM agents read it."""
    if not path:
        return {}
    try:  # inline when it opens an object (a file name rarely starts with "{")
        value = json.loads(path if path.lstrip().startswith("{") else Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"--label-descriptions {path}: {err}") from err
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise UsageError(f'--label-descriptions {path}: expected a JSON object {{"label": "description", ...}}')
    return value


def _same_data(store: Store, data: Path) -> None:
    """DATA given for a workspace that already holds data: a rerun with the file it was imported from goes on; another
    file is refused (it would not be imported, and the run would evolve the old data as if it were the new)."""
    source = (store.get_meta("ingest") or {}).get("source")
    if source is None or Path(source).resolve() != Path(data).resolve():
        raise UsageError(f"the workspace already holds data (imported from {source or 'the studio'}), so {data} "
                         "would not be imported: leave DATA out to evolve the workspace as it is, or give a new "
                         f"--workdir to import {data}")


def cmd_run(args: argparse.Namespace) -> dict:
    from engine.apply.executor import default_executor

    store = args.store
    if not store.has_data():
        if not args.data:
            raise UsageError("the workspace is empty: give DATA to import")
        opts = IngestOptions(dev_size=args.dev_size, audit_fraction=args.audit_fraction, seed=args.seed,
                             text_column=args.text_column,
                             label_column=args.label_column, multi_label=args.multi_label,
                             label_separator=args.label_separator, task_name=args.task_name,
                             labels=tuple(args.labels) if args.labels else None,
                             label_descriptions=_label_descriptions(args.label_descriptions),
                             skip_bad_rows=args.skip_bad_rows)
        try:
            report = import_path(store, args.data, opts)
        except IngestError as err:
            if err.problems and all(p.row for p in err.problems) and not args.skip_bad_rows:
                raise IngestError(f"{str(err).splitlines()[0]} (fix the rows, or pass --skip-bad-rows to import "
                                  "the good ones)", err.problems) from None
            raise
        print(f"imported {report.n_rows} rows {report.split_counts}; " + "; ".join(report.notes),
              file=sys.stderr, flush=True)
        for problem in report.skipped:  # every row left out, and why: the file can be fixed and imported again
            print(f"skipped {problem}", file=sys.stderr, flush=True)
    elif args.data:
        _same_data(store, args.data)
    gate = _gate_config(args.gate_config)
    config = EvolveConfig(gate=gate, seed=args.seed)
    started = time.monotonic()
    on_event = _progress(args.verbose)
    proposer = _proposer(args, on_event)
    try:
        with default_executor() as executor:
            if args.agents != "offline":  # a model's code will run: say which walls this machine lacks, up front
                _warn_weak_sandbox(executor)
            done = evolve(store, proposer, executor, args.generations, config, on_event)
    except (LLMError, KeyboardInterrupt):
        _llm_summary(proposer)  # a failed or interrupted run still tells what its calls came to
        raise
    result = {
        "workdir": str(args.workdir),
        "generations_run": [g.number for g in done],
        "generation": store.last_complete_generation(),
        "pool_size": len(store.pool_ids()),
        "dev_macro_f1": round(current_dev_macro_f1(store), 4),
        "seconds": round(time.monotonic() - started, 1),
    }
    stopped = _not_complete(store, args.generations)
    if stopped:
        result["stopped"] = stopped
    from engine.expert.review import IDLE_ADVICE, idle_generations

    idle = idle_generations(store.generations())
    if idle >= 2 and done:
        result["idle_generations"] = idle
        print(f"the last {idle} generations proposed nothing new: {IDLE_ADVICE}", file=sys.stderr, flush=True)
    llm = _llm_summary(proposer)
    if llm is not None:
        result["llm"] = llm
    return result


def _not_complete(store: Store, target: int) -> str | None:
    """Why the run ended before `target` complete generations (a generation starved by the budget)."""
    if store.last_complete_generation() >= target:
        return None
    frame = store.generations()
    starved = frame[frame["status"] == "starved"]
    return str(starved["note"].iloc[-1]) if len(starved) else None


def cmd_eval(args: argparse.Namespace) -> dict:
    from engine.apply.executor import default_executor
    from engine.labeling import evaluate

    with default_executor() as executor:
        return evaluate(args.store, executor, args.split, args.aggregator, on_event=_progress(args.verbose),
                        threshold=args.threshold)


def cmd_suggest(args: argparse.Namespace) -> None:
    """The rows worth labeling, best first, one JSON line each (`id`, `text`, `why`)."""
    from engine.apply.executor import default_executor
    from engine.expert.queue import suggest_rows

    with default_executor() as executor:
        for suggestion in suggest_rows(args.store, executor, args.n, args.strategy, args.seed):
            print(json.dumps(suggestion.to_dict()), flush=True)


def cmd_teach(args: argparse.Namespace) -> dict:
    """An expert's labels (CSV `id,label`) into dev, all or nothing; the rows added per class."""
    from engine.apply.executor import default_executor
    from engine.expert.queue import read_teach_csv, teach

    labeled = read_teach_csv(args.labels)
    with default_executor() as executor:
        added = teach(args.store, executor, labeled, args.by, note=f"taught from {args.labels.name}")
    return {"added": sum(added.values()), "per_class": added, "dev_rows": args.store.count_examples("dev")}


def cmd_export(args: argparse.Namespace) -> dict:
    from engine.apply.executor import default_executor
    from engine.export.files import write_export
    from engine.export.hf import HF_MISSING, hf_available

    if args.format == "hf" and not hf_available():
        raise MissingExtra(HF_MISSING)
    fmt = check_destination(args.store, args.out, args.format)  # before the fit, which can take minutes
    if args.pool_python is not None:
        check_pool_destination(args.store, args.pool_python, args.out)
    if args.spreadsheet_safe and fmt != "csv":
        raise UsageError(f"--spreadsheet-safe makes a CSV safe to open in a spreadsheet; this export is {fmt}")
    from engine.labeling import soft_labels

    with default_executor() as executor:
        result = soft_labels(args.store, executor, args.aggregator, on_event=_progress(args.verbose),
                             threshold=args.threshold)
    path, manifest_path = write_export(args.store, result.soft, result.hard, result.n_votes, args.out,
                                       args.format, extra={"dev_scores": result.dev_scores.to_dict()},
                                       threshold=result.threshold, spreadsheet=args.spreadsheet_safe)
    out = {"out": str(path), "manifest": str(manifest_path), "rows": int(len(result.hard)),
           "aggregator": result.soft.aggregator}
    if args.pool_python is not None:
        from engine.atomic import write_atomically
        from engine.export.files import pool_as_python

        write_atomically(args.pool_python, pool_as_python(args.store).encode("utf-8"))
        out["pool_python"] = str(args.pool_python)
    return out


def _rows_progress():
    """stderr lines for a corpus run: rows done, rows/s and the time left at that pace (at most one a second)."""
    from engine.corpus.engines import Pace

    started, last, pace = time.monotonic(), [0.0], Pace()

    def on_progress(done: int, total: int) -> None:
        now = time.monotonic()
        rate, left = pace.at(done, total)
        if now - last[0] < 1.0 and done < total:
            return
        last[0] = now
        eta = f"{left:,.0f}s" if left is not None else "?"
        print(f"[{now - started:7.1f}s] labeled {done:,} / {total:,} rows, {rate:,.0f} rows/s, ETA {eta}",
              file=sys.stderr, flush=True)

    return on_progress


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a usage error, before the workspace is opened)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_label(args: argparse.Namespace) -> dict:
    """Label a corpus outside the workspace: the pool and the dev-fitted aggregator, shard by shard."""
    from engine.apply.executor import default_executor
    from engine.corpus.engines import label_corpus
    from engine.corpus.labeler import fit_labeler
    from engine.corpus.reading import find_files, survey

    files = survey(find_files(args.input))  # a missing or corrupt file fails before any fitting
    if args.engine == "ray":
        from engine.corpus.engines import require_ray
        require_ray()  # before the minutes of fitting, not after
    print(f"corpus: {len(files)} file(s), about {sum(f.rows for f in files):,} rows; fitting {args.aggregator} "
          "on the workspace's dev rows", file=sys.stderr, flush=True)
    with default_executor() as executor:
        labeler = fit_labeler(args.store, executor, args.aggregator, seed=args.seed, text_column=args.text_column,
                              threshold=args.threshold, id_column=args.id_column)
    Store.close_all()  # workers never touch the workspace; let the studio open it while this runs
    result = label_corpus(labeler, files, args.output, engine=args.engine, batch_size=args.batch_size,
                          ray_address=args.ray_address, workers=args.workers, on_progress=_rows_progress())
    return {key: result[key] for key in ("manifest", "rows", "shards", "engine", "workers", "seconds", "rows_per_s",
                                         "resumed_shards")} | {"aggregator": labeler.made_by,
                                                               "output": str(args.output)}


def cmd_pool(args: argparse.Namespace) -> dict | None:
    if args.action == "add":
        return cmd_pool_add(args)
    if args.file is not None:
        raise UsageError(f"FILE is only for `pool add` (got {args.file})")
    store = args.store
    scores = store.scores()
    for a in store.annotators(store.pool_ids()):
        s = scores.get(a.id)
        print(json.dumps({"id": a.id, "name": a.name, "agent": a.agent, "generation": a.generation,
                          "author": a.author, "written_by": a.provenance, "precision": s and round(s.precision, 4),
                          "coverage": s and round(s.coverage, 4), "fires": s and s.fires, "source": a.source}))
    return None


def cmd_pool_add(args: argparse.Namespace) -> dict:
    """Submit an expert's annotator file the way the studio's editor does; exit 1 when nothing was added."""
    from engine.apply.executor import default_executor
    from engine.expert.review import submit

    if args.file is None:
        raise UsageError("pool add needs the annotator's FILE")
    source = args.file.read_text(encoding="utf-8")
    gate = _gate_config(args.gate_config)
    with default_executor() as executor:
        result = submit(args.store, executor, source, args.name or "", args.approve, gate)
    if not result["added"]:
        print(json.dumps(result))
        why = "; ".join(str(r) for r in result["reasons"])
        if result["verdict"] == "in pool":
            raise NotAdded(f"not added: {why}")
        raise NotAdded(f"not added: the {'checks' if result['verdict'] == 'refused' else 'gate'} said {why}"
                       + ("" if result["verdict"] == "refused" else " (--approve adds it anyway)"))
    return result


def _gate_config(path: str | None) -> GateConfig:
    """--gate-config's file, or the defaults; a file that does not hold gate settings is an error naming it."""
    if not path:
        return GateConfig()
    try:
        return GateConfig.from_dict(json.loads(Path(path).read_text()))
    except ValueError as err:  # json's decode error is one too
        raise ValueError(f"{path}: {err}") from err


def cmd_describe(args: argparse.Namespace) -> dict:
    """Print the labels' descriptions; with LABEL TEXT, describe LABEL first; with LABEL --remove, remove its
    description. The JSON's `previous` holds what a change replaced (to put it back)."""
    store, out = args.store, {}
    if args.remove and (args.label is None or args.text is not None):
        raise UsageError("--remove takes a LABEL and no TEXT")
    if args.text is not None and not args.text.strip():
        raise UsageError("TEXT is blank: to remove a description, use --remove")
    task = store.load_task()
    if args.label is not None:
        try:
            task.check_label(args.label)
        except ValueError as err:
            raise UsageError(str(err)) from err
    if args.remove or args.text is not None:
        out["previous"] = store.describe_label(args.label, "" if args.remove else args.text)
        print(f"{args.label}: {'removed' if args.remove else 'described'}"
              + (f" (was: {out['previous']})" if out["previous"] else " (had none)"), file=sys.stderr)
        task = store.load_task()
    shown = task.labels if args.label is None else (args.label,)
    return {"labels": {label: task.label_descriptions.get(label, "") for label in shown}, **out}


def cmd_doctor(args: argparse.Namespace) -> dict:
    """How contained annotator code is on this machine: each sandbox layer, on or off and why."""
    from engine.sandbox.executor import SandboxExecutor

    with SandboxExecutor(workers=1) as executor:
        layers = executor.containment()
    for name, status in layers.items():
        print(f"{name:>14}  {status}", file=sys.stderr)
    return {"sandbox": layers, "layers_off": [name for name, status in layers.items() if not status.startswith("on")]}


def cmd_workspace(args: argparse.Namespace) -> dict | None:
    """list (JSON lines: what each holds), rm (into the trash), mv, restore (the latest deleted), empty-trash."""
    home = (args.home or workspaces.default_home()).resolve()
    needs = {"list": 0, "empty-trash": 0, "rm": 1, "restore": 1, "mv": 2}[args.action]
    given = [n for n in (args.name, args.new_name) if n]
    if len(given) != needs:
        raise UsageError(f"`workspace {args.action}` takes {needs} name(s)")
    if args.action == "list":
        for name in workspaces.names(home):
            held = workspaces.holding(home, name)
            print(json.dumps({"name": name, "rows": held.rows, "dev_rows": held.dev_rows,
                              "generation": held.generations, "pool": held.pool,
                              "expert_verdicts": held.expert_actions, "bytes": held.bytes_on_disk,
                              "in_use": held.rows is None}))
        return None
    if args.action == "empty-trash":
        return {"deleted_for_good": workspaces.empty_trash(home)}
    if args.action == "rm":
        where = workspaces.delete(home, args.name)
        print(f"moved {args.name} to {where}; undo: evopool workspace restore {args.name}", file=sys.stderr)
        return {"deleted": args.name, "trash": str(where)}
    if args.action == "mv":
        return {"renamed": args.name, "to": workspaces.rename(home, args.name, args.new_name).name}
    deleted = workspaces.trashed(home, args.name)
    if not deleted:
        raise NoData(f"no deleted workspace named {args.name} in {home / workspaces.TRASH}")
    return {"restored": workspaces.restore(home, deleted[0])}


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


def _one_line(err: BaseException) -> str:
    """An error's message on one line: an import's row problems follow its summary, separated by ';'."""
    lines = [line.strip().removeprefix("- ") for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[0] + (": " + "; ".join(lines[1:]) if len(lines) > 1 else "")


def _discard_if_empty(args: argparse.Namespace) -> None:
    """A `run` whose first import failed leaves no empty workspace behind (one with data is never touched)."""
    if args.command == "run" and getattr(args, "store", None) is not None:
        try:
            Store.discard_empty(args.workdir)
        except (WorkspaceUnavailable, OSError):  # best effort: the error being reported matters more
            pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error
    set_acting_expert(command_line_expert())  # who `pool add --approve`, `describe` and undo record
    try:
        workdir = getattr(args, "workdir", None)
        if workdir and args.command != "run" and not (Path(workdir) / DB_NAME).is_file():
            # a mistyped --workdir: say so without leaving an empty workspace there
            raise NoData(f"there is no workspace in {workdir}: import data with `evopool run DATA --workdir {workdir}`")
        args.store = Store.open(workdir) if workdir else None
        if args.store is not None and args.command != "run" and not args.store.has_data():
            raise NoData(f"the workspace {args.workdir} holds no data: import it with "
                         f"`evopool run DATA --workdir {args.workdir}`")
        if args.store is not None and getattr(args, "embedder", None):
            args.store.set_meta("embedder", args.embedder)
        result = args.handler(args)
    except UsageError as err:
        _discard_if_empty(args)
        args.parser.error(str(err))  # exits 2
    except (*DOMAIN_ERRORS, NoData, NotAdded, MissingExtra) as err:
        _discard_if_empty(args)
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _discard_if_empty(args)
        print("interrupted: what completed is kept in the workspace", file=sys.stderr)
        return 130
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
