"""The fitted labeler: the pool's annotators, the aggregator fitted once on the workspace's dev rows, the
fitted TF-IDF vocabularies and the embedder's name, in one picklable value a worker can label batches with.

Fitting reads the workspace (and may add the pool's dev votes to it, as `evopool export` does); labeling a
batch reads nothing but the batch: votes from the worker's own sandbox, embeddings from the worker's own
copy of the embedder. So the same labeler gives the same labels wherever a batch is labeled.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.aggregators.base import Aggregator
from engine.aggregators.features import RELATION_NGRAMS, TfidfFeatures, fitted_tfidf, join_unit_rows
from engine.aggregators.registry import MultiLabelEvoAgg, aggregator_entry, make_aggregator, predict_labels
from engine.apply.votes import ensure_votes
from engine.corpus.reading import CorpusBatch, CorpusError
from engine.domain import ABSTAIN, Annotator
from engine.embed.registry import DEFAULT_EMBEDDER
from engine.export.files import add_label_columns, field_cell, field_column, label_separator
from engine.labeling.features import feature_kinds, masked_embeddings, relation_texts
from engine.labeling.fit import THRESHOLD, fit_on_dev, hard_labels, student_unlabeled_rows
from engine.sandbox.executor import Executor
from engine.store.workspace import Store
from engine.text_views import masked_views, relation_context

_EMBEDDERS: dict[str, Any] = {}  # one loaded embedder per worker process


@dataclass(frozen=True)
class LabeledBatch:
    """A batch's rows as the export writes them, and the sandbox's fault counts on it."""

    frame: pd.DataFrame
    faults: dict[str, int]  # annotator id -> examples where it crashed, timed out or returned a bad value
    first_errors: dict[str, str]


@dataclass
class Labeler:
    labels: tuple[str, ...]
    annotators: tuple[Annotator, ...]
    aggregator: str  # asked for (registry name)
    made_by: str  # what the rows name: `auto:<what it chose>` for auto
    model: Any  # the fitted aggregator
    embedder: str | None  # None: the aggregator reads no embeddings
    vocabularies: dict[str, TfidfFeatures]  # "tfidf" / "relation" -> fitted on the workspace's texts
    text_column: str = "text"
    id_column: str = "id"
    multi_label: bool = False
    threshold: float = THRESHOLD
    separator: str = "|"
    masked: bool = False  # relation tasks: embeddings of the sentence with the mentions masked (`masked_views`)
    provenance: dict[str, Any] = field(default_factory=dict)

    # ---- labeling one batch (on a worker) ------------------------------------------------------
    def examples(self, batch: CorpusBatch) -> tuple[list[str], list[str], list[dict]]:
        """(ids, texts, annotator inputs) of a batch; ids are the id column or `<file>:<row>`."""
        frame = batch.frame
        text_column, id_column = column_named(frame, self.text_column), column_named(frame, self.id_column)
        if text_column is None:
            raise CorpusError(f"input file {batch.source} has no text column {self.text_column!r}; its columns: "
                              f"{', '.join(map(str, frame.columns))} (name one with --text-column)")
        if id_column is None and self.id_column != "id":  # named by the user: a typo must not give row-number ids
            raise CorpusError(f"input file {batch.source} has no id column {self.id_column!r}; its columns: "
                              f"{', '.join(map(str, frame.columns))} (name one with --id-column)")
        texts = ["" if _missing(t) else str(t) for t in frame[text_column]]
        name = self.provenance.get("file_names", {}).get(batch.source, Path(batch.source).name)
        if id_column is not None:
            ids = [_id_text(v, batch, i, id_column) for i, v in enumerate(frame[id_column])]
        else:
            ids = [f"{name}:{batch.first_row + i}" for i in range(len(frame))]
        columns = [c for c in frame.columns if c not in (text_column, id_column)]
        cells = {c: frame[c].tolist() for c in columns}
        inputs = [{**{c: _plain(cells[c][i]) for c in columns}, "text": texts[i]} for i in range(len(frame))]
        return ids, texts, inputs

    def features(self, texts: list[str], inputs: list[dict]) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.embedder:
            out["embedding"] = _embedder(self.embedder).encode(texts)
        if "tfidf" in self.vocabularies:
            out["tfidf"] = self.vocabularies["tfidf"].transform(texts)
        if "relation" in self.vocabularies:
            out["relation"] = self.vocabularies["relation"].transform([relation_context(x) for x in inputs])
        if self.masked and self.embedder:
            pairs = [masked_views(x) for x in inputs]
            encode = _embedder(self.embedder).encode
            out["masked"] = join_unit_rows(*(encode([p[i] for p in pairs]) for i in (0, 1)))
        return out or None

    def label(self, batch: CorpusBatch, executor: Executor) -> LabeledBatch:
        """The batch's rows with hard label, confidence, per-class probabilities, votes and provenance."""
        ids, texts, inputs = self.examples(batch)
        results = executor.run(self.annotators, inputs, list(self.labels))
        votes = (np.column_stack([r.votes for r in results]) if results
                 else np.full((len(ids), 0), ABSTAIN, dtype=np.int64))
        features = self.features(texts, inputs)
        n_votes = (votes != ABSTAIN).sum(axis=1)
        if self.multi_label:
            used = votes if aggregator_entry(self.aggregator).reads_votes else votes[:, :0]
            probs = self.model.predict_proba(used, features)
            hard = predict_labels(probs, self.threshold)
        else:
            probs = self.model.predict_proba(votes, features)
            hard = hard_labels(self.aggregator, probs, n_votes)
        out = pd.DataFrame({"id": ids, "text": texts})
        labeled = pd.DataFrame(index=out.index)
        add_label_columns(labeled, self.labels, probs, hard, n_votes, self.made_by, self.separator)
        ours = {*out.columns, *labeled.columns, "source_file", "source_row"}
        named = (column_named(batch.frame, self.text_column), column_named(batch.frame, self.id_column))
        kept = [c for c in batch.frame.columns if c not in named]
        taken = ours | {str(c) for c in kept}  # a corpus holding `label` and `field_label` keeps both
        for column in kept:  # the corpus's other columns ride along, as export keeps fields
            # the user's `label` or `confidence` must not overwrite ours: `field_label`
            out[field_column(str(column), ours, taken)] = _kept_cells(batch.frame[column])
        out = pd.concat([out, labeled], axis=1)
        out["source_file"] = batch.source
        out["source_row"] = np.arange(batch.first_row, batch.first_row + len(ids), dtype=np.int64)
        faults = {r.annotator_id: int(r.faults) for r in results if r.faults}
        errors = {r.annotator_id: str(r.first_error) for r in results if r.first_error}
        return LabeledBatch(out, faults, errors)


def column_named(frame: pd.DataFrame, name: str) -> Any | None:
    """The column called `name`, or else the one column whose name differs only in case and surrounding spaces
    ("ID", " Text"), or None when there is none: a corpus exported by a spreadsheet rarely keeps our lower case,
    and an id column missed by case silently gave every row a `<file>:<row>` id. Two such columns and no exact
    match: an error naming them (which one is meant would be a guess)."""
    if name in frame.columns:
        return name
    wanted = name.strip().casefold()
    alike = [c for c in frame.columns if str(c).strip().casefold() == wanted]
    if len(alike) > 1:
        raise CorpusError(f"columns {', '.join(repr(str(c)) for c in alike)} all stand for {name!r}: rename all but "
                          "one (or name the text column with --text-column)")
    return alike[0] if alike else None


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


def _id_text(value: Any, batch: CorpusBatch, i: int, column: str) -> str:
    """A row's id as text, the same whatever else its batch holds: an integer id read as a float (its column had a
    gap) is still `7`, not `7.0`; a row without an id is an error naming it, not the id `nan`."""
    if _missing(value):
        raise CorpusError(f"input file {batch.source}: data row {batch.first_row + i} has no {column!r} value (every "
                          "row needs one, or drop the id column to get `<file>:<row>` ids)")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if isinstance(value, np.generic) else value)


def _kept_cells(column: pd.Series) -> Any:
    """A corpus column as its shard writes it: typed columns as they are; in the rest lists and dicts as JSON, as
    `export` writes fields (an entity span is `[3, 9]`), JSON's `1` beside `2.5` as numbers, and a column mixing other
    kinds of value (`1` and `"x"` in JSONL, which Parquet cannot hold in one column) as text."""
    if column.dtype != object:
        return column.to_numpy()
    cells = [field_cell(_plain(v)) for v in column]
    kinds = {type(c) for c in cells if c is not None}
    if kinds == {int, float}:
        cells = [None if c is None else float(c) for c in cells]
    elif len(kinds) > 1:
        cells = [None if c is None else str(c) for c in cells]
    kept = np.empty(len(cells), dtype=object)  # as objects: a list put in a frame makes [None, 7] floats again
    kept[:] = cells
    return kept


def _plain(value: Any) -> Any:
    """A cell as plain Python, as the importer keeps fields (numpy values become lists / numbers, NaN None)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and np.isnan(value) else value


def dev_digest(dev: pd.DataFrame) -> str:
    """A short digest of the dev rows the aggregator is fitted on (id, label or label set, audit): an expert's
    new label moves it, so a corpus run fitted before that is not resumed by one fitted after (no generation moves)."""
    rows = [[str(i), None if pd.isna(label) else int(label), None if members is None else list(members), bool(audit)]
            for i, label, members, audit in zip(dev["id"], dev["label"], dev["label_set"], dev["audit"], strict=True)]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _embedder(name: str):
    if name not in _EMBEDDERS:
        from engine.embed.registry import get_embedder
        _EMBEDDERS[name] = get_embedder(name)
    return _EMBEDDERS[name]


# ---- fitting (on the driver) ---------------------------------------------------------------------
def fit_labeler(store: Store, executor: Executor, aggregator: str = "auto", seed: int = 0,
                text_column: str = "text", threshold: float = THRESHOLD, id_column: str = "id") -> Labeler:
    """Fit `aggregator` on the workspace's dev rows (Dawid–Skene: on every row's votes, it reads no labels).

    TF-IDF vocabularies are fitted on every workspace text (no labels are read), as `export` does."""
    entry = aggregator_entry(aggregator)
    task = store.load_task()
    pool = store.pool_ids()
    if not pool and entry.votes_only:
        raise ValueError("the pool is empty: run a generation (or approve an annotator) first")
    if task.multi_label and entry.votes_only:
        raise ValueError(f"{aggregator!r} gives one label per row and cannot label a multi-label task; use "
                         "'evoagg', 'auto' or 'auto-pool', or 'embedding'")
    chooser = entry.chooses and not task.multi_label  # may teach a student on the unlabeled rows
    fit_splits = ("dev", "test", "pool") if entry.fits_unlabeled else ("dev", "pool") if chooser else ("dev",)
    for split in fit_splits:
        if store.count_examples(split):
            ensure_votes(store, executor, pool, split)
    everything = store.examples_frame()
    frame = everything if entry.fits_unlabeled else \
        everything[everything["split"].isin(fit_splits)].reset_index(drop=True)
    unl = np.zeros(0, dtype=int)
    if not entry.fits_unlabeled and not task.multi_label:
        # only dev and the student's sample are read: embedding every pool row (100K imported) cost minutes for nothing
        # the rows export's student reads, no others
        unl = student_unlabeled_rows(frame, chooser, seed, len(task.labels))
        kept = np.union1d(np.flatnonzero((frame["split"] == "dev").to_numpy()), unl)
        frame, unl = frame.iloc[kept].reset_index(drop=True), np.searchsorted(kept, unl)  # the sample's order kept
    votes = store.vote_matrix(pool, example_ids=list(frame["id"])).votes
    kinds = ("embedding",) if task.multi_label else feature_kinds(task, aggregator)
    embedder = store.get_meta("embedder", DEFAULT_EMBEDDER) if "embedding" in kinds else None
    vocabularies: dict[str, TfidfFeatures] = {}
    features: dict[str, Any] = {}
    if embedder:
        from engine.embed.cache import embed_texts
        features["embedding"] = embed_texts(store, list(frame["text"]), _embedder(embedder))
    if "tfidf" in kinds:
        vocabularies["tfidf"] = fitted_tfidf(list(everything["text"]))  # as export fits it
        features["tfidf"] = vocabularies["tfidf"].transform(list(frame["text"]))
    if "relation" in kinds:
        context_all = relation_texts(everything)
        if any(context_all):
            vocabularies["relation"] = fitted_tfidf(context_all, word_ngrams=RELATION_NGRAMS)
            features["relation"] = vocabularies["relation"].transform(relation_texts(frame))
    if "masked" in kinds and embedder:
        features["masked"] = masked_embeddings(store, frame)
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    audit = frame["audit"].to_numpy(dtype=bool)[dev]
    dev_features = {k: v[dev] for k, v in features.items()} or None
    if task.multi_label:
        position = {e: i for i, e in enumerate(store.example_ids("dev"))}
        Y_dev = store.label_matrix("dev")[[position[e] for e in frame["id"].to_numpy()[dev]]]
        used = votes if entry.reads_votes else votes[:, :0]
        model: Aggregator = MultiLabelEvoAgg(len(task.labels), seed=seed).fit(used[dev], Y_dev, dev_features)
        made_by = "auto:evoagg" if entry.evoagg_on_multi_label else aggregator
    else:
        model = make_aggregator(aggregator, len(task.labels), seed)
        if entry.fits_unlabeled:
            model.fit(votes, None, features or None)
        else:
            y_dev = frame["label"].to_numpy()[dev].astype(int)
            unlabeled = (votes[unl], {k: v[unl] for k, v in features.items()} or None) if len(unl) else None
            fit_on_dev(model, aggregator, votes[dev], y_dev, dev_features, audit,
                       store.last_complete_generation() > 0, unlabeled)  # as export does: same choice, same labels
        made_by = f"auto:{model.chosen_}" if hasattr(model, "chosen_") else aggregator
    provenance = {"workspace": str(store.path), "task": task.name, "generation": store.last_complete_generation(),
                  "pool": list(pool), "seed": seed, "dev_rows": int(len(dev)),
                  "dev_labels": dev_digest(frame.iloc[dev]), "embedder": embedder}
    return Labeler(task.labels, tuple(store.annotators(pool)), aggregator, made_by, model, embedder, vocabularies,
                   text_column=text_column, id_column=id_column, multi_label=task.multi_label, threshold=threshold,
                   separator=label_separator(store), masked="masked" in features, provenance=provenance)
