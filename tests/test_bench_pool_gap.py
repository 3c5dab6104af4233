"""bench/pool_gap.py's settings: SelectConfig overrides typed as the fields are, unknown names refused."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# bench/ is scripts, not an installed package: load the file as the command line runs it (it puts the repo on the path)
_FILE = Path(__file__).resolve().parents[1] / "bench" / "pool_gap.py"
_SPEC = importlib.util.spec_from_file_location("pool_gap", _FILE)
pool_gap = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pool_gap)
markdown, parse_setting = pool_gap.markdown, pool_gap.parse_setting


def test_a_setting_becomes_typed_select_config_overrides():
    assert parse_setting("default") == {}
    got = parse_setting("min_gain=0.003,min_fires=3,cross_fit=False")
    assert got == {"min_gain": 0.003, "min_fires": 3, "cross_fit": False}
    assert isinstance(got["min_fires"], int) and isinstance(got["min_gain"], float)


def test_an_unknown_setting_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="min_gian"):
        parse_setting("min_gian=0.003")
    with pytest.raises(SystemExit, match="true or false"):
        parse_setting("cross_fit=no")


def test_the_summary_counts_the_seeds_where_a_setting_has_the_smaller_equal_or_larger_gap():
    def row(seed, setting, gap):
        return {"dataset": "d", "seed": seed, "setting": setting, "pool": 3, "evolve_s": 1.0, "mv_fitness": 0.9,
                "mv_pool_rows": 0.9 - gap, "gap": gap}

    rows = [row(0, "default", 0.10), row(0, "min_gain=0.003", 0.08), row(1, "default", 0.10),
            row(1, "min_gain=0.003", 0.12), row(2, "default", 0.10), row(2, "min_gain=0.003", 0.10)]
    meta = {"when": "now", "commit": "c", "machine": "m", "load": "0", "command": "python bench/pool_gap.py"}
    summary = markdown(rows, meta).split("## Mean over seeds")[1]
    assert "| d | default | 3 | 3.0 | 0.800 | 0.100 | – |" in summary
    assert "| d | min_gain=0.003 | 3 | 3.0 | 0.800 | 0.100 | 1 / 1 / 1 |" in summary
