"""Embedders by name. Members load lazily (their models are large), and import only `engine.embed.base`."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from engine.embed.base import Embedder

if TYPE_CHECKING:
    from engine.store.workspace import Store

# the embedder of a workspace none was chosen for: `$EVOPOOL_EMBEDDER` when set (a machine's choice, e.g. a bench
# comparing two), else all-MiniLM-L6-v2
DEFAULT_EMBEDDER = os.environ.get("EVOPOOL_EMBEDDER") or "minilm"
EMBEDDERS: dict[str, str] = {  # name -> what it is (measured in bench/results/embed_speed.md)
    "minilm": "all-MiniLM-L6-v2, exact float32, length-bucketed batches (the reference)",
    "minilm-bf16": "all-MiniLM-L6-v2 under bfloat16 autocast: same vectors to ~1e-4; for CPUs with bf16",
    "minilm-int8": "all-MiniLM-L6-v2, int8 linear layers: ~2x faster, cosine ~0.98 to float32",
    "static": "token table distilled from all-MiniLM-L6-v2: ~200x faster, ~90% of its classifier F1",
}


def get_embedder(name: str = DEFAULT_EMBEDDER, num_threads: int | None = None) -> Embedder:
    """The embedder registered as `name` (see `EMBEDDERS`). Models load lazily, once per process. `num_threads`: the
    torch threads a MiniLM embedder uses (None: it chooses; the static table uses none)."""
    if name in ("minilm", "minilm-bf16", "minilm-int8"):
        from engine.embed.minilm import MiniLMEmbedder
        return MiniLMEmbedder(precision={"minilm": "fp32", "minilm-bf16": "bf16", "minilm-int8": "int8"}[name],
                              num_threads=num_threads)
    if name == "static":
        from engine.embed.static import StaticEmbedder
        return StaticEmbedder()
    raise KeyError(f"unknown embedder {name!r}; choose one of {', '.join(EMBEDDERS)}")


def workspace_embedder(store: Store, num_threads: int | None = None) -> Embedder:
    """The embedder a workspace reads its texts with: the one chosen for it (`--embedder`), else the default, which
    is then kept as the workspace's own (a later change of the default must not swap its vectors and figures)."""
    name = store.get_meta("embedder", None)
    if name is None:
        name = DEFAULT_EMBEDDER
        store.set_meta("embedder", name)
    return get_embedder(name, num_threads)
