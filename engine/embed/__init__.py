"""Sentence embeddings: the `Embedder` seam (base.py), the registry of embedders by name (registry.py),
the packaged all-MiniLM-L6-v2 (minilm.py), a static token table distilled from it (static.py), and the
workspace cache that computes each vector once (cache.py).

Members import base.py only; the registry loads members lazily. May import `engine.store` for the cache.
"""
