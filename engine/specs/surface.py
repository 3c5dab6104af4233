"""Surface features of raw text (links, digits, capitals, length, ...) for threshold annotators.

Each feature has a Python function (used to mine thresholds on dev) and the same logic as source text
(emitted into the annotator), plus a phrase for docstrings. Tests check that both agree.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from engine.text_views import normalise

_LINK = re.compile(r"https?://|www\.|\.(?:com|net|org|ly|co\.uk)\b", re.IGNORECASE)
_LONG_NUMBER = re.compile(r"\d{5,}")


def _caps_share(text: str) -> float:
    letters = [ch for ch in text if ch.isalpha()]
    return round(sum(ch.isupper() for ch in letters) / len(letters), 2) if len(letters) >= 8 else 0.0


MEASURES: dict[str, Callable[[str], float]] = {
    "links": lambda text: float(len(_LINK.findall(text))),
    "digits": lambda text: float(sum(ch.isdigit() for ch in text)),
    "long_numbers": lambda text: float(len(_LONG_NUMBER.findall(text))),
    "caps_share": _caps_share,
    "exclamations": lambda text: float(text.count("!")),
    "currency": lambda text: float(sum(text.count(sym) for sym in "£$€")),
    "words": lambda text: float(len(normalise(text).split())),
}

SOURCE = {
    "links": (
        'LINK = re.compile(r"https?://|www\\.|\\.(?:com|net|org|ly|co\\.uk)\\b", re.IGNORECASE)',
        "Number of web links or domain names.",
        "return len(LINK.findall(text))",
    ),
    "digits": ("", "Number of digit characters (phone numbers, short codes, prices).",
               "return sum(ch.isdigit() for ch in text)"),
    "long_numbers": ('LONG_NUMBER = re.compile(r"\\d{5,}")', "Number of runs of five or more digits.",
                     "return len(LONG_NUMBER.findall(text))"),
    "caps_share": (
        "",
        "Share of capital letters among the letters (0 for texts under 8 letters).",
        "letters = [ch for ch in text if ch.isalpha()]\n"
        "    if len(letters) < 8:\n"
        "        return 0.0\n"
        "    return round(sum(ch.isupper() for ch in letters) / len(letters), 2)",
    ),
    "exclamations": ("", "Number of exclamation marks.", 'return text.count("!")'),
    "currency": ("", "Number of currency symbols.", 'return sum(text.count(sym) for sym in "£$€")'),
    "words": ("", "Number of words.", 'return len(re.findall(r"[a-z0-9]+", text.lower()))'),
}

_PHRASE = {
    "links": "web links",
    "digits": "digits",
    "long_numbers": "long numbers (5+ digits)",
    "caps_share": "share of capital letters",
    "exclamations": "exclamation marks",
    "currency": "currency symbols",
    "words": "words",
}


def format_threshold(threshold: float) -> str:
    return str(int(threshold)) if float(threshold).is_integer() else repr(round(float(threshold), 2))


def describe_surface(feature: str, op: str, threshold: float) -> str:
    bound = "at least" if op == ">=" else "at most"
    if feature == "caps_share":
        return f"capital letters make up {bound} {threshold:.0%} of the letters"
    return f"the text has {bound} {format_threshold(threshold)} {_PHRASE.get(feature, feature)}"


def measure_all(texts: list[str]) -> dict[str, np.ndarray]:
    """Every surface feature on every text: feature -> (n,) float array."""
    return {name: np.array([fn(t) for t in texts], dtype=np.float64) for name, fn in MEASURES.items()}


def threshold_grid(values: np.ndarray) -> list[float]:
    """Candidate thresholds: the distinct values at a few quantiles (skipping the always-true ones)."""
    if not values.size:
        return []
    qs = np.quantile(values, [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
    digits = 0 if np.all(values == np.round(values)) else 2  # counts get whole-number thresholds
    return sorted({float(np.round(q, digits)) for q in qs})


def fires(values: np.ndarray, op: str, threshold: float) -> np.ndarray:
    return values >= threshold if op == ">=" else values <= threshold
