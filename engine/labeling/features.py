"""What the aggregators read beside the votes: each row's text features (embeddings, TF-IDF, relation and masked
views), cached in the store, and which features an aggregator needs."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from engine.aggregators.features import RELATION_NGRAMS, join_unit_rows, tfidf_rows
from engine.aggregators.registry import (
    AGGREGATORS,
    DEFAULT_AGGREGATOR,
    aggregator_entry,
)
from engine.domain import Task
from engine.embed.base import Embedder
from engine.events import EventKind, EventSink, quiet
from engine.store.workspace import Store
from engine.text_views import masked_views, relation_context, task_views


def aggregators_for(task: Task) -> tuple[str, ...]:
    """The aggregators a task can use: vote-only ones give one label per row, so none of them is multi-label."""
    return tuple(a for a in AGGREGATORS if not (task.multi_label and aggregator_entry(a).votes_only))


def feature_kinds(task: Task, aggregator: str) -> tuple[str, ...]:
    """The text views an aggregator reads. `auto` weighs them all: sentence embeddings, TF-IDF n-grams and,
    on relation tasks (two entity spans), TF-IDF of the words between and around the mentions marked by place, the
    classic relation cue that a whole-sentence embedding dilutes, and embeddings of the sentence with the mentions
    masked."""
    if aggregator_entry(aggregator).chooses:
        relation = "between" in task_views(task.fields)
        return ("embedding", "tfidf") + (("relation", "masked") if relation else ())
    return ("embedding",) if aggregator_entry(aggregator).reads_text else ()


def distinct_pairs(frame: pd.DataFrame) -> tuple[list[int], np.ndarray]:
    """The row position of each distinct (text, spans), in first-occurrence order, and each row's index among them.
    The relation views read nothing else of a row, and a corpus repeats them (100K rows resampled from ChemProt's
    train split hold at most its 12,861): each is worked out once per distinct pair."""
    position: dict[tuple[str, str, str], int] = {}
    first: list[int] = []
    inverse = np.empty(len(frame), dtype=np.int64)
    for row, (fields, text) in enumerate(zip(frame["fields"], frame["text"], strict=True)):
        key = (text, repr(fields.get("span1")), repr(fields.get("span2")))
        index = position.setdefault(key, len(position))
        if index == len(first):
            first.append(row)
        inverse[row] = index
    return first, inverse


def relation_texts(frame: pd.DataFrame, distinct: tuple[list[int], np.ndarray] | None = None) -> list[str]:
    """Each row's `relation_context`: the words between and around its two entity mentions, marked by place.
    `distinct`: `distinct_pairs(frame)`, when the caller has it."""
    first, inverse = distinct or distinct_pairs(frame)
    fields, texts = frame["fields"].to_numpy(), frame["text"].to_numpy()
    context = [relation_context({**fields[row], "text": texts[row]}) for row in first]
    return [context[index] for index in inverse]


def text_features(store: Store, frame: pd.DataFrame, kinds: tuple[str, ...],
                  on_event: EventSink = quiet, fit_frame: pd.DataFrame | None = None,
                  embedder: Embedder | None = None) -> dict[str, object]:
    """Named feature matrices for the rows of `frame`: sentence embeddings (cached in the workspace), TF-IDF
    of the text and, for "relation", TF-IDF of the words between and around the two entity mentions. The TF-IDF
    vocabularies are fitted on `fit_frame`'s texts (default: `frame`'s): pass every row of the workspace so a
    row gets the same features whichever splits are being labeled (no label is read there)."""
    from engine.embed.registry import workspace_embedder

    texts = list(frame["text"])
    fit_texts = None if fit_frame is None else list(fit_frame["text"])
    out: dict[str, object] = {}
    reads_vectors = bool({"embedding", "masked"} & set(kinds))
    model = embedder or (workspace_embedder(store) if reads_vectors else None)  # once, for both views
    if "embedding" in kinds:
        from engine.embed.cache import embed_texts

        def progress(done: int, total: int) -> None:
            on_event(EventKind.EMBEDDING, {"done": done, "total": total})

        assert model is not None
        out["embedding"] = embed_texts(store, texts, model, progress)
    if "tfidf" in kinds:
        out["tfidf"] = tfidf_rows(texts, fit_texts=fit_texts)
    distinct = distinct_pairs(frame) if {"masked", "relation"} & set(kinds) else None
    if "masked" in kinds:
        out["masked"] = masked_embeddings(store, frame, on_event, distinct, model)
    if "relation" in kinds:
        context = relation_texts(frame, distinct)
        if any(context):  # no well-formed entity pair anywhere: no such view to learn from
            out["relation"] = tfidf_rows(context, fit_texts=None if fit_frame is None else relation_texts(fit_frame),
                                         word_ngrams=RELATION_NGRAMS)
    return out


def warm_embeddings(store: Store, on_event: EventSink = quiet) -> int:
    """Embed every row the way the default labels will read it (the sentence, and on relation tasks its masked
    views), into the workspace's cache, so the soft labels need not wait for it. Returns the rows covered."""
    from engine.embed.registry import workspace_embedder

    kinds = tuple(k for k in feature_kinds(store.load_task(), DEFAULT_AGGREGATOR) if k in ("embedding", "masked"))
    frame = store.examples_frame()
    # one core for the work ahead, the other for the screens the expert uses
    text_features(store, frame, kinds, on_event, embedder=workspace_embedder(store, num_threads=1))
    return len(frame)


def masked_embeddings(store: Store, frame: pd.DataFrame, on_event: EventSink = quiet,
                      distinct: tuple[list[int], np.ndarray] | None = None,
                      embedder: Embedder | None = None) -> np.ndarray:
    """The "masked" feature of relation tasks: sentence embeddings of the two `masked_views` (mentions replaced
    by X and Y; the sentence, and the part between the mentions), joined. Cached in the workspace like any text."""
    from engine.embed.cache import embed_texts
    from engine.embed.registry import workspace_embedder

    first, inverse = distinct or distinct_pairs(frame)  # joined once per distinct pair, then spread to its rows
    fields, texts = frame["fields"].to_numpy(), frame["text"].to_numpy()
    pairs = [masked_views({**fields[row], "text": texts[row]}) for row in first]
    embedder = embedder or workspace_embedder(store)

    def progress(part: int) -> Callable[[int, int], None]:
        """One count over both views' texts: each call of `embed_texts` counts its own from 0."""
        def report(done: int, total: int) -> None:
            on_event(EventKind.EMBEDDING, {"done": part * total + done, "total": 2 * total, "view": "masked"})
        return report

    joined = join_unit_rows(*(embed_texts(store, [p[i] for p in pairs], embedder, progress(i)) for i in (0, 1)))
    return joined if len(first) == len(frame) else joined[inverse]
