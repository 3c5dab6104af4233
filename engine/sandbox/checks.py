"""LLM or human text -> checked, normalised annotator source.

The checks here are the first line of defence (the sandbox is the second): they reject code that
could reach outside the annotator's job before it is stored or run, with a reason a person can read.
This module must stay free of numpy: the sandbox worker imports it and runs under a memory limit.
"""
from __future__ import annotations

import ast
import builtins
import collections
import functools
import itertools
import math
import re
import string
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

ALLOWED_IMPORTS: frozenset[str] = frozenset(
    {"re", "math", "string", "collections", "itertools", "functools", "unicodedata"}
)
FORBIDDEN_NAMES: frozenset[str] = frozenset({
    "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "input", "breakpoint", "exit", "quit", "memoryview", "help",
})
# Attributes that reach interpreter internals without a leading underscore (frames, code objects) or that
# resolve attribute paths from strings (string.Formatter.get_field is a getattr in disguise).
FORBIDDEN_ATTRIBUTES: frozenset[str] = frozenset({
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_globals",
    "f_locals", "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "Formatter", "get_field",
    "vformat", "mro",
    # functools' wrappers copy attributes named by strings (a getattr/setattr of `__globals__`, `__dict__`...),
    # and these module attributes of the allowed modules are modules themselves (re.enum, re.copyreg, ...)
    "update_wrapper", "wraps", "WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES", "abc", "copyreg", "enum", "functools",
})
# Calls allowed in module-level constant tables (besides methods of constants and module functions).
_STATIC_CALLS = frozenset({
    "frozenset", "set", "tuple", "list", "dict", "sorted", "str", "len", "range", "zip", "enumerate",
    "reversed", "min", "max", "sum", "int", "float", "bool", "any", "all",
})
# The allow-list: syntax, built-in names and attributes an annotator may use. Anything else (including syntax
# added to Python later) is refused by default, with a message that names the construct.
_ALLOWED_NODES: tuple[type, ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.Break, ast.Continue, ast.Pass, ast.Expr, ast.Try, ast.ExceptHandler,
    ast.Raise, ast.Assert, ast.Delete, ast.Import, ast.ImportFrom, ast.alias, ast.Global, ast.Nonlocal,
    ast.Lambda, ast.IfExp, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.keyword, ast.Name,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Starred, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp,
    ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension, ast.JoinedStr, ast.FormattedValue,
    ast.Constant, ast.NamedExpr, ast.Yield, ast.YieldFrom,
    ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop,
)
ALLOWED_SYNTAX_SUMMARY = ("functions, if/for/while, try/except, return, assignments, expressions, lambdas, "
                          "comprehensions and f-strings")
_SYNTAX_NAMES = {
    "ClassDef": "a class definition", "AsyncFunctionDef": "an async function", "Await": "`await`",
    "AsyncFor": "`async for`", "AsyncWith": "`async with`", "With": "a `with` block", "Match": "a `match` statement",
    "TryStar": "`except*`", "TypeAlias": "a `type` alias",
}
ALLOWED_BUILTINS: frozenset[str] = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate",
    "filter", "float", "format", "frozenset", "hash", "hex", "int", "isinstance", "issubclass", "iter", "len",
    "list", "map", "max", "min", "next", "oct", "ord", "pow", "range", "repr", "reversed", "round", "set",
    "slice", "sorted", "str", "sum", "tuple", "type", "zip", "print", "object", "True", "False", "None",
    "NotImplemented", "Ellipsis",
} | {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)
     and issubclass(getattr(builtins, name), BaseException)})


def _public_names(*things: object) -> set[str]:
    return {name for thing in things for name in dir(thing) if not name.startswith("_")}


# Methods of the values an annotator handles and the functions of the modules it may import.
ALLOWED_ATTRIBUTES: frozenset[str] = frozenset(_public_names(
    str, bytes, int, float, complex, bool, list, dict, set, frozenset, tuple, range, slice,
    re.Pattern, re.Match, re.RegexFlag, collections.Counter, collections.defaultdict, collections.deque,
    collections.OrderedDict, functools.partial,
    re, math, string, collections, itertools, functools, unicodedata,
) - {"mro", "Formatter", "format_map"})
MAX_SOURCE_CHARS = 100_000
class CodeRejected(ValueError):
    """Source that will not become an annotator; `reason` says why in one line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_source(source: str) -> str:
    """Check annotator source and return it normalised (`ast.unparse`: comments and layout dropped). Code nested
    too deep for the checker's own recursion is rejected, never an error of the checker's."""
    return checked(source)[1]


def checked(source: str) -> tuple[ast.Module, str]:
    """The checked tree and its normalised source; code nested too deep for the checker's recursion is rejected."""
    try:
        tree = _checked_tree(source)
        return tree, ast.unparse(tree) + "\n"
    except (RecursionError, MemoryError) as exc:
        raise CodeRejected(f"the code is nested too deeply to check ({type(exc).__name__})") from None


def _checked_tree(source: str) -> ast.Module:
    if len(source) > MAX_SOURCE_CHARS:
        raise CodeRejected(f"source is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CodeRejected(f"syntax error line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise CodeRejected(f"cannot parse source: {type(exc).__name__}") from None
    _check_top_level(tree)
    _check_annotate(tree)
    bound = _bound_names(tree)
    nodes = list(ast.walk(tree))
    for node in nodes:  # syntax first, then names and imports, then attributes: the most telling reason wins
        _check_syntax(node)
    for node in sorted(nodes, key=lambda n: isinstance(n, ast.Attribute)):
        _check_node(node, bound)
    return tree


def _bound_names(tree: ast.Module) -> frozenset[str]:
    """Every name the code binds anywhere: assigned, a function or its arguments, imported, caught, looped."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return frozenset(names)


def _check_top_level(tree: ast.Module) -> None:
    """Module level may only import, define functions and build constant tables."""
    for stmt in tree.body:
        where = f"line {stmt.lineno}"
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
            stmt.value.value, str
        ):
            continue  # docstring
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if not all(_is_plain_target(t) for t in targets):
                raise CodeRejected(f"{where}: module-level assignment must bind plain names")
            if stmt.value is None or not _is_static(stmt.value):
                raise CodeRejected(
                    f"{where}: module-level assignments may only hold constants, literals, "
                    "comprehensions or compiled regexes"
                )
            continue
        if isinstance(stmt, ast.AsyncFunctionDef):
            raise CodeRejected(f"{where}: async functions are not allowed")
        raise CodeRejected(
            f"{where}: `{type(stmt).__name__}` is not allowed at module level "
            "(only imports, function definitions, constants and a docstring)"
        )


def _is_plain_target(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return True
    return isinstance(node, (ast.Tuple, ast.List)) and all(_is_plain_target(e) for e in node.elts)


def _is_static(node: ast.AST) -> bool:
    """True for expressions that only build data: literals, names, comprehensions, safe calls."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Lambda):  # the body runs later, inside annotate; defaults run now
        return all(_is_static(d) for d in node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, ast.Call):
        func = node.func
        ok_func = (isinstance(func, ast.Name) and func.id in _STATIC_CALLS) or (
            isinstance(func, ast.Attribute) and _is_static(func.value)
        )
        return ok_func and all(_is_static(a) for a in node.args) and all(
            _is_static(k.value) for k in node.keywords
        )
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for gen in node.generators:
            parts += [gen.iter, *gen.ifs]
        return all(_is_static(p) for p in parts)
    if isinstance(node, ast.Dict):
        return all(k is None or _is_static(k) for k in node.keys) and all(_is_static(v) for v in node.values)
    simple = (ast.Attribute, ast.Tuple, ast.List, ast.Set, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
              ast.IfExp, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr, ast.FormattedValue)
    if isinstance(node, simple):
        children = [c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.operator, ast.cmpop,
                    ast.unaryop, ast.boolop, ast.expr_context))]
        return all(_is_static(c) for c in children)
    return False


def _check_annotate(tree: ast.Module) -> None:
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "annotate"]
    if not defs:
        raise CodeRejected("no function `annotate(example)` defined")
    if len(defs) > 1:
        raise CodeRejected(f"`annotate` is defined {len(defs)} times; define it once")
    for stmt in tree.body:
        targets: list[Any] = list(stmt.targets) if isinstance(stmt, ast.Assign) else []
        if not isinstance(stmt, ast.Assign):
            targets.append(getattr(stmt, "target", None))
        if any(isinstance(t, ast.Name) and t.id == "annotate" for t in targets):
            raise CodeRejected(f"line {stmt.lineno}: `annotate` is reassigned; it must be a plain function")
    fn = defs[0]
    args = fn.args
    positional = args.posonlyargs + args.args
    if len(positional) != 1 or args.vararg or args.kwarg or args.kwonlyargs:
        raise CodeRejected("`annotate` must take exactly one positional argument (example)")
    if fn.decorator_list:
        raise CodeRejected("`annotate` must not be decorated")


def _check_syntax(node: ast.AST) -> None:
    """Only the node types of the allow-list; new syntax is refused until someone adds it on purpose."""
    if isinstance(node, _ALLOWED_NODES):
        return
    line = f"line {getattr(node, 'lineno', '?')}"
    if isinstance(node, ast.ClassDef):
        raise CodeRejected(f"{line}: class definitions are not allowed (use functions and dicts)")
    if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
        raise CodeRejected(f"{line}: async code is not allowed")
    raise CodeRejected(f"{line}: {_syntax_name(node)} cannot be used in an annotator "
                       f"(it may use: {ALLOWED_SYNTAX_SUMMARY})")


def _check_node(node: ast.AST, bound: frozenset[str]) -> None:
    line = f"line {getattr(node, 'lineno', '?')}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        _check_import(node, line)
    elif isinstance(node, ast.Name):
        _check_name(node.id, line)
        if isinstance(node.ctx, ast.Load) and node.id not in bound and node.id not in ALLOWED_BUILTINS:
            raise CodeRejected(f"{line}: uses `{node.id}`, which your code never defines and which is not one of "
                               "the built-in functions annotators may use (e.g. len, sum, min, max, sorted, str, "
                               "int, float, list, dict, set, any, all, range, enumerate, zip, isinstance)")
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise CodeRejected(f"{line}: accesses attribute `{node.attr}`; underscore attributes are not allowed")
        if node.attr in FORBIDDEN_ATTRIBUTES or node.attr not in ALLOWED_ATTRIBUTES:
            raise CodeRejected(f"{line}: accesses attribute `{node.attr}`, which is not allowed (annotators may use "
                               "the methods of text, numbers, lists, dicts, sets and tuples, of regex patterns "
                               "and matches, of Counter/defaultdict/deque, and the functions of the allowed "
                               "modules)")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and (
            len(node.args) + len(node.keywords) != 1):
        raise CodeRejected(f"{line}: `type()` with more than one argument builds a class, which is not allowed")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        _check_format_call(node, line)
    elif isinstance(node, ast.FunctionDef):
        if _is_dunder(node.name):
            raise CodeRejected(f"{line}: function name `{node.name}` is not allowed")
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        for name in node.names:
            _check_name(name, line)
    elif isinstance(node, ast.arg):
        _check_name(node.arg, line)


def _check_format_call(node: ast.Call, line: str) -> None:
    """`str.format` looks up the attributes and items its fields name (`"{0.__class__}"`) where the attribute check
    cannot see them: the format string must be written out, its fields plain names or positions."""
    func = node.func
    assert isinstance(func, ast.Attribute)
    on_str_type = isinstance(func.value, ast.Name) and func.value.id == "str"
    template = (node.args[0] if node.args else None) if on_str_type else func.value
    if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
        raise CodeRejected(f"{line}: `.format` on a string not written out in the code is not allowed (use an f-string "
                           "or a literal format string)")
    if not _plain_format_fields(template.value):
        raise CodeRejected(f"{line}: a format field that reads an attribute or an item (`{{0.name}}`, `{{0[key]}}`) "
                           "is not allowed; pass the value itself")


def _plain_format_fields(text: str) -> bool:
    """Whether every replacement field of a format string (nested ones in its format specs too) names a plain
    position or keyword."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return True  # a malformed format string fails when it runs, reading nothing
    for _, field, spec, _ in parsed:
        if field and ("." in field or "[" in field):
            return False
        if spec and not _plain_format_fields(spec):
            return False
    return True


def _syntax_name(node: ast.AST) -> str:
    kind = type(node).__name__
    return _SYNTAX_NAMES.get(kind, f"`{kind}` syntax")


def _check_name(name: str, line: str) -> None:
    if name in FORBIDDEN_NAMES:
        raise CodeRejected(f"{line}: uses `{name}`, which is not allowed")
    if _is_dunder(name):
        raise CodeRejected(f"{line}: uses `{name}`; dunder names are not allowed")


def _check_import(node: ast.Import | ast.ImportFrom, line: str) -> None:
    allowed = ", ".join(sorted(ALLOWED_IMPORTS))
    if isinstance(node, ast.ImportFrom):
        if node.level:
            raise CodeRejected(f"{line}: relative imports are not allowed")
        modules = [node.module or ""]
        for alias in node.names:
            if alias.name == "*":
                raise CodeRejected(f"{line}: `from {node.module} import *` is not allowed; name what you use")
            if alias.name.startswith("_") or alias.name in FORBIDDEN_ATTRIBUTES:
                raise CodeRejected(f"{line}: imports `{alias.name}`, which is not allowed")
    else:
        modules = [alias.name for alias in node.names]
    for module in modules:
        parts = module.split(".")
        if parts[0] not in ALLOWED_IMPORTS or any(p.startswith("_") for p in parts):
            raise CodeRejected(f"imports '{module}', which is not allowed (allowed: {allowed})")
    for alias in node.names:
        if alias.asname:
            _check_name(alias.asname, line)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def clean_text(text: str) -> str:
    """Text from untrusted code or a model (a name, an error message) made storable: a lone surrogate, which UTF-8
    cannot hold and DuckDB refuses (every later run then failed on the same row), becomes its `\\udXXX` escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class LabelIndex:
    """Which label a vote names: the label itself, or, written in another case or with spaces around it, the one
    label that folds to it (`'spam'` for SPAM: small models often write it so; with labels "A" and "a" neither folded
    form names one). The sandbox, the compiled path and the LLM's specs read votes alike through it; the exported
    pool's runner keeps a copy of the rule (it runs without EvoPool), which tests/test_export checks against it."""

    def __init__(self, labels: Sequence[str]):
        self.exact = {str(label): i for i, label in enumerate(labels)}
        folds = collections.Counter(str(label).casefold() for label in labels)
        self.folded = {str(label).casefold(): i for i, label in enumerate(labels) if folds[str(label).casefold()] == 1}

    def of(self, vote: object) -> int | None:
        if type(vote) is not str:
            return None
        index = self.exact.get(vote)
        return index if index is not None else self.folded.get(vote.strip().casefold())
