"""Screenshots of the studio for the docs, taken in a real headless Chromium as the end-to-end test does.

    python docs/screenshots.py            # writes docs/screenshots/*.png (needs /usr/bin/chromium, playwright)

A workspace is prepared in this process first (the demo, one generation of the offline agents, auto's soft
labels), then `streamlit run` serves it and the browser takes: an import error (a ragged CSV: the
unreadable row named, nothing imported), the live run panel mid-run, where the pool is weak (Analytics) and the
labels screen (auto's figures, the regression list). Each is the viewport, not the whole page, to stay small.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_e2e_browser import CHROMIUM, CHROMIUM_ARGS, _goto, _idle, start_studio, stop_studio  # noqa: E402

from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.evolve import evolve  # noqa: E402
from engine.ingest.importer import import_path  # noqa: E402
from engine.jobs import start_labels  # noqa: E402
from engine.sandbox.executor import SandboxExecutor  # noqa: E402
from engine.store.workspace import Store  # noqa: E402
from studio import workspace  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
VIEW = {"width": 1280, "height": 860}
LIVE = "demo-first-run"
RAGGED = "\n".join(["clause_id,clause,label",
                    *[f"CL-{i},the parties agree to clause {i} of this contract,{'Payment' if i % 2 else 'Venue'}"
                      for i in range(1, 7)],
                    "CL-7,a stray, comma,Payment",
                    *[f"CL-U{i},an unlabeled clause about terms {i}," for i in range(1, 5)]]) + "\n"


def prepare(home: Path) -> None:
    """The demo after one generation, with auto's soft labels saved; the store closed for the server."""
    store = Store.open(home / workspace.DEMO_NAME)
    import_path(store, workspace.DEMO_CSV, workspace.demo_options())
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
    job = start_labels(home / workspace.DEMO_NAME, "auto", compare=False)
    if not job.wait(600) or job.status != "done":
        raise SystemExit(f"soft labels failed: {job.error}")
    Store.open(home / "contracts")  # an empty workspace for the import error
    import_path(Store.open(home / LIVE), workspace.DEMO_CSV, workspace.demo_options())  # to watch a first run
    Store.close_all()


def scroll_to(page, text: str, settle_ms: int = 1500) -> None:
    """Bring the first element with this text to the top of the viewport."""
    found = page.get_by_text(text, exact=True).first
    found.wait_for()
    for _ in range(2):  # plots above it draw late and push it down: scroll again once they have
        found.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(settle_ms)


def shoot(page, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / f"{name}.png"))
    print(OUT / f"{name}.png", file=sys.stderr)


def main() -> None:
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        raise SystemExit(f"needs Debian's chromium at {CHROMIUM}")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        prepare(home)
        proc, url = start_studio(home, Path(tmp) / "streamlit.log")
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport=VIEW)
                page.set_default_timeout(60_000)
                # 1. an import error: a ragged CSV, its bad row named, nothing imported
                page.goto(f"{url}/?ws=contracts")
                ragged = Path(tmp) / "contracts.csv"
                ragged.write_text(RAGGED)
                page.locator("input[type=file]").set_input_files(str(ragged))
                expect(page.get_by_text("bad row(s)").first).to_be_visible()
                _idle(page)
                page.get_by_role("button", name="Import", exact=True).click()
                expect(page.get_by_text("Nothing was imported")).to_be_visible()
                _idle(page)
                scroll_to(page, "Columns and task")
                shoot(page, "import-error")
                # 2. where the pool is weak
                page.goto(f"{url}/analytics?ws={workspace.DEMO_NAME}")
                _idle(page, 60_000)
                scroll_to(page, "Where the pool is weak")
                shoot(page, "weak-spots")
                # 3. the labels screen: figures, the regression list, the downloads
                _goto(page, "Labels & export")
                page.wait_for_timeout(1000)
                shoot(page, "labels")
                scroll_to(page, "Dev rows it gets wrong (regression list)")
                shoot(page, "labels-regression-list")
                # 4. the live run panel during a first generation (later ones of the demo find little new)
                page.goto(f"{url}/evolve?ws={LIVE}")
                _idle(page, 60_000)
                page.get_by_role("button", name="Run 1 generation (to 1)").click()
                expect(page.get_by_text("Running for")).to_be_visible()
                expect(page.get_by_text(re.compile(r"proposed [1-9]")).first).to_be_visible(timeout=60_000)
                scroll_to(page, "Live", settle_ms=150)
                expect(page.get_by_text("Running for")).to_be_visible()  # still mid-run
                shoot(page, "live-run")
                expect(page.get_by_text("Last run finished")).to_be_visible(timeout=300_000)
                browser.close()
        finally:
            stop_studio(proc)


if __name__ == "__main__":
    main()
