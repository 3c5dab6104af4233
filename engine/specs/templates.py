"""Code emission for the offline proposer: an `AnnotatorSpec` becomes plain, readable annotator source.

The emitted module keeps its parameters in top-level constants (`LABEL`, `VIEW`, `CUES`, ...), so the
refiner can read a parent back with `parse_spec` instead of guessing from arbitrary code.
The view helpers below are the source-code twins of `engine.text_views.view_text`; tests check they agree.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from engine import text_views as views
from engine.specs import surface

VIEW_PHRASES = {
    "sentence": "anywhere in the text",
    "lead": "among the first words of the text",
    "between": "between the two entity mentions",
    "near": f"between the two entity mentions, when at most {views.NEAR} words apart",
    "before": "just before the first entity mention",
    "after": "just after the second entity mention",
    "entity1": "in the first entity's name",
    "entity2": "in the second entity's name",
}

_NORMALISE = '''
def normalise(text: object) -> str:
    """Lower-case words joined by single spaces, so cue regexes see clean word boundaries."""
    return " ".join(re.findall(r"[a-z0-9]+", str(text or "").lower()))
'''

_VIEW_HELPERS = {
    "sentence": '''
def view(example: dict) -> str:
    """The whole text, normalised."""
    return normalise(example.get("text"))
''',
    "lead": f'''
def view(example: dict) -> str:
    """The first {views.LEAD} words of the text (question word and head noun)."""
    return " ".join(normalise(example.get("text")).split()[:{views.LEAD}])
''',
    "entity1": '''
def view(example: dict) -> str:
    """The first entity's name, normalised."""
    return normalise(example.get("entity1"))
''',
    "entity2": '''
def view(example: dict) -> str:
    """The second entity's name, normalised."""
    return normalise(example.get("entity2"))
''',
    "between": '''
def view(example: dict) -> str:
    """Words strictly between the two entity mentions ('' when spans are missing or overlap)."""
    try:
        (_, first_end), (second_start, _) = sorted([tuple(example["span1"]), tuple(example["span2"])])
        return normalise(str(example.get("text") or "")[first_end:second_start])
    except (KeyError, TypeError, ValueError):
        return ""
''',
    "near": f'''
def view(example: dict) -> str:
    """Words between the two entity mentions when there are at most {views.NEAR} of them ('' otherwise)."""
    try:
        (_, first_end), (second_start, _) = sorted([tuple(example["span1"]), tuple(example["span2"])])
        words = normalise(str(example.get("text") or "")[first_end:second_start])
    except (KeyError, TypeError, ValueError):
        return ""
    return words if len(words.split()) <= {views.NEAR} else ""
''',
    "before": f'''
def view(example: dict) -> str:
    """The last {views.WINDOW} words before the first entity mention."""
    try:
        (first_start, _), _ = sorted([tuple(example["span1"]), tuple(example["span2"])])
        return " ".join(normalise(str(example.get("text") or "")[:first_start]).split()[-{views.WINDOW}:])
    except (KeyError, TypeError, ValueError):
        return ""
''',
    "after": f'''
def view(example: dict) -> str:
    """The first {views.WINDOW} words after the second entity mention."""
    try:
        _, (_, second_end) = sorted([tuple(example["span1"]), tuple(example["span2"])])
        return " ".join(normalise(str(example.get("text") or "")[second_end:]).split()[:{views.WINDOW}])
    except (KeyError, TypeError, ValueError):
        return ""
''',
}



def _pattern_line(name: str, constant: str) -> str:
    """A whole-word regex over a cue tuple; a trailing * lets the word continue (inhibit* -> inhibitors)."""
    alternatives = f'"|".join(cue.replace("*", r"\\w*") for cue in {constant})'
    return f'{name} = re.compile(r"\\b(?:" + {alternatives} + r")\\b")'


@dataclass(frozen=True)
class AnnotatorSpec:
    """What one offline annotator checks. kind "cue": any of `cues` in `view` (and, when set, any of
    `also` in the whole text, and none of `unless` in `unless_view`: the whole text, or on a relation task the
    words between the mentions, where a negation such as "did not inhibit" belongs to this pair and not to
    another one in the sentence). kind "surface": a measured property of the raw text (see surface.py)
    compared with `threshold`."""

    kind: str
    label: str
    view: str = "sentence"
    cues: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    feature: str = ""
    unless_view: str = "sentence"
    op: str = ">="
    threshold: float = 0.0

    def title(self) -> str:
        """The annotator's short name: its label, then its first cues and view, or its surface test."""
        if self.kind == "surface":
            return f"{self.label}: {self.feature} {self.op} {self.threshold:g}"
        cues = ", ".join(self.cues[:3]) + ("…" if len(self.cues) > 3 else "")
        return f"{self.label}: {cues} [{self.view}]"

    def describe(self) -> str:
        """One line for docstrings and rationales."""
        if self.kind == "surface":
            return f"{self.label} when {surface.describe_surface(self.feature, self.op, self.threshold)}"
        shown = ", ".join(self.cues[:4]) + (", ..." if len(self.cues) > 4 else "")
        line = f"{self.label} when a cue ({shown}) appears {VIEW_PHRASES.get(self.view, self.view)}"
        if self.also:
            line += f" and the text mentions {', '.join(self.also[:3])}"
        if self.unless:
            line += f", unless it says {', '.join(self.unless[:3])}"
            if self.unless_view != "sentence":
                line += f" {VIEW_PHRASES.get(self.unless_view, self.unless_view)}"
        return line


def quote(text: str) -> str:
    """A double-quoted Python string literal (JSON escaping is valid Python for these strings)."""
    return json.dumps(text, ensure_ascii=False)


def doc_safe(text: str) -> str:
    """Text that cannot end or escape a triple-quoted docstring (labels are user data)."""
    return text.replace("\\", "/").replace('"', "'")


def _tuple_literal(items: tuple[str, ...]) -> str:
    return "(" + ", ".join(quote(i) for i in items) + ("," if len(items) == 1 else "") + ")"


def render(spec: AnnotatorSpec) -> str:
    """Readable annotator source for a spec (only stdlib `re` / `math` imports)."""
    if spec.kind == "surface":
        return _render_surface(spec)
    doc = doc_safe(spec.describe())
    where = VIEW_PHRASES.get(spec.view, spec.view)
    consts = [f"LABEL = {quote(spec.label)}", f"VIEW = {quote(spec.view)}",
              f"CUES = {_tuple_literal(spec.cues)}"]
    if spec.also:
        consts.append(f"ALSO = {_tuple_literal(spec.also)}")
    if spec.unless:
        consts.append(f"UNLESS = {_tuple_literal(spec.unless)}")
        if spec.unless_view != "sentence":
            consts.append(f"UNLESS_VIEW = {quote(spec.unless_view)}")
    body = ["    if not CUE_PATTERN.search(view(example)):", "        return None"]
    patterns = [_pattern_line("CUE_PATTERN", "CUES")]
    needs_sentence = bool(spec.also or (spec.unless and spec.unless_view == "sentence"))
    if needs_sentence:
        body.append('    text = normalise(example.get("text"))')
    if spec.also:
        patterns.append(_pattern_line("ALSO_PATTERN", "ALSO"))
        body += ["    if not ALSO_PATTERN.search(text):", "        return None"]
    helpers = [_VIEW_HELPERS[spec.view].strip("\n")]
    if spec.unless:
        patterns.append(_pattern_line("UNLESS_PATTERN", "UNLESS"))
        vetoed_in = {spec.view: "view(example)", "sentence": "text"}.get(spec.unless_view)
        if vetoed_in is None:  # another view: its helper again, under another name
            vetoed_in = "unless_view(example)"
            helpers.append(_VIEW_HELPERS[spec.unless_view].strip("\n").replace("def view(", "def unless_view(", 1))
        body += [f"    if UNLESS_PATTERN.search({vetoed_in}):", "        return None"]
    body.append("    return LABEL")
    return "\n".join([
        f'"""{doc}."""', "import re", "", *consts, *patterns, "", "", _NORMALISE.strip("\n"), "", "",
        *[line for helper in helpers for line in (helper, "", "")],
        "def annotate(example: dict) -> str | None:",
        f'    """Vote {doc_safe(spec.label)} when a cue appears {where}; else abstain."""',
        *body, "",
    ])


def _render_surface(spec: AnnotatorSpec) -> str:
    """Source of a threshold annotator on one surface feature (its code and phrases: surface.py)."""
    setup, doc, body = surface.SOURCE[spec.feature]
    condition = surface.describe_surface(spec.feature, spec.op, spec.threshold)
    compare = ">=" if spec.op == ">=" else "<="
    lines = [
        f'"""{doc_safe(spec.describe())}."""',
        "import re",
        "",
        f"LABEL = {quote(spec.label)}",
        f"FEATURE = {quote(spec.feature)}",
        f"OP = {quote(compare)}",
        f"THRESHOLD = {surface.format_threshold(spec.threshold)}",
    ]
    if setup:
        lines.append(setup)
    lines += [
        "",
        "",
        "def measure(text: str) -> float:",
        f'    """{doc}"""',
        f"    {body}",
        "",
        "",
        "def annotate(example: dict) -> str | None:",
        f'    """Vote {doc_safe(spec.label)} when {condition}; else abstain."""',
        '    value = measure(str(example.get("text") or ""))',
        f"    return LABEL if value {compare} THRESHOLD else None",
        "",
    ]
    return "\n".join(lines)


def parse_spec(source: str) -> AnnotatorSpec | None:
    """Read the constants of source emitted by `render` back into a spec; None for foreign code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    values: dict[str, object] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                values[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except (ValueError, SyntaxError):
                continue
    label, view = values.get("LABEL"), values.get("VIEW")
    if not isinstance(label, str):
        return None
    if "FEATURE" in values:
        try:
            return AnnotatorSpec("surface", label, feature=str(values["FEATURE"]),
                                 op=str(values.get("OP", ">=")),
                                 threshold=float(values.get("THRESHOLD", 0)))  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):  # a 400-digit threshold is no float
            return None
    cues = values.get("CUES")
    if not isinstance(view, str) or view not in _VIEW_HELPERS or not _str_tuple(cues):
        return None
    also, unless = values.get("ALSO", ()), values.get("UNLESS", ())
    unless_view = values.get("UNLESS_VIEW", "sentence") if unless else "sentence"  # no veto words: nowhere to look
    if not _str_tuple(also) or not _str_tuple(unless) or not isinstance(unless_view, str) \
            or unless_view not in _VIEW_HELPERS:
        return None
    return AnnotatorSpec("cue", label, view, tuple(cues),  # type: ignore[arg-type]
                         tuple(also), tuple(unless), unless_view=unless_view)  # type: ignore[arg-type]


def _str_tuple(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
