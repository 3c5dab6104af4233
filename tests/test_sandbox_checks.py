"""engine.sandbox.replies, checks and annotators: annotator source out of LLM text, checked, normalised and named."""
from __future__ import annotations

import json
import textwrap

import pytest

from engine.agents.llm.proposer import split_reply
from engine.domain import Candidate, code_hash
from engine.sandbox.annotators import make_annotator
from engine.sandbox.checks import ALLOWED_IMPORTS, CodeRejected, check_source
from engine.sandbox.replies import extract_code, fenced_blocks

GOOD = textwrap.dedent('''
    """Spam words."""
    import re
    from collections import Counter

    WORDS = ("free", "win")
    PATTERN = re.compile(r"\\b(" + "|".join(re.escape(w) for w in WORDS) + r")\\b", re.IGNORECASE)
    TABLE = {w: len(w) for w in WORDS}
    LOWER = lambda text, words=WORDS: text.lower()
    NEGATIVE = -1


    def _count(text):
        return Counter(text.split())


    def annotate(example):
        """Flags texts that mention a prize."""
        if PATTERN.search(example["text"]):
            return "spam"
        return None
''')


def rejected(source: str) -> str:
    with pytest.raises(CodeRejected) as info:
        check_source(source)
    assert str(info.value) == info.value.reason
    return info.value.reason


def fn(body: str) -> str:
    """A minimal annotator whose body is `body`."""
    return "def annotate(example):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n"


# --- extract_code -----------------------------------------------------------------------------------------

def test_extract_fenced_python_block():
    reply = "Here is my annotator:\n```python\ndef annotate(example):\n    return None\n```\nHope it helps."
    assert extract_code(reply) == "def annotate(example):\n    return None\n"


def test_extract_plain_fence_and_unterminated_fence():
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("Sure.\n```py\ndef annotate(e):\n    return 'a'") == "def annotate(e):\n    return 'a'\n"


def test_extract_prefers_block_defining_annotate():
    reply = (
        "Helpers first:\n```python\nWORDS = ['x']\n```\n"
        "Then:\n```python\ndef annotate(example):\n    return 'ham'\n```\n"
        "Usage:\n```python\nprint(annotate({'text': 'hi'}))\n```"
    )
    assert extract_code(reply) == "def annotate(example):\n    return 'ham'\n"


def test_extract_takes_last_revision_and_skips_other_languages():
    reply = (
        "```json\n{\"def annotate(\": 1}\n```\n"
        "```python\ndef annotate(example):\n    return 'v1'\n```\nRevised:\n"
        "```python\ndef annotate(example):\n    return 'v2'\n```"
    )
    assert "'v2'" in extract_code(reply)


def test_an_inline_code_span_in_prose_does_not_open_a_block():
    """One fence grammar for the editor, code replies and spec replies: a fence opens at the start of a line, so a
    reply's inline ```annotate``` span does not swallow the block after it."""
    reply = ("Call ```annotate``` on each row:\n```python\ndef annotate(example):\n    return 'spam'\n```\n"
             "Or as a spec:\n```json\n[{\"label\": \"spam\", \"cues\": [\"free\"]}]\n```")
    assert extract_code(reply) == "def annotate(example):\n    return 'spam'\n"
    assert [code for _, code in split_reply(reply)] == ["def annotate(example):\n    return 'spam'\n"]
    blocks = fenced_blocks(reply)
    assert [(b.tag, b.closed, b.python) for b in blocks] == [("python", True, True), ("json", True, False)]
    assert json.loads(blocks[1].body) == [{"label": "spam", "cues": ["free"]}]
    (cut,) = fenced_blocks("Here:\n```python\ndef annotate(e):\n    return 'a'")
    assert not cut.closed and cut.body.startswith("def annotate")


def test_extract_raw_code_without_fences():
    raw = "import re\n\ndef annotate(example):\n    return None\n"
    assert extract_code(raw) == raw


@pytest.mark.parametrize("text", ["", "I cannot help with that.", "hello", "```json\n{\"a\": 1}\n```"])
def test_extract_rejects_text_without_code(text):
    with pytest.raises(CodeRejected, match="no code block found"):
        extract_code(text)


# --- check_source: what passes -----------------------------------------------------------------------------

def test_good_source_passes_and_keeps_docstrings():
    out = check_source(GOOD)
    assert out.startswith(("'Spam words.'", '"""Spam words."""'))
    assert "def annotate(example):" in out and "Flags texts" in out
    assert ALLOWED_IMPORTS == {"re", "math", "string", "collections", "itertools", "functools", "unicodedata"}


def test_plain_format_strings_pass():
    check_source(fn("n = len(example['text'])\nreturn '{0} words, {n:>4}, {1:.2f}'.format(n, 1.5, n=n) and None"))


def test_allowed_imports_inside_functions_pass():
    check_source(fn("import math\nfrom itertools import chain\nimport collections.abc\nreturn None"))


# --- check_source: what is rejected, with which reason -----------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("import os\n" + fn("return None"), "imports 'os', which is not allowed (allowed: collections, functools"),
    ("from os import path\n" + fn("return None"), "imports 'os', which is not allowed"),
    ("import re, subprocess\n" + fn("return None"), "imports 'subprocess'"),
    (fn("import socket\nreturn None"), "imports 'socket'"),
    ("from . import helpers\n" + fn("return None"), "relative imports are not allowed"),
    ("from re import _compiler\n" + fn("return None"), "imports `_compiler`"),
    ("from string import *\n" + fn("return None"), "import *"),
    ("from string import Formatter\n" + fn("return None"), "imports `Formatter`"),
    ("import re as eval\n" + fn("return None"), "uses `eval`"),
    (fn("return __import__('os').name"), "uses `__import__`"),
    (fn("return open('/etc/passwd').read()"), "uses `open`"),
    (fn("return eval('1')"), "uses `eval`"),
    (fn("exec('x = 1')"), "uses `exec`"),
    (fn("return getattr(example, 'x')"), "uses `getattr`"),
    (fn("return globals()"), "uses `globals`"),
    (fn("return ().__class__.__subclasses__()"), "accesses attribute `__"),
    (fn("return example.__globals__"), "accesses attribute `__globals__`"),
    (fn("return __builtins__"), "uses `__builtins__`"),
    (fn("g = (x for x in [])\nreturn g.gi_frame.f_back"), "accesses attribute `"),
    ("import string\n" + fn("return string.Formatter().get_field('0', [1], {})"), "which is not allowed"),
    (fn("class A:\n    pass\nreturn None"), "class definitions are not allowed"),
    # str.format looks up attribute and item fields itself, out of the attribute check's sight
    (fn("try:\n    1 / 0\nexcept Exception as e:\n    return '{0.__traceback__.tb_frame}'.format(e)"),
     "a format field that reads an attribute or an item"),
    (fn("return '{0[text]}'.format(example)"), "a format field that reads an attribute or an item"),
    (fn("return '{:{0.real}}'.format(1)"), "a format field that reads an attribute or an item"),
    (fn("return str.format('{0.__class__}', example)"), "a format field that reads an attribute or an item"),
    (fn("t = example['text']\nreturn t.format(example)"), "`.format` on a string not written out"),
    ("async def annotate(example):\n    return None\n", "async"),
])
def test_forbidden_code_is_rejected_with_a_reason(source, expected):
    assert expected in rejected(source)


@pytest.mark.parametrize("source, expected", [
    ("x = 1\n", "no function `annotate(example)` defined"),
    (fn("return None") + fn("return 'a'"), "`annotate` is defined 2 times"),
    ("def annotate(example, other):\n    return None\n", "exactly one positional argument"),
    ("def annotate(*examples):\n    return None\n", "exactly one positional argument"),
    ("def annotate():\n    return None\n", "exactly one positional argument"),
    ("import functools\n@functools.lru_cache\n" + fn("return None"), "must not be decorated"),
    (fn("return None") + "annotate = len\n", "`annotate` is reassigned"),
    ("while True:\n    pass\n" + fn("return None"), "`While` is not allowed at module level"),
    ("print('hi')\n" + fn("return None"), "`Expr` is not allowed at module level"),
    ("def helper():\n    return 1\nX = helper()\n" + fn("return None"), "module-level assignments may only"),
    ("example.x = 1\n" + fn("return None"), "must bind plain names"),
    ("def helper():\n    return 1\nF = lambda x=helper(): x\n" + fn("return None"), "module-level assignments"),
])
def test_structure_rules(source, expected):
    assert expected in rejected(source)


def test_syntax_error_names_the_line():
    reason = rejected("import re\n\ndef annotate(example:\n    return None\n")
    assert reason.startswith("syntax error line 3:")


def test_oversized_source_is_rejected():
    assert "limit is" in rejected("X = 1\n" * 30_000 + fn("return None"))


# --- normalisation and hashing ------------------------------------------------------------------------------

def test_reformatted_code_normalises_to_the_same_hash():
    a = ("import re\ndef annotate(example):\n    # look for money\n"
         "    if re.search('win', example['text']): return 'spam'\n")
    b = textwrap.dedent('''
        import re


        def annotate( example ):
            if re.search("win", example["text"]):  # money
                return 'spam'
    ''')
    assert check_source(a) == check_source(b)
    assert code_hash(check_source(a)) == code_hash(check_source(b))
    c = a.replace("'spam'", "'ham'")
    assert code_hash(check_source(c)) != code_hash(check_source(a))


def test_normalisation_is_idempotent_and_drops_comments():
    once = check_source(GOOD + "# trailing comment\n")
    assert "#" not in once.replace("'#'", "")
    assert check_source(once) == once


# --- make_annotator -----------------------------------------------------------------------------------------

def test_make_annotator_uses_candidate_name_and_keeps_provenance():
    cand = Candidate(source=GOOD, agent="improver", name="prize words", parent_ids=("p1", "p2"), rationale="why")
    ann = make_annotator(cand, generation=3)
    assert ann.id == code_hash(check_source(GOOD)) and len(ann.id) == 16
    assert (ann.name, ann.agent, ann.generation, ann.parent_ids, ann.rationale, ann.author) == (
        "prize words", "improver", 3, ("p1", "p2"), "why", "agent")
    assert ann.source == check_source(GOOD)


def test_make_annotator_names_from_docstring_then_from_agent_and_hash():
    assert make_annotator(Candidate(source=GOOD, agent="generator"), 1).name == "Flags texts that mention a prize."
    bare = make_annotator(Candidate(source=fn("return None"), agent="refiner"), 2, author="human")
    assert bare.name == f"refiner-{bare.id[:6]}"
    assert bare.author == "human"


def test_make_annotator_accepts_a_fenced_reply_and_rejects_bad_code():
    ann = make_annotator(Candidate(source="Here:\n```python\n" + fn("return 'spam'") + "```", agent="generator"), 0)
    assert ann.source == "def annotate(example):\n    return 'spam'\n"
    with pytest.raises(CodeRejected, match="imports 'os'"):
        make_annotator(Candidate(source="import os\n" + fn("return None"), agent="generator"), 0)


@pytest.mark.parametrize("source, expected", [
    (fn("with example as e:\n    return None"), "a `with` block cannot be used in an annotator"),
    (fn("match example:\n    case _:\n        return None"), "a `match` statement cannot be used"),
    (fn("return example.text_field"), "accesses attribute `text_field`, which is not allowed"),
    (fn("return example['text'].gi_code"), "accesses attribute `gi_code`"),
    (fn("return undefined_helper(example)"), "uses `undefined_helper`, which your code never defines"),
    (fn("return memoryview(b'x')"), "uses `memoryview`"),
])
def test_the_allow_list_refuses_what_it_does_not_name(source, expected):
    assert expected in rejected(source)


def test_the_allow_list_keeps_ordinary_annotator_code():
    source = (
        "import re\nfrom collections import Counter, defaultdict\nimport math, unicodedata, string\n"
        "CUES = {'free': 2, 'win': 1}\nPATTERN = re.compile(r'\\\\w+')\n"
        "def words(text: str) -> list:\n    return [w.lower() for w in PATTERN.findall(text)]\n"
        "def annotate(example):\n    counts = Counter(words(example.get('text', '')))\n"
        "    top = counts.most_common(1)\n    groups = defaultdict(list)\n"
        "    for word, n in counts.items():\n        groups[n].append(word.strip(string.punctuation))\n"
        "    if (m := re.search(r'(\\\\d+)', example['text'])) and m.group(1).isdigit():\n"
        "        return 'SPAM' if math.log(int(m.group(1)) + 1) > 1 else None\n"
        "    try:\n        score = sum(CUES.get(w, 0) for w in counts)\n    except KeyError as err:\n"
        "        raise ValueError(str(err)) from None\n"
        "    cat = unicodedata.category(example['text'][:1] or ' ')\n"
        "    return 'SPAM' if score >= 2 and top and cat else None\n"
    )
    assert "def annotate" in check_source(source)


# ---- escapes a review found (the OS holds the line, but the checker should not wave them through) ------------
def test_functools_wrappers_and_module_valued_attributes_are_refused():
    escape = ("import functools\nimport collections\n\ndef annotate(example):\n"
              "    d = {}\n    p = functools.partial(len)\n"
              "    functools.update_wrapper(p, collections.namedtuple, assigned=('__globals__',), updated=())\n"
              "    return None\n")
    with pytest.raises(CodeRejected, match="update_wrapper"):
        check_source(escape)
    for source in ("from functools import wraps\n\ndef annotate(example):\n    return None\n",
                   "import re\n\ndef annotate(example):\n    return re.copyreg\n",
                   "import re\n\ndef annotate(example):\n    return re.enum\n"):
        with pytest.raises(CodeRejected):
            check_source(source)


def test_type_may_name_a_type_but_not_build_a_class():
    assert check_source("def annotate(example):\n    return 'A' if type(example) is dict else None\n")
    with pytest.raises(CodeRejected, match="builds a class"):
        check_source("def annotate(example):\n    H = type('H', (), {'__dict__': {}})\n    return None\n")


def test_code_nested_too_deep_is_rejected_not_an_error_of_the_checker():
    deep = "def annotate(example):\n    return " + "+".join(["1"] * 2000) + "\n"
    with pytest.raises(CodeRejected, match="nested too deeply|cannot parse"):
        check_source(deep)
    with pytest.raises(CodeRejected):
        make_annotator(Candidate(deep, "generator"), 1)


def test_a_lone_surrogate_in_a_name_becomes_storable_text():
    source = 'def annotate(example):\n    """Spam \\ud800 finder"""\n    return None\n'
    made = make_annotator(Candidate(source, "generator"), 1)
    assert made.name == "Spam \\ud800 finder"  # a backslash escape, not a surrogate
