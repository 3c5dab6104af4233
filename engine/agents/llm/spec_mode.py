"""Structured mode for small models: the model fills a JSON spec, the engine writes the code.

Free code is hard for a small local model (syntax errors, module-level expressions, no `annotate`), but
naming a label and a few cue phrases is within reach. A reply holds JSON objects like
`{"label": "spam", "cues": ["free", "win*"], "view": "sentence"}`; each valid one becomes an `AnnotatorSpec`
rendered by `templates.render` into the same readable annotator the offline agents write.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from engine.domain import Task
from engine.sandbox.checks import LabelIndex
from engine.sandbox.replies import fenced_blocks
from engine.specs.templates import VIEW_PHRASES, AnnotatorSpec, render
from engine.text_views import mined_views, task_views

MAX_CUES = 8
MAX_CUE_WORDS = 4  # longer "cues" are whole sentences copied from the examples: they never generalise
_JSON_START = re.compile(r"[{\[]")
_TRAILING_COMMA = re.compile(r",(\s*[\]}])")
_CLOSES_VALUE = re.compile(r"\s*(?:[,:\]}]|\Z)")  # what may follow a single quote that closes a string
_SPEC_KEYS = ("label", "class")
_THOUGHTS = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_THOUGHT_OPEN = re.compile(r"<think(?:ing)?>", re.IGNORECASE)
_THOUGHT_CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
CUT_OFF = " (the reply hit the max_tokens limit and was cut off: give fewer objects with fewer cues)"
_CUE_WORD = re.compile(r"[a-z0-9]+\*?")
_CUE_SEPARATOR = re.compile(r"[,;|\n]")


def views_for(task: Task, dev: Sequence[dict] | None = None) -> tuple[str, ...]:
    """The views a spec may name on this task (entity views only where examples carry entity spans); given the
    dev rows, the views the offline agents mine there (`mined_views`: no "near" where it copies "between")."""
    return task_views(task.fields) if dev is None else mined_views(task.fields, dev)


def spec_contract(task: Task, labels: str, views: Sequence[str] | None = None) -> str:
    """What a structured reply must hold; replaces the code contract in the system message. `labels`: the label
    names as the contract quotes them (`prompts.contract_labels`); `views`: the views a spec may name (none or
    empty: `views_for(task)`)."""
    views = "; ".join(f'"{v}" = {VIEW_PHRASES[v]}' for v in (views or views_for(task)))
    return (
        "Do not write code. Describe each annotator as one JSON object with these keys:\n"
        f'- "label": exactly one of {labels}: what the annotator votes when a cue appears;\n'
        f'- "cues": a list of 1 to {MAX_CUES} short lower-case words or phrases (at most {MAX_CUE_WORDS} words '
        'each) that signal that label; end a word with * to match its endings (win* matches winner);\n'
        f'- "view": where to look for the cues: {views}.\n'
        "Be precise: pick cues that rarely appear with other labels. Without a cue the annotator abstains.\n"
        'Answer with one ```json block holding a list of objects, e.g. [{"label": ..., "cues": [...], '
        '"view": "sentence"}].'
    )


SCHEMA_NAME = "annotator_specs"
# words of 2-20 letters or digits: no run-on gibberish, which a small model under a grammar tends to drift into
CUE_PATTERN = r"^[a-z0-9]{2,20}( [a-z0-9]{1,20}){0,%d}[*]?$" % (MAX_CUE_WORDS - 1)


def spec_schema(task: Task, n: int, label: str | None = None, vocabulary: list[str] | None = None,
                views: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON schema of a structured reply, for constrained decoding: a server that honours it (llama.cpp,
    vLLM, Ollama, OpenAI) can only emit an object `parse_specs` accepts, which a 135M model cannot manage
    unaided. The root is an object (OpenAI's structured outputs require one); `parse_specs` reads the
    inner objects, so a reply with or without the wrapper parses the same. `label`: the only label allowed
    (a call aimed at one label); `vocabulary`: the only words cues may be (`prompts.label_vocabulary`)."""
    cue: dict[str, Any] = ({"type": "string", "enum": list(vocabulary)} if vocabulary else
                           {"type": "string", "pattern": CUE_PATTERN, "maxLength": 40})
    spec = {"type": "object", "additionalProperties": False, "required": ["label", "cues", "view"],
            "properties": {
                "label": {"type": "string", "enum": [label] if label is not None else list(task.labels)},
                "cues": {"type": "array", "minItems": 1, "maxItems": MAX_CUES, "items": cue},
                "view": {"type": "string", "enum": list(views or views_for(task))}}}
    return {"type": "object", "additionalProperties": False, "required": ["annotators"],
            "properties": {"annotators": {"type": "array", "items": spec, "minItems": 1, "maxItems": max(1, n)}}}


def without_thoughts(text: str) -> str:
    """A reply without the drafts a reasoning model thinks aloud (`<think>...</think>`, when the server has no
    reasoning parser to take them out): they hold cues and code it rejected, which are not its answer. A reply cut
    off while thinking has no answer; one whose template opened the thought has only its closing tag."""
    text, opened = _past_thoughts(text)
    return text[: opened.start()] if opened else text


def still_thinking(text: str) -> bool:
    """Whether the reply ends inside a thought it never closed (cut off while thinking: no answer yet)."""
    return _past_thoughts(text)[1] is not None


def _past_thoughts(text: str) -> tuple[str, re.Match | None]:
    """The reply after its closed thoughts (and after a lone closing tag), and the thought it opened and never
    closed there, if any."""
    text = _THOUGHTS.sub("", text)
    closes = list(_THOUGHT_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    return text, _THOUGHT_OPEN.search(text)


THINKING_CUT_OFF = (" (the reply hit the max_tokens limit while the model was still thinking, before any answer: "
                    "raise EVOPOOL_MAX_TOKENS, or turn the model's thinking off)")
REASONING_ONLY = (" (the server sent only the model's reasoning, no answer: it stopped while thinking; raise "
                  "EVOPOOL_MAX_TOKENS, or turn the model's thinking off)")


def why_no_answer(text: str, cut_off: bool, reasoning_only: bool, cut_off_hint: str) -> str:
    """What to add to "no answer found": the model never got past its thinking (cut off inside <think>, or only
    reasoning_content came back), where "write less" (`cut_off_hint`) would be the wrong advice; else that."""
    if reasoning_only:
        return REASONING_ONLY
    if cut_off and still_thinking(text):
        return THINKING_CUT_OFF
    return cut_off_hint if cut_off else ""


def parse_specs(text: str, task: Task, views: Sequence[str] | None = None, cut_off: bool = False,
                reasoning_only: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """([(rationale, rendered source)], [error per rejected object]) for one structured reply; `views`: the
    views a spec may name (none or empty: `views_for(task)`); `cut_off`: the reply hit the max_tokens limit,
    then named as the likely cause of its last error.

    The answer is what the fenced blocks hold, when any holds a spec (the prose around them may quote an example
    object; some models fence each spec apart); the whole reply outside thoughts, else."""
    answer = without_thoughts(text)
    objects = [found for block in fenced_blocks(answer) for found in _objects(block.body)]
    objects = objects or _objects(answer)
    hint = CUT_OFF if cut_off else ""
    if not objects:
        return [], ['no JSON object found: answer with a ```json list of {"label", "cues", "view"} objects'
                    + why_no_answer(text, cut_off, reasoning_only, CUT_OFF)]
    good, errors = [], []
    for i, obj in enumerate(objects, start=1):
        try:
            spec = to_spec(obj, task, views)
        except ValueError as err:
            errors.append(f"object {i}: {err}" if len(objects) > 1 else str(err))
            continue
        good.append((spec.describe(), render(spec)))
    if errors and hint:
        errors[-1] += hint
    return good, errors


def to_spec(obj: dict[str, Any], task: Task, views: Sequence[str] | None = None) -> AnnotatorSpec:
    """One JSON object -> a checked cue spec; raises ValueError naming what is wrong."""
    label = _label(obj.get("label", obj.get("class")), task)
    raw = obj.get("cues", obj.get("cue_phrases", obj.get("keywords", obj.get("cue"))))
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ValueError('"cues" should be a list of words or short phrases')
    cues: list[str] = []
    # "free, win, prize" (as a string or one item) is three cues, not the phrase "free win prize"
    phrases = [part for item in raw for part in _CUE_SEPARATOR.split(str(item))]
    for item in phrases:
        words = _CUE_WORD.findall(item.lower())
        if 0 < len(words) <= MAX_CUE_WORDS:
            cue = " ".join(words)
            if cue not in cues and cue.strip("*"):
                cues.append(cue)
    if not cues:
        raise ValueError(f'"cues" holds no usable word or phrase of at most {MAX_CUE_WORDS} words')
    view = _view(obj.get("view", obj.get("field", "sentence")), tuple(views or views_for(task)))
    return AnnotatorSpec("cue", label, view, tuple(cues[:MAX_CUES]))


def _label(value: Any, task: Task) -> str:
    """The task's label `value` names: exactly, else the only one equal to it ignoring case and spaces (with labels
    "A" and "a", "a" is "a", never "A")."""
    named = "" if value is None else str(value)  # a label 0 is "0", not missing
    index = LabelIndex(task.labels).of(named)  # as the sandbox reads a vote
    if index is None:
        raise ValueError(f'"label" {value!r} is not one of {", ".join(map(json.dumps, task.labels))}')
    return task.labels[index]


def _view(value: Any, allowed: tuple[str, ...]) -> str:
    name = str(value or "sentence").strip().lower()
    name = {"text": "sentence", "whole": "sentence", "start": "lead", "first words": "lead"}.get(name, name)
    if name not in allowed:
        raise ValueError(f'"view" {value!r} is not one of {", ".join(map(json.dumps, allowed))}')
    return name


def _objects(text: str) -> list[dict[str, Any]]:
    """Every spec (a JSON object with a "label") in a reply, fenced or not, nested in a wrapper or a list or not.
    Each JSON value is decoded whole, so nested values and braces inside strings do not split an object; small
    models' trailing commas (["free", "win",]) and single-quoted strings are tolerated by reading the reply again
    without them, keeping the reading that finds more specs. Only the quotes that open or close a value are
    replaced: {'reason': 'it's spam'} keeps its apostrophe."""
    found = _scan(text)
    double = _double_quoted(text)
    readings = dict.fromkeys((_TRAILING_COMMA.sub(r"\1", text), _TRAILING_COMMA.sub(r"\1", double)))
    for fixed in readings:  # each distinct reading once (without single quotes the two are the same)
        if fixed != text:
            again = _scan(fixed)
            found = again if len(again) > len(found) else found
    return found


def _double_quoted(text: str) -> str:
    """`text` with its single-quoted strings written as JSON strings. Outside a string a ' after [ { , or : opens
    one; inside it \\' is an apostrophe, a " is escaped, and a ' closes it only before , : ] } or the end (so
    'it's', 'rock, 'n' roll' keep theirs); double-quoted strings pass as they are."""
    out: list[str] = []
    quote, last, i = "", "", 0  # the open string's quote; the last character outside strings
    while i < len(text):
        c = text[i]
        if quote == '"':
            out.append(text[i:i + 2] if c == "\\" else c)
            i += 2 if c == "\\" else 1
            quote = "" if c == '"' else quote
            continue
        if quote == "'":
            if c == "\\" and i + 1 < len(text):
                out.append("'" if text[i + 1] == "'" else text[i:i + 2])
                i += 2
                continue
            if c == "'" and _CLOSES_VALUE.match(text, i + 1):
                out.append('"')
                quote, last = "", '"'
            else:
                out.append('\\"' if c == '"' else c)
        elif c in "\"'" and (c == '"' or last in ("[", "{", ",", ":")):
            out.append('"')
            quote = c
        else:
            out.append(c)
            last = c if not c.isspace() else last
        i += 1
    return "".join(out)


def _scan(text: str) -> list[dict[str, Any]]:
    """The specs of every JSON value that decodes at a { or [ of `text`, left to right; a value's inside is not
    scanned again, and a position where nothing decodes (a cut-off list) is passed to reach what is inside."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := _JSON_START.search(text, at)) is not None:
        try:
            value, at = decoder.raw_decode(text, start.start())
        except json.JSONDecodeError:
            at = start.start() + 1
            continue
        found += _specs_in(value)
    return found


def _specs_in(value: Any) -> list[dict[str, Any]]:
    """The objects with a "label" in a decoded value: itself, or those in its lists and wrapper objects."""
    if isinstance(value, dict):
        if any(key in value for key in _SPEC_KEYS):
            return [value]
        return [spec for inner in value.values() for spec in _specs_in(inner)]
    if isinstance(value, list):
        return [spec for item in value for spec in _specs_in(item)]
    return []
