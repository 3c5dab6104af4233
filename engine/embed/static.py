"""A static embedding model distilled from the packaged MiniLM: one vector per vocabulary token.

Why: MiniLM runs at tens of sentences per second on a shared 2-core CPU; a static table embeds tens of
thousands per second and keeps most of the label signal (see bench/results/embed_speed.md).
Recipe (in the spirit of model2vec, written from scratch): run MiniLM over every vocabulary token alone
(`[CLS] token [SEP]`, mean pooling), centre and PCA-reduce the table, and down-weight frequent tokens
(SIF weights, with token frequency estimated from the vocabulary's frequency order, Zipf-style).
A text is the normalised mean of its tokens' rows. The table is built once, on demand, and cached in a
user cache directory (`EVOPOOL_CACHE_DIR`, else `$XDG_CACHE_HOME/evopool`, else `~/.cache/evopool`).
"""
from __future__ import annotations

import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy import sparse

from engine.embed.base import Progress, normalise_rows
from engine.embed.minilm import MODEL_NAME, load_model, model_dir

RECIPE = "v1"  # bump when the distillation changes, so old cached tables are not reused
FIRST_ORDERED_ID = 999  # BERT vocab: ids below are [PAD]/[unusedN]; from here on, roughly by frequency
_lock = threading.Lock()
_tables: dict[tuple[int, float, int | None], tuple[np.ndarray, np.ndarray]] = {}


def cache_dir() -> Path:
    if os.environ.get("EVOPOOL_CACHE_DIR"):
        return Path(os.environ["EVOPOOL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "evopool"


def _variant(dim: int, sif: float, vocab_limit: int | None) -> str:
    limit = "" if vocab_limit is None else f"-top{vocab_limit}"
    return f"static{dim}-sif{sif:g}{limit}-{RECIPE}"


def table_path(dim: int, sif: float, vocab_limit: int | None = None) -> Path:
    return cache_dir() / f"{MODEL_NAME}@{_variant(dim, sif, vocab_limit)}.npz"


def _token_features(rows: list[list[int]]) -> dict[str, Any]:
    import torch

    ids = torch.tensor(rows, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def distill_table(dim: int = 256, sif: float = 1e-3, vocab_limit: int | None = None, batch_size: int = 1024,
                  on_progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(table (vocab, dim), empty-text vector (dim,)) computed from the MiniLM; tens of seconds.

    `vocab_limit` keeps only the most frequent tokens (rows of the others stay zero, so those tokens
    are ignored): a smaller, quicker table, used by the tests.
    """
    import torch

    model = load_model("fp32")
    transformer, pooling = model[0], model[1]  # skip Normalize: the token vectors' norms carry weight
    tokenizer = model.tokenizer
    vocab_size = int(tokenizer.vocab_size)
    special = set(tokenizer.all_special_ids)
    token_ids = [i for i in range(FIRST_ORDERED_ID, vocab_size) if i not in special][:vocab_limit]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    raw = np.zeros((len(token_ids) + 1, 384), dtype=np.float32)  # last row: the empty text
    with torch.inference_mode():
        for start in range(0, len(token_ids), batch_size):
            chunk = token_ids[start:start + batch_size]
            out = pooling(transformer(_token_features([[cls, t, sep] for t in chunk])))
            raw[start:start + len(chunk)] = out["sentence_embedding"].float().numpy()
            if on_progress is not None:
                on_progress(start + len(chunk), len(token_ids))
        raw[-1] = pooling(transformer(_token_features([[cls, sep]])))["sentence_embedding"].float().numpy()[0]
    centred = torch.from_numpy(raw - raw[:-1].mean(axis=0)).double()
    if dim < raw.shape[1]:  # PCA in torch: numpy's BLAS threads fight torch's on a busy CPU (10x slower)
        _, eigvecs = torch.linalg.eigh(centred[:-1].T @ centred[:-1])  # ascending eigenvalues
        centred = centred @ eigvecs[:, -dim:].flip(1)
    vectors = centred.float().numpy()
    rank = np.arange(1, len(token_ids) + 1, dtype=np.float64)
    zipf_p = (1.0 / rank) / np.sum(1.0 / rank)
    weights = sif / (sif + zipf_p) if sif > 0 else np.ones_like(zipf_p)
    table = np.zeros((vocab_size, vectors.shape[1]), dtype=np.float32)
    table[token_ids] = vectors[:-1] * weights[:, None].astype(np.float32)
    empty = normalise_rows(vectors[-1:])[0]
    return table, empty


def load_table(dim: int = 256, sif: float = 1e-3,
               vocab_limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The cached table, distilling and saving it first when absent (atomic write, once per process)."""
    key = (dim, sif, vocab_limit)
    with _lock:
        if key in _tables:
            return _tables[key]
        path = table_path(dim, sif, vocab_limit)
        if path.is_file():
            with np.load(path) as saved:
                table, empty = saved["table"], saved["empty"]
        else:
            table, empty = distill_table(dim, sif, vocab_limit)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
                os.close(fd)
                np.savez(tmp, table=table, empty=empty)
                os.replace(tmp, path)
            except OSError as err:  # a read-only home: keep the table for this process only
                warnings.warn(f"could not cache the static embedding table at {path}: {err}", stacklevel=2)
        _tables[key] = (table, empty)
        return table, empty


class StaticEmbedder:
    """Mean of distilled MiniLM token vectors: no transformer at encode time, so ~100x faster."""

    def __init__(self, dim: int = 256, sif: float = 1e-3, vocab_limit: int | None = None):
        self.dim = dim
        self.sif = sif
        self.vocab_limit = vocab_limit
        self.name = f"{MODEL_NAME}@{_variant(dim, sif, vocab_limit)}"
        self._tokenizer: Any = None

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
            tokenizer.no_padding()
            tokenizer.no_truncation()
            self._tokenizer = tokenizer
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode(self, texts: Sequence[str], on_progress: Progress | None = None) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        table, empty = load_table(self.dim, self.sif, self.vocab_limit)
        ids = self._tokenize(texts)
        indptr = np.zeros(len(ids) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(i) for i in ids])
        flat = np.fromiter((t for row in ids for t in row), dtype=np.int64, count=int(indptr[-1]))
        counts = sparse.csr_matrix((np.ones(len(flat), dtype=np.float32), flat, indptr),
                                   shape=(len(ids), table.shape[0]))
        sums = np.asarray(counts @ table, dtype=np.float32)  # mean and sum differ only in norm
        out = normalise_rows(sums)
        out[np.linalg.norm(sums, axis=1) == 0] = empty  # empty text, or only unknown tokens
        if on_progress is not None:
            on_progress(len(texts), len(texts))
        return out
