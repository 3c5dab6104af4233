"""Sentence embeddings: the real packaged MiniLM (offline), the workspace cache, dedupe, the static table."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pytest

from engine.embed import minilm as embed_minilm
from engine.embed import shared_cache
from engine.embed import static as embed_static
from engine.embed.base import text_hash
from engine.embed.cache import embed_split, embed_texts
from engine.embed.minilm import MiniLMEmbedder, ThreadTuner, length_batches
from engine.embed.registry import get_embedder
from engine.embed.static import StaticEmbedder
from engine.store.workspace import Store

CAT, KITTEN = "the cat sat on the mat", "a kitten sits on a rug"
MARKET = "the stock market fell sharply today"


class CountingEmbedder:
    """Wraps a real embedder and records every text it is asked to encode."""

    def __init__(self, inner):
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.calls: list[list[str]] = []

    def encode(self, texts, on_progress=None):
        self.calls.append(list(texts))
        return self.inner.encode(texts, on_progress)

    @property
    def encoded(self) -> list[str]:
        return [t for call in self.calls for t in call]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture()
def store(tmp_path):
    yield Store.open(tmp_path / "ws")
    Store.close_all()


@pytest.fixture(autouse=True)
def own_user_cache(tmp_path, monkeypatch) -> Path:
    """Each test its own user cache: what it embeds is not already there from another test."""
    monkeypatch.setenv("EVOPOOL_CACHE", str(tmp_path / "user-cache"))
    shared_cache.forget()
    return tmp_path / "user-cache"


def test_a_second_workspace_takes_the_vectors_of_the_first_from_the_user_cache(tmp_path, minilm):
    first = embed_texts(Store.open(tmp_path / "first"), [CAT, MARKET], minilm)
    shared_cache.forget()  # read back from disk, as another process would
    counting = CountingEmbedder(minilm)
    second_store = Store.open(tmp_path / "second")
    progress: list[tuple[int, int]] = []
    second = embed_texts(second_store, [MARKET, KITTEN, CAT], counting, lambda d, t: progress.append((d, t)))
    assert counting.encoded == [KITTEN]  # only the text the first workspace never had
    assert np.array_equal(second[[2, 0]], first)  # the very vectors, not a recomputation
    assert progress[0] == (2, 3) and progress[-1] == (3, 3)
    kept = second_store.cached_embeddings(minilm.name, [text_hash(CAT), text_hash(MARKET)])
    assert set(kept) == {text_hash(CAT), text_hash(MARKET)}  # now in the workspace too: it works without the cache


def test_the_user_cache_can_be_turned_off_and_a_damaged_shard_is_skipped(tmp_path, minilm, monkeypatch,
                                                                          own_user_cache):
    embed_texts(Store.open(tmp_path / "first"), [CAT], minilm)
    shards = list((own_user_cache / "embeddings" / minilm.name).glob("*.npy"))
    assert len(shards) == 1
    shards[0].write_bytes(b"not a shard")  # a disk fault
    shared_cache.forget()
    counting = CountingEmbedder(minilm)
    embed_texts(Store.open(tmp_path / "second"), [CAT], counting)
    assert counting.encoded == [CAT]  # embedded again, no error
    monkeypatch.setenv("EVOPOOL_CACHE", "off")
    shared_cache.forget()
    assert shared_cache.cache_root() is None and shared_cache.lookup(minilm.name, [text_hash(CAT)]) == {}
    counting = CountingEmbedder(minilm)
    embed_texts(Store.open(tmp_path / "third"), [CAT], counting)
    assert counting.encoded == [CAT]


def test_packaged_model_loads_without_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted while loading the model")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = embed_minilm._load_fp32()  # a fresh load, not the process cache
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert model.get_embedding_dimension() == 384


def test_minilm_gives_unit_vectors_where_similar_sentences_are_closer(minilm):
    vectors = minilm.encode([CAT, KITTEN, MARKET])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.3
    assert sims[0, 1] > sims[1, 2] + 0.3


def test_length_bucketing_keeps_sentence_transformers_vectors(minilm):
    texts = [MARKET, "hi", CAT + " " + KITTEN + " " + MARKET, KITTEN, "", CAT]
    progress: list[tuple[int, int]] = []
    ours = MiniLMEmbedder(batch_size=2).encode(texts, on_progress=lambda d, t: progress.append((d, t)))
    reference = embed_minilm.load_model().encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(np.sum(ours * reference, axis=1), 1.0, atol=1e-5)
    assert progress == [(2, 6), (4, 6), (6, 6)]


def test_length_batches_go_longest_first_within_size_and_token_budget():
    lengths = np.array([5, 40, 10, 40, 7, 100])
    batches = length_batches(lengths, batch_size=2, max_batch_tokens=90)
    # sorted by length (stable): 5(100), 1(40), 3(40), 2(10), 4(7), 0(5); budget 90 lets 100 go alone
    assert [b.tolist() for b in batches] == [[5], [1, 3], [2, 4], [0]]


def test_thread_tuner_probes_then_keeps_the_faster_choice_and_backs_off():
    tuner = ThreadTuner((2, 1), probes=2, every=6, max_every=12)
    busy, idle = {2: 100.0, 1: 150.0}, {2: 300.0, 1: 150.0}  # tokens per second of each thread count
    picked = []
    for batch in range(28):
        speed = busy if batch < 18 else idle
        threads = tuner.pick()
        picked.append(threads)
        tokens = 1000 - 30 * batch  # length-sorted batches shrink
        tuner.record(threads, tokens, tokens / speed[threads])
        if batch == 9:
            assert tuner.best == 1 and tuner.every == 12  # same winner twice: probe half as often
    assert picked == [2, 1, 2, 1, 1, 1,  # probe twice each, one thread wins (a change: next cycle after 6)
                      2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1,  # probe, one thread again: cycle of 12
                      2, 1, 2, 1, 2, 2,  # idle now: two threads win, cycles back to 6
                      2, 1, 2, 1]
    assert tuner.best == 2 and tuner.every == 12
    assert ThreadTuner((1, 1)).choices == (1,) and ThreadTuner((1,)).pick() == 1


def test_second_call_is_served_from_the_workspace(store, minilm):
    counting = CountingEmbedder(minilm)
    first = embed_texts(store, [CAT, MARKET, KITTEN], counting)
    assert sorted(counting.encoded) == sorted([CAT, MARKET, KITTEN])
    counting.calls.clear()
    progress: list[tuple[int, int]] = []
    second = embed_texts(store, [CAT, MARKET, KITTEN], counting,
                         on_progress=lambda d, t: progress.append((d, t)))
    assert counting.calls == []
    assert np.array_equal(first, second)
    assert progress == [(3, 3)]
    np.testing.assert_allclose(first, minilm.encode([CAT, MARKET, KITTEN]), atol=1e-6)
    # a new text alone is embedded; the cached ones are not recomputed
    third = embed_texts(store, [KITTEN, "a brand new sentence"], counting)
    assert counting.encoded == ["a brand new sentence"]
    assert np.array_equal(third[0], first[2])


def test_identical_texts_are_embedded_once(store, minilm):
    counting = CountingEmbedder(minilm)
    progress: list[tuple[int, int]] = []
    vectors = embed_texts(store, [CAT, MARKET, CAT, CAT], counting,
                          on_progress=lambda d, t: progress.append((d, t)))
    assert sorted(counting.encoded) == sorted([CAT, MARKET])
    assert vectors.shape == (4, 384)
    assert np.array_equal(vectors[0], vectors[2]) and np.array_equal(vectors[0], vectors[3])
    assert progress[0] == (0, 2) and progress[-1] == (2, 2)
    stored = store.cached_embeddings(minilm.name, [text_hash(CAT), text_hash(MARKET)])
    assert set(stored) == {text_hash(CAT), text_hash(MARKET)}


def test_cache_is_per_embedder_name(store, minilm, tiny_static):
    embed_texts(store, [CAT], minilm)
    counting = CountingEmbedder(tiny_static)
    vectors = embed_texts(store, [CAT], counting)
    assert counting.encoded == [CAT] and vectors.shape == (1, tiny_static.dim)


def test_embed_split_follows_store_order(store, minilm):
    frame = pd.DataFrame({"id": ["b", "a", "c", "d"], "text": [MARKET, CAT, KITTEN, CAT],
                          "fields": [{}, {}, {}, {}], "split": ["dev", "dev", "pool", "dev"],
                          "label": [0, 1, None, 1]})
    store.add_examples("demo", "test", frame)
    ids, matrix = embed_split(store, "dev", minilm)
    assert ids == ["b", "a", "d"]
    np.testing.assert_allclose(matrix, minilm.encode([MARKET, CAT, CAT]), atol=1e-6)


def test_empty_input_and_unknown_name(store, minilm):
    assert embed_texts(store, [], minilm).shape == (0, 384)
    with pytest.raises(KeyError, match="unknown embedder"):
        get_embedder("word2vec")


@pytest.fixture(scope="module")
def tiny_static(tmp_path_factory) -> Iterator[StaticEmbedder]:
    """A static table over the 3,000 most frequent tokens, distilled into a temp cache dir (seconds)."""
    cache = tmp_path_factory.mktemp("evopool-cache")
    before = os.environ.get("EVOPOOL_CACHE_DIR")
    os.environ["EVOPOOL_CACHE_DIR"] = str(cache)
    yield StaticEmbedder(dim=64, vocab_limit=3000)
    if before is None:
        os.environ.pop("EVOPOOL_CACHE_DIR", None)
    else:
        os.environ["EVOPOOL_CACHE_DIR"] = before


def test_static_embedder_contract_and_similarity_order(tiny_static):
    texts = ["a small dog ran in the park", "a dog slept on the floor", "the government raised taxes", ""]
    vectors = tiny_static.encode(texts)
    assert vectors.shape == (4, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]
    assert tiny_static.name != get_embedder("static").name


def test_static_table_is_cached_on_disk_and_reloaded(tiny_static):
    first = tiny_static.encode([CAT, MARKET])
    path = embed_static.table_path(64, tiny_static.sif, 3000)
    assert path.is_file()
    embed_static._tables.clear()  # force a reload from the file, not a new distillation
    mtime = path.stat().st_mtime_ns
    np.testing.assert_array_equal(StaticEmbedder(dim=64, vocab_limit=3000).encode([CAT, MARKET]), first)
    assert path.stat().st_mtime_ns == mtime


def test_the_masked_views_progress_counts_both_views_once(store, minilm, monkeypatch):
    """The masked feature embeds two views of each row, one call each: both had reported 0..n, so the job's count
    went back to 0 halfway."""
    import engine.embed.registry as registry
    from engine.labeling import features

    monkeypatch.setattr(registry, "get_embedder", lambda name="minilm", num_threads=None: minilm)
    frame = pd.DataFrame({"text": ["aspirin inhibits cox", "drug binds the receptor"],
                          "fields": [{"span1": [0, 7], "span2": [17, 20]}, {"span1": [0, 4], "span2": [15, 23]}]})
    events = []
    features.masked_embeddings(store, frame, lambda kind, payload: events.append((payload["done"], payload["total"])))
    done = [d for d, _ in events]
    assert done == sorted(done) and events[-1] == (4, 4) and {t for _, t in events} == {4}


def test_an_embedder_asked_for_one_thread_keeps_to_it(tmp_path):
    """The embedding ahead runs on one torch thread (the other core stays with the screens): the registry says so."""
    from engine.embed.registry import workspace_embedder
    from engine.store.workspace import Store

    store = Store.open(tmp_path / "ws")
    assert workspace_embedder(store, num_threads=1).num_threads == 1
    assert get_embedder("minilm-int8", num_threads=1).num_threads == 1
    assert get_embedder("minilm").num_threads is None  # left to its tuner
