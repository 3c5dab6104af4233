"""Files written whole or not at all: a reader (another screen, a killed run's restart) never sees half a file."""
from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside `path` under a temporary name, flush it to disk, then rename: a run killed midway leaves
    no file at `path` that looks complete (at most a hidden `.<name>.partial-<pid>`)."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with open(partial, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
