"""What the store and its mixins share without importing duckdb: split filters and the timestamp convention."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from engine.domain import AUDIT, FITNESS


def split_filter(split: str) -> tuple[str, list[Any]]:
    """SQL condition (and its parameters) for a split, or for one of dev's two row sets: `fitness` (what the
    agents and the gate see) and `audit` (held back from them, so aggregator choice on those rows is honest)."""
    if split == FITNESS:
        return "split = 'dev' AND NOT audit", []
    if split == AUDIT:
        return "split = 'dev' AND audit", []
    return "split = ?", [split]


def utc_now() -> datetime:
    """Now in UTC, without a zone: DuckDB's TIMESTAMP columns hold naive UTC times."""
    return datetime.now(UTC).replace(tzinfo=None)
