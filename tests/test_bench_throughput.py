"""bench/throughput.py at a tiny row count: every applier that can run here gives the same vote matrix."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_appliers_agree_on_the_chemprot_pool(shared_data):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), "--rows", "300", "--json", "--out", "-",
         "--workers", "1", "--appliers", "bare-loop", "sandbox", "snorkel-lf", "snorkel-pandas", "compiled"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["applier"]: r for r in map(json.loads, done.stdout.splitlines())}
    ran = {name: r for name, r in records.items() if "checksum" in r}
    assert {"bare-loop", "sandbox"} <= set(ran), records
    if importlib.util.find_spec("snorkel") is not None:  # the optional `bench` extra
        assert {"snorkel-lf", "snorkel-pandas"} <= set(ran), records
    assert len({r["checksum"] for r in ran.values()}) == 1, records
    for r in ran.values():
        assert r["rows"] == 300 and r["annotators"] > 10 and 0 < r["fired"] < 1 and r["peak_rss_mb"] > 0
    skipped = set(records) - set(ran)
    assert all(records[name].get("skipped") for name in skipped), records  # never a silent failure
