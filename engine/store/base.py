"""What the store's mixins use of the `Store` they are mixed into, declared once for the type checker.

`Store` (workspace.py) defines every one of these; the mixins (examples, pool, logs) call them on `self`. Declaring
them here lets mypy check those calls without the mixins importing duckdb's connection or each other.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import numpy as np
    import pandas as pd


class StoreBase:
    path: Path

    if TYPE_CHECKING:
        @property
        def _cur(self) -> duckdb.DuckDBPyConnection: ...

        def transaction(self) -> AbstractContextManager[None]: ...

        def _q(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]: ...

        def _df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame: ...

        def split_rows(self, split: str | None = None) -> tuple[np.ndarray, np.ndarray]: ...

        def row_places(self, example_ids: Sequence[str]) -> np.ndarray: ...
