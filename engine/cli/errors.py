"""What a command reports as one line with exit code 1, and the errors that say what is missing."""
from __future__ import annotations

from engine.corpus.engines import EngineUnavailable
from engine.corpus.reading import CorpusError
from engine.corpus.shards import OutputError
from engine.ingest.errors import IngestError
from engine.llm.seam import LLMError
from engine.store.workspace import WorkspaceUnavailable

# What a command reports as "error: <one line>" with exit code 1; anything else is a bug and shows its traceback.
DOMAIN_ERRORS = (IngestError, WorkspaceUnavailable, LLMError, ValueError, OSError,  # ValueError: e.g. a bad gate file
                 CorpusError, OutputError, EngineUnavailable)


class UsageError(Exception):
    """The command line lacks something only the workspace's state shows is needed (exit 2, with usage)."""


class NotAdded(Exception):
    """`pool add`: the checks refused the code or the gate rejected it without --approve (exit 1)."""


class MissingExtra(Exception):
    """An option needs an optional extra that is not installed (exit 1, with how to install it)."""


class NoData(Exception):
    """The workspace holds no data yet, so there is nothing to evaluate, export or list (exit 1)."""
