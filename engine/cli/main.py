"""`evopool`: parse, open the workspace, run the command, and turn what went wrong into an exit code."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.cli.errors import DOMAIN_ERRORS, MissingExtra, NoData, NotAdded, UsageError
from engine.cli.parser import build_parser
from engine.store.actor import command_line_expert, set_acting_expert
from engine.store.workspace import DB_NAME, Store, WorkspaceUnavailable


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
