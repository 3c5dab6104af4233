"""The error types of importing: one bad row (`RowProblem`) and a refused import (`IngestError`).

They live apart from `importer.py` because the file readers (`readers.py`) and the split drawing
(`splits.py`) raise them too, and `importer.py` imports both of those: a separate module lets all three
share the types without an import cycle. An `IngestError` lists its row problems (the first
MAX_PROBLEMS_SHOWN of them) in its message, so the CLI and the studio can show it as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_PROBLEMS_SHOWN = 50


@dataclass(frozen=True)
class RowProblem:
    row: int  # 1-based data row (CSV: line number minus the header); 0: the file as a whole
    reason: str
    where: str = ""  # the row's own name where "row N" would not find it, e.g. "valid.json record 5" (WRENCH)

    @property
    def place(self) -> int | str:
        """What names the row for the user: its `where`, else its row number."""
        return self.where or self.row

    def __str__(self) -> str:
        return f"{self.where or (f'row {self.row}' if self.row else 'the file')}: {self.reason}"


class IngestError(ValueError):
    """The input cannot be imported as it is; `problems` says where and why."""

    def __init__(self, message: str, problems: list[RowProblem] | None = None):
        self.problems = problems or []
        shown = "\n".join(f"  - {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN])
        more = len(self.problems) - MAX_PROBLEMS_SHOWN
        if more > 0:
            shown += f"\n  - … and {more} more"
        super().__init__(message + (f"\n{shown}" if shown else ""))
