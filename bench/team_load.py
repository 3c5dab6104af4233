"""Several experts on one workspace while a generation runs: is every action recorded with its author, none lost,
no error shown, and how long does a screen take to settle?

`--sessions` studio sessions (Streamlit's AppTest: the real pages and session state, each in a thread of its own,
in one process with the server's background jobs) each named, on the demo workspace, act in turn for `--minutes`:
describe a label (Project), reject or approve an annotator with a reason (Evolve), label the next suggested row
(Label rows). Meanwhile generations run in the background, one after another. Each action carries a unique text
(the reason, the description) or row, and is then looked for in the workspace: a verdict by that expert with that
reason, a description log row, an expert label by that name.

    python bench/team_load.py [--sessions 4] [--minutes 5] [--out bench/results/team_load.md]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import commit, machine  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.jobs import REGISTRY, start_evolve  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

APP = str(ROOT / "streamlit_app.py")


class Session:
    """One expert's browser session: the studio's pages under AppTest, named in the sidebar."""

    def __init__(self, workspace: str, name: str, seed: int):
        self.workspace, self.name, self.rng = workspace, name, random.Random(seed)
        self.settle: list[float] = []
        self.done: list[dict] = []  # actions the screen said were done
        self.errors: list[str] = []  # exceptions and error messages the studio showed
        self.reopened = 0  # a step the harness could not take (a widget gone by the time it acted): session reopened
        self.open()

    def open(self) -> None:
        """A new browser session (a reload), named as before."""
        from streamlit.testing.v1 import AppTest

        self.at = AppTest.from_file(APP, default_timeout=300)
        self.at.query_params["ws"] = self.workspace
        self._run(lambda: self.at.run())
        self._run(lambda: self.at.sidebar.text_input(key="who_input").input(self.name).run())

    def _run(self, step) -> bool:
        start = time.monotonic()
        step()
        self.settle.append(time.monotonic() - start)
        problems = [str(e.value) for e in self.at.exception] + [str(e.value) for e in self.at.error]
        self.errors += problems
        return not problems

    def page(self, path: str) -> None:
        self._run(lambda: self.at.switch_page(path).run())

    def describe(self, n: int) -> None:
        self.page("pages/project.py")
        label = self.rng.choice(["HAM", "SPAM"])
        text = f"{self.name}'s description {n}"
        self._run(lambda: self.at.selectbox(key="describe_label").set_value(label).run())
        box = next(t for t in self.at.text_area if t.key.startswith("describe_text_") and t.key.endswith(label))
        box.input(text)
        if self._run(lambda: self.at.button(key="describe_save").click().run()):
            self.done.append({"kind": "describe", "label": label, "text": text})

    def verdict(self, n: int) -> None:
        self.page("pages/evolve.py")
        notes = [t for t in self.at.text_input if t.key.startswith("note_card_")]
        if not notes:
            return
        note = self.rng.choice(notes)
        annotator_id = note.key.removeprefix("note_card_")
        submit = next(b for b in self.at.button if b.form_id == f"verdict_card_{annotator_id}")
        reason = f"{self.name}'s reason {n}"
        note.input(reason)
        if self._run(lambda: submit.click().run()):
            self.done.append({"kind": "verdict", "annotator_id": annotator_id, "reason": reason})

    def label(self, n: int) -> None:
        self.page("pages/teach.py")
        shown = [c.value for c in self.at.caption if c.value.startswith("Row ")]
        buttons = [b for b in self.at.button if b.key and b.key.startswith("teach_label_") and not b.disabled]
        if not shown or not buttons:
            return
        row = shown[0].removeprefix("Row ").split(" · ")[0].replace("\\", "")  # the id, markdown escapes undone
        if self._run(lambda: self.rng.choice(buttons).click().run()):
            self.done.append({"kind": "label", "row": row})


def act(session: Session, deadline: float) -> None:
    n = 0
    while time.monotonic() < deadline:
        try:
            (session.describe, session.verdict, session.label)[n % 3](n)
        except (KeyError, StopIteration, IndexError):  # the harness's widget went away under it (a rerun): reload
            session.reopened += 1
            session.open()
        n += 1


def keep_evolving(workdir: Path, deadline: float, generations: list[int]) -> None:
    """One generation after another until the deadline, as an expert pressing Run again would."""
    while time.monotonic() < deadline:
        job = start_evolve(workdir, 1, proposer=OfflineProposer())
        job.wait()
        generations.append(1 if job.status == "done" else 0)


def check(store: Store, sessions: list[Session]) -> dict:
    """Each action the screens said was done, looked for in the workspace."""
    verdicts = store.verdicts()
    log = store.description_log()
    labels = store.expert_labels()
    lost = 0
    for s in sessions:
        for a in s.done:
            if a["kind"] == "verdict":
                found = ((verdicts["note"] == a["reason"]) & (verdicts["expert"] == s.name)).any()
            elif a["kind"] == "describe":
                found = ((log["description"] == a["text"]) & (log["expert"] == s.name)).any()
            else:  # the row in dev, recorded as labeled by someone (two sessions may label the same row at once)
                found = a["row"] in set(labels["example_id"])
            lost += not found
    named = {"verdicts": int(verdicts["expert"].isin([s.name for s in sessions]).sum()),
             "descriptions": int(log["expert"].isin([s.name for s in sessions]).sum()),
             "labels": int(labels["labeled_by"].isin([s.name for s in sessions]).sum())}
    return {"lost": lost, "recorded_by_name": named}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "team_load.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="team-load-") as home:
        os.environ["EVOPOOL_HOME"] = home
        os.environ["EVOPOOL_CACHE"] = str(Path(home) / "cache")
        from studio import workspace

        name, _ = workspace.load_demo()
        workdir = Path(home) / name
        first = start_evolve(workdir, 1, proposer=OfflineProposer())
        first.wait()
        sessions = [Session(name, f"expert-{i + 1}", seed=i) for i in range(args.sessions)]
        deadline = time.monotonic() + 60 * args.minutes
        generations: list[int] = []
        threads = [threading.Thread(target=keep_evolving, args=(workdir, deadline, generations))]
        threads += [threading.Thread(target=act, args=(s, deadline)) for s in sessions]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        while REGISTRY.running(workdir) is not None:
            time.sleep(0.5)
        result = check(Store.open(workdir), sessions)
    settle = np.array([x for s in sessions for x in s.settle[2:]])  # past the first two (opening, naming)
    row = {"sessions": args.sessions, "minutes": round(wall / 60, 1), "generations": sum(generations),
           "actions": {k: sum(a["kind"] == k for s in sessions for a in s.done)
                       for k in ("describe", "verdict", "label")},
           "errors": sorted({e[:200] for s in sessions for e in s.errors})[:20],
           "n_errors": sum(len(s.errors) for s in sessions), "reopened": sum(s.reopened for s in sessions),
           "settle_p50_s": round(float(np.percentile(settle, 50)), 2) if len(settle) else None,
           "settle_p95_s": round(float(np.percentile(settle, 95)), 2) if len(settle) else None,
           "page_runs": int(len(settle)), **result}
    print(json.dumps(row, indent=1))
    args.out.write_text(
        f"# Several experts at once\n\nMeasured {time.strftime('%Y-%m-%d')} at commit {commit()} on {machine()} "
        f"with `python bench/team_load.py --sessions {args.sessions} --minutes {args.minutes}`: {args.sessions} "
        "studio sessions (AppTest, one thread each) on the demo workspace while generations run back to back; "
        "each describes a label, gives a verdict with a reason, labels a suggested row, in turn.\n\n"
        "| sessions | minutes | generations run | describe / verdict / label done | errors shown | actions lost | "
        "recorded with the expert's name (verdicts / descriptions / labels) | page settle p50 / p95 s |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {row['sessions']} | {row['minutes']} | {row['generations']} | {row['actions']['describe']} / "
        f"{row['actions']['verdict']} / {row['actions']['label']} | {row['n_errors']} | {row['lost']} | "
        f"{row['recorded_by_name']['verdicts']} / {row['recorded_by_name']['descriptions']} / "
        f"{row['recorded_by_name']['labels']} | {row['settle_p50_s']} / {row['settle_p95_s']} |\n"
        + f"\nSessions reopened by the harness (a widget it meant to use was gone by a rerun): {row['reopened']}.\n"
        + ("\nDistinct errors shown (up to 20): " + "; ".join(row["errors"]) + "\n" if row["errors"] else ""))
    args.out.with_suffix(".json").write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
