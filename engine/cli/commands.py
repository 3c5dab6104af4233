"""The commands: each takes the parsed arguments (with the open `store`) and returns the JSON it prints."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.agents.choice import make_proposer
from engine.cli.errors import MissingExtra, NoData, NotAdded, UsageError
from engine.events import EventKind
from engine.evolve import EvolveConfig, current_dev_macro_f1, evolve
from engine.export.files import check_destination, check_pool_destination
from engine.gate import GateConfig
from engine.ingest.errors import IngestError
from engine.ingest.importer import IngestOptions, import_path
from engine.llm.seam import LLMError
from engine.store import workspaces
from engine.store.workspace import Store

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
    from engine.labeling.evaluate import evaluate

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
    from engine.labeling.fit import soft_labels

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
