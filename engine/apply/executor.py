"""The default `Executor`: unedited template annotators run compiled in this process, the rest in the sandbox.

`CompiledExecutor.run` splits the pool with `engine.apply.compiled.compile_annotator`: compiled members are
scanned here (engine.apply.compiled.scan, a regex pass per annotator over the pool's views), everything else
(LLM- or human-written code, an edited template, a cue outside the miners' charset) goes to the wrapped
`SandboxExecutor`, unchanged. Results come back in the pool's order with the sandbox's fields; the votes are
the same either way, only faster (tests/test_compiled.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from engine.apply.compiled import CompiledAnnotator, Views, compile_annotator, scan
from engine.domain import ABSTAIN, Annotator, ExecutionResult
from engine.sandbox.executor import Executor, Progress, SandboxExecutor


class CompiledExecutor:
    """An `Executor` that compiles what it can and hands the rest to a sandbox.

    `CompiledExecutor(sandbox=None, *, compiled=True, chunk_rows=65536, **sandbox_options)`: `sandbox` is any
    `Executor` for the code that does not compile (default: a `SandboxExecutor(**sandbox_options)` this object
    owns and closes); `compiled=False` sends everything to the sandbox (the old path, for comparisons);
    compiled annotators scan `chunk_rows` rows at a time, which bounds the memory their views take.
    """

    def __init__(self, sandbox: Executor | None = None, *, compiled: bool = True, chunk_rows: int = 65536,
                 **sandbox_options: Any):
        if sandbox is not None and sandbox_options:
            raise ValueError("give either a sandbox or options for a new one, not both")
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
        self._owns_sandbox = sandbox is None
        self.sandbox: Executor = sandbox if sandbox is not None else SandboxExecutor(**sandbox_options)
        self.compiled = compiled
        self.chunk_rows = chunk_rows

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sandbox's workers if this executor made the sandbox."""
        if self._owns_sandbox and hasattr(self.sandbox, "close"):
            self.sandbox.close()

    def containment(self) -> dict[str, str]:
        """The sandbox's containment layers (compiled annotators run no code of their own)."""
        return self.sandbox.containment()  # type: ignore[attr-defined]

    def split(self, annotators: Sequence[Annotator]) -> tuple[dict[int, CompiledAnnotator], list[int]]:
        """{position: compiled form} of the compiled members, and the positions that go to the sandbox."""
        compiled: dict[int, CompiledAnnotator] = {}
        sandboxed: list[int] = []
        for i, annotator in enumerate(annotators):
            form = compile_annotator(annotator.source) if self.compiled else None
            if form is None:
                sandboxed.append(i)
            else:
                compiled[i] = form
        return compiled, sandboxed

    def run(self, annotators: Sequence[Annotator], examples: Sequence[dict], labels: Sequence[str],
            on_progress: Progress | None = None) -> list[ExecutionResult]:
        """Votes of every annotator on every example, in the order given; `on_progress(done, total)` counts
        annotator-example pairs over both paths."""
        annotators = list(annotators)
        compiled, sandboxed = self.split(annotators)
        n, total = len(examples), len(annotators) * len(examples)
        results: list[ExecutionResult | None] = [None] * len(annotators)
        if compiled:
            for i, result in zip(compiled, self._scan(list(compiled.values()), examples, labels, on_progress, total),
                                 strict=True):
                results[i] = ExecutionResult(annotators[i].id, *result)
        if sandboxed:
            offset = len(compiled) * n

            def forward(done: int, _total: int) -> None:
                if on_progress is not None:
                    on_progress(offset + done, total)

            rest = self.sandbox.run([annotators[i] for i in sandboxed], examples, labels,
                                    forward if on_progress is not None else None)
            for i, executed in zip(sandboxed, rest, strict=True):
                results[i] = executed
        return [r for r in results if r is not None]

    def _scan(self, pool: list[CompiledAnnotator], examples: Sequence[dict], labels: Sequence[str],
              on_progress: Progress | None, total: int) -> list[tuple[np.ndarray, int, str | None, float]]:
        """(votes, faults, first_error, seconds) of each compiled annotator, chunk by chunk of rows."""
        n = len(examples)
        votes = [np.full(n, ABSTAIN, dtype=np.int64) for _ in pool]
        faults, seconds = [0] * len(pool), [0.0] * len(pool)
        errors: list[str | None] = [None] * len(pool)
        for start in range(0, n, self.chunk_rows):
            chunk = examples[start:start + self.chunk_rows]
            for j, out in enumerate(scan(pool, chunk, labels, Views(chunk), offset=start)):
                votes[j][start:start + len(chunk)] = out.votes
                faults[j] += out.faults
                errors[j] = errors[j] or out.first_error
                seconds[j] += out.seconds
            if on_progress is not None:
                on_progress((start + len(chunk)) * len(pool), total)
        return list(zip(votes, faults, errors, seconds, strict=True))


def default_executor(**sandbox_options: Any) -> CompiledExecutor:
    """The executor the CLI, jobs and studio apply pools with: compiled where it can, sandboxed elsewhere. The one
    place that choice is made, so every path gives the same votes at the same speed."""
    return CompiledExecutor(**sandbox_options)
