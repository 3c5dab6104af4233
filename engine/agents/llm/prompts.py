"""Prompt builders for the three LLM roles, from the task, a few dev examples and the pool's state.

Each builder returns chat messages: a system message stating the annotator contract (the same for every
role) and a user message with what that role should look at. Only the dev split (labeled fitness set)
is ever quoted; holdout rows never reach a prompt.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.agents.base import ProposalContext
from engine.domain import ABSTAIN, THIN_FITNESS_ROWS, Annotator, Example, Task
from engine.metrics.score import class_counts, majority_vote, per_class_f1
from engine.sandbox.checks import ALLOWED_IMPORTS

MAX_TEXT_CHARS = 280
MAX_EXAMPLES = 36  # dev rows quoted by the generator and the improver, however many labels the task has
MAX_LISTED_LABELS = 36  # labels the improver lists with their dev F1 (the weakest)
SOURCE_CHARS = 8000  # annotator source one prompt may quote in all (the refined one, the expert's edits)
WEAK_F1 = 0.40
_WORD = re.compile(r"[a-z][a-z0-9']{2,}")
_STOP_TEXT = (
    "the and for are but not you your yours with this that these those from have has had was were will would "
    "can could should shall may might must its it's our ours their theirs they them there here what which who "
    "whom whose when where why how all any both each few more most other some such only own same than too very "
    "just into over under again further then once about above below between through during before after off "
    "out also been being does did doing him his her hers she he i'm i've don't isn't"
)
STOPWORDS = frozenset(_STOP_TEXT.split())


def annotator_contract(task: Task) -> str:
    """The rules every annotator must follow; quoted in every prompt."""
    keys = ", ".join(f'"{k}"' for k in ("text", *task.fields))
    keys = f"keys {keys} (all strings)" if task.fields else 'key "text" (a string)'
    labels = contract_labels(task)
    multi = ("- The task is multi-label: a row may carry several of these labels. An annotator still returns one "
             "label, the one its cue points to; the pool's votes together give each row its label set, and a vote "
             "counts as right when its label is among the row's labels.\n") if task.multi_label else ""
    return (
        "An annotator is a small Python module defining exactly one entry point:\n\n"
        "    def annotate(example: dict) -> str | None:\n\n"
        f"- `example` is a dict with the {keys}.\n"
        f"- It returns exactly one of these label names: {labels}, or None to abstain.\n"
        f"{multi}"
        "- Be precise: fire only on a clear cue and return None otherwise. An annotator that covers a slice "
        "of the data correctly is worth more than one that guesses everywhere.\n"
        f"- Allowed imports: {', '.join(sorted(ALLOWED_IMPORTS))}. Nothing else.\n"
        "- No I/O of any kind (files, network, processes, printing), no eval/exec/open, no classes, no "
        "dunder names, no `with` or `match` statements. Module level holds only imports, constants, compiled "
        "regexes and functions. Call only methods of strings, numbers, lists, dicts, sets, regex patterns and "
        "matches, and the allowed modules (no attribute access on other objects).\n"
        "- It must be fast: a few string or regex tests per example, no heavy loops.\n"
        "- Give `annotate` a one-line docstring naming the cue it uses.\n"
        "- Answer with one ```python fenced block per annotator, each a complete module."
    )


def contract_labels(task: Task) -> str:
    """The label names as a contract quotes them: all of them while they are few; past MAX_LISTED_LABELS a pointer
    to the task's list, which names each already (300 labels written twice filled a small local model's context)."""
    if len(task.labels) <= MAX_LISTED_LABELS:
        return ", ".join(json.dumps(label) for label in task.labels)
    return f"the {len(task.labels)} label names listed under Labels above"


def describe_task(task: Task) -> str:
    lines = [f"Task: {task.name}"]
    if task.instructions.strip():
        lines.append(f"Instructions: {task.instructions.strip()}")
    lines.append("Labels:")
    for label in task.labels:
        desc = str(task.label_descriptions.get(label, "")).strip()
        lines.append(f"- {json.dumps(label)}" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


def system_message(task: Task, mode: str = "code", views: Sequence[str] | None = None) -> dict[str, str]:
    """The task and the contract: free code (`mode` "code") or a JSON spec the engine renders ("spec"), naming
    one of `views` (none or empty: every view of the task)."""
    if mode == "spec":
        from engine.agents.llm.spec_mode import spec_contract

        return {"role": "system", "content": (
            "You choose cue words for labeling functions (annotators) in a weak-supervision pool.\n\n"
            + describe_task(task) + "\n\n" + spec_contract(task, contract_labels(task), views))}
    return {"role": "system", "content": (
        "You write labeling functions (annotators) in Python for a weak-supervision pool.\n\n"
        + describe_task(task) + "\n\n" + annotator_contract(task))}


def assert_no_holdout(context: ProposalContext) -> None:
    """Holdout rows and pool labels must never reach a prompt; fail loudly if a caller slipped one in."""
    aimed = context.feedback.focus_examples
    if any(ex.split == "test" for ex in (*context.dev, *context.pool_sample, *aimed)):
        raise ValueError("a holdout (split 'test') example reached the proposal context")
    if any(ex.label is not None for ex in (*context.pool_sample, *aimed)):
        raise ValueError("labeled rows reached the proposal context's unlabeled pool sample")


def render_example(ex: Example, task: Task, label: bool = True) -> str:
    shown = {"text": _truncate(ex.text)}
    shown.update({k: _truncate(str(ex.fields.get(k, ""))) for k in task.fields})
    line = json.dumps(shown, ensure_ascii=False)
    return f"{line} -> {json.dumps(task.labels[ex.label])}" if label and ex.label is not None else line


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def _distinct(context: ProposalContext, rows: np.ndarray | tuple[int, ...]) -> np.ndarray:
    """`rows` without repeated texts (dev splits often hold duplicates), first occurrence kept."""
    first: dict[str, int] = {}
    for i in rows:
        first.setdefault(context.dev[int(i)].text, int(i))
    return np.array(sorted(first.values()), dtype=np.int64)


def examples_per_class(context: ProposalContext, rng: np.random.Generator, per_class: int = 3,
                       max_total: int = MAX_EXAMPLES, weakest: Sequence[int] | None = None) -> list[Example]:
    """A seeded handful of dev examples of each class (fewer per class when there are many classes), at most
    `max_total` in all: with more classes than that, one example each of the `max_total` classes the pool does
    worst on (`weakest_classes`; `weakest` when the caller has it), so a task with hundreds of labels keeps a
    bounded prompt."""
    k = len(context.task.labels)
    take = max(1, min(per_class, max_total // max(k, 1)))
    labels = context.dev_labels
    if k <= max_total:
        shown = set(range(k))
    else:
        shown = set((weakest_classes(context) if weakest is None else weakest)[:max_total])
    chosen: list[Example] = []
    for c in range(k):
        rows = _distinct(context, np.flatnonzero(labels == c)) if c in shown else np.zeros(0, dtype=np.int64)
        if rows.size:
            chosen += [context.dev[i] for i in sorted(rng.choice(rows, min(take, rows.size), replace=False))]
    return chosen


def weakest_classes(context: ProposalContext, f1: np.ndarray | None = None) -> list[int]:
    """Every class, the pool's weakest first: lowest dev F1 (`f1` when the caller has it), then the smallest share of
    its dev rows any annotator votes on, then class order (deterministic, so the prompt and its cache key are too).
    The one order of "weakest" for the improver's prompt, the labels it lists and the label a spec call aims at."""
    k, labels = len(context.task.labels), context.dev_labels
    f1 = dev_class_f1(context) if f1 is None else f1
    voted = (context.dev_votes != ABSTAIN).any(axis=1) if context.dev_votes.size else np.zeros(len(labels), bool)
    covered = [float(voted[labels == c].mean()) if (labels == c).any() else 0.0 for c in range(k)]
    return sorted(range(k), key=lambda c: (f1[c], covered[c], c))


def dev_class_f1(context: ProposalContext) -> np.ndarray:
    """(k,) per-class dev F1 of the pool's majority vote (all zeros for an empty pool)."""
    k = len(context.task.labels)
    if context.dev_votes.size == 0:
        return np.zeros(k)
    return per_class_f1(context.dev_labels, majority_vote(context.dev_votes, k), k)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def salient_words(context: ProposalContext, rows: np.ndarray, top: int = 5, min_rows: int = 2) -> list[str]:
    """Words shared by `rows` that are over-represented there relative to the whole dev split."""
    bags = [_words(ex.text) for ex in context.dev]
    df_all = Counter(w for bag in bags for w in bag)
    df_sub = Counter(w for i in rows for w in bags[i])
    n_all, n_sub = len(bags), max(len(rows), 1)
    ratio = {w: (c / n_sub) / ((df_all[w] + 1) / (n_all + 1)) for w, c in df_sub.items() if c >= min_rows}
    ranked = sorted((w for w, r in ratio.items() if r > 1.0), key=lambda w: (-ratio[w], -df_sub[w], w))
    return ranked[:top]


@dataclass(frozen=True)
class WordCluster:
    words: tuple[str, ...]  # salient words the rows share
    rows: tuple[int, ...]  # dev row indices


def word_clusters(context: ProposalContext, rows: np.ndarray, max_clusters: int = 4,
                  min_size: int = 2) -> list[WordCluster]:
    """Greedy grouping of `rows` by their most salient shared word; what no word groups is left out."""
    bags = {int(i): _words(context.dev[int(i)].text) for i in rows}
    left = sorted(bags)
    clusters: list[WordCluster] = []
    for word in salient_words(context, np.array(left, dtype=np.int64), top=50, min_rows=min_size):
        members = [i for i in left if word in bags[i]]
        if len(members) < min_size:
            continue
        shared = salient_words(context, np.array(members), top=4, min_rows=len(members))
        clusters.append(WordCluster(tuple(dict.fromkeys([word, *shared])), tuple(members)))
        left = [i for i in left if i not in set(members)]
        if len(clusters) == max_clusters:
            break
    return clusters


def _cluster_lines(context: ProposalContext, clusters: list[WordCluster], rng: np.random.Generator,
                   show_votes: bool, per_cluster: int = 3) -> list[str]:
    task, labels = context.task, context.dev_labels
    lines = []
    for cl in clusters:
        counts = Counter(task.labels[labels[i]] for i in cl.rows)
        mix = ", ".join(f"{name} x{n}" for name, n in counts.most_common())
        lines.append(f"* group sharing {', '.join(cl.words)} ({len(cl.rows)} rows; gold: {mix})")
        rows = _distinct(context, cl.rows)
        for i in sorted(rng.choice(rows, min(per_cluster, rows.size), replace=False)):
            line = "    " + render_example(context.dev[i], task)
            if show_votes:
                votes = sorted({task.labels[v] for v in context.dev_votes[i] if v != ABSTAIN})
                line += f"   (pool votes: {', '.join(votes)})"
            lines.append(line)
    return lines


def _ask(n: int, what: str, mode: str = "code") -> str:
    if mode == "spec":
        return f"Describe {n} new annotator{'s' if n != 1 else ''} {what}, as a ```json list of objects."
    return f"Write {n} new annotator{'s' if n != 1 else ''} {what}. One ```python block per annotator."


MAX_VOCABULARY = 60
_VOCAB_WORD = re.compile(r"\b[a-z][a-z0-9]{2,19}\b")


def label_vocabulary(context: ProposalContext, label: str, top: int = MAX_VOCABULARY) -> list[str]:
    """The words a call aimed at `label` may choose its cues from: those in at least two dev rows of that
    label (rows the pool does not cover yet, when there are enough), most frequent first. Counting is all
    the engine does; which of them signal the label is the model's call. Under constrained decoding a
    small model then cannot invent words the data never holds (it did: "android1870625", "hammala")."""
    k = context.task.labels.index(label)
    rows = np.flatnonzero(context.dev_labels == k)
    uncovered = np.intersect1d(rows, context.uncovered_dev())
    counts: Counter[str] = Counter()
    for i in (uncovered if uncovered.size >= 5 else rows):
        counts.update({w for w in _VOCAB_WORD.findall(context.dev[int(i)].text.lower()) if w not in STOPWORDS})
    return [w for w, n in counts.most_common() if n >= 2][:top]


def _for_label(label: str, where: str, words: tuple[str, ...] = ()) -> str:
    """What a spec call aimed at one label asks for: a small model mixes up which label a cue signals and
    invents words, so the call names the label and, when given, the words its cues may be chosen from (the
    schema then allows only those)."""
    ask = (f"that vote {json.dumps(label)}: cue words or short phrases that appear in {where} labeled "
           f"{json.dumps(label)} and rarely in the others")
    if words:
        ask += (f". Choose the cues among these words of {json.dumps(label)} dev rows, only those that signal "
                f"{json.dumps(label)} rather than another label: {', '.join(words)}")
    return ask


def generator_messages(context: ProposalContext, rng: np.random.Generator, n: int, mode: str = "code",
                       label: str | None = None, words: tuple[str, ...] = (),
                       views: Sequence[str] | None = None) -> list[dict]:
    """`label`, `words` (spec mode): ask only for annotators voting that label, with cues among `words`, in one
    of `views`."""
    assert_no_holdout(context)
    shown = "\n".join(render_example(ex, context.task) for ex in examples_per_class(context, rng, per_class=4))
    what = (_for_label(label, "the examples above", words) if label is not None else
            "for this task, each using a different cue and together covering several labels")
    user = f"Labeled examples from the dev split:\n{shown}\n\n" + _ask(n, what, mode)
    return [system_message(context.task, mode, views),
            {"role": "user", "content": user + expert_feedback_text(context)}]


def improver_messages(context: ProposalContext, rng: np.random.Generator, n: int, mode: str = "code",
                      label: str | None = None, words: tuple[str, ...] = (),
                      views: Sequence[str] | None = None) -> list[dict]:
    """`label`, `words` (spec mode): ask only for annotators voting that label, with cues among `words`, in one
    of `views`."""
    assert_no_holdout(context)
    task, f1 = context.task, dev_class_f1(context)
    k, order = len(task.labels), weakest_classes(context, f1)
    # past MAX_LISTED_LABELS labels only the weakest are listed: hundreds of lines would crowd out the rows; the weak
    # labels the request names are among them
    listed = set(range(k)) if k <= MAX_LISTED_LABELS else set(order[:MAX_LISTED_LABELS])
    weak = [c for c in order if f1[c] < WEAK_F1 and c in listed]
    gold = context.dev_label_sets if context.dev_label_sets is not None else context.dev_labels
    class_rows = class_counts(gold, k)
    thin = [c for c in range(k) if class_rows[c] < THIN_FITNESS_ROWS and c in listed]
    parts = [f"The pool has {len(context.annotators)} annotators. Dev F1 of its majority vote per label:"]
    parts += [f"- {json.dumps(label)}: {f1[c]:.2f}" + (" (weak)" if f1[c] < WEAK_F1 else "")
              + f", {class_rows[c]} dev row{'s' if class_rows[c] != 1 else ''}" + (" (few)" if c in thin else "")
              for c, label in enumerate(task.labels) if c in listed]
    if len(listed) < len(task.labels):
        parts.append(f"- ({len(task.labels) - len(listed)} more labels, each with a higher F1 or more coverage)")
    for a in context.annotators[:12]:
        s = context.scores.get(a.id)
        if s is not None and s.label != ABSTAIN:
            parts.append(f"  existing: {a.name!r} votes {task.labels[s.label]!r}, precision {s.precision:.2f}, "
                         f"coverage {s.coverage:.1%}")
    grouped = False
    for title, rows, votes in (("Dev rows no annotator covers", context.uncovered_dev(), False),
                               ("Dev rows the annotators disagree on", context.conflicting_dev(), True)):
        clusters = word_clusters(context, rows)
        if clusters:
            grouped = True
            parts.append(f"\n{title} ({len(rows)} of {len(context.dev)}), grouped by shared words:")
            parts += _cluster_lines(context, clusters, rng, votes)
    if not grouped:
        parts.append("\nSome labeled examples:")
        parts += [render_example(ex, task) for ex in examples_per_class(context, rng, per_class=2, weakest=order)]
    where = "the groups above" if grouped else "the examples above"
    if label is not None:
        target = _for_label(label, where, words)
    elif weak:
        focus = ", ".join(json.dumps(task.labels[c]) for c in weak)
        target = f"that fix the weak labels ({focus}), using {where} where they help"
    else:
        target = f"that cover {where}, or cue the labels with the lowest F1 in new ways"
    parts.append("\n" + _ask(n, target, mode) + " Do not repeat the existing annotators' cues.")
    if thin and label is None:
        # dev cannot show such a class's cues; the label's meaning and the domain can (the gate asks as many fires
        # as the class has dev rows, GateConfig.small_class_fires)
        parts.append("Labels with few dev rows (" + ", ".join(json.dumps(task.labels[c]) for c in thin) + ") are "
                     "too rare in dev to find their cues there: for them, take the words and phrases that signal "
                     "the label from its name, its description and what you know of the domain, and keep them "
                     "precise.")
    return [system_message(task, mode, views),
            {"role": "user", "content": "\n".join(parts) + expert_feedback_text(context)}]


def refiner_messages(context: ProposalContext, annotator: Annotator, rng: np.random.Generator,
                     n: int, max_missed: int = 6, mode: str = "code", views: Sequence[str] | None = None
                     ) -> list[dict]:
    """Ask for broader variants of one precise-but-narrow annotator, showing dev rows of its class it misses."""
    assert_no_holdout(context)
    task, score = context.task, context.scores[annotator.id]
    label = task.labels[score.label] if score.label != ABSTAIN else None
    parts = [f"This annotator is precise but narrow. On the dev split it fires on {score.fires} of "
             f"{len(context.dev)} rows (coverage {score.coverage:.1%}) with precision {score.precision:.2f}"
             + (f", voting {json.dumps(label)}." if label else "."),
             f"```python\n{clip_source(annotator.source, SOURCE_CHARS // 2)}\n```"]
    ids = [a.id for a in context.annotators]
    if label is not None:
        missed = context.dev_labels == score.label
        if annotator.id in ids and context.dev_votes.size:
            missed &= context.dev_votes[:, ids.index(annotator.id)] == ABSTAIN
        missed = _distinct(context, np.flatnonzero(missed))
        if missed.size:
            parts.append(f"Dev rows labeled {json.dumps(label)} that it misses:")
            picks = sorted(rng.choice(missed, min(max_missed, missed.size), replace=False))
            parts += [render_example(context.dev[i], task) for i in picks]
    parts.append("\n" + _ask(n, "that are broader variants of it: keep its precision but fire on more "
                             "examples (synonyms, related phrasings, looser patterns)", mode))
    feedback = expert_feedback_text(context, source_chars=SOURCE_CHARS - len(parts[1]))
    return [system_message(task, mode, views), {"role": "user", "content": "\n".join(parts) + feedback}]


def clip_source(source: str, limit: int) -> str:
    """Annotator source for a prompt, cut to whole lines within `limit` characters with a marker saying so: an
    annotator may be up to 100,000 characters, and a prompt quoting a few of them whole would not fit a model."""
    source = source.rstrip()
    if len(source) <= limit:
        return source
    kept = source[: max(0, limit)].rpartition("\n")[0]
    return f"{kept}\n# ... ({len(source) - len(kept)} more characters of this annotator not shown)"


def expert_feedback_text(context: ProposalContext, max_items: int = 5, source_chars: int = SOURCE_CHARS) -> str:
    """The expert's judgement for the prompt: rejected ideas with their reasons (never again), approvals, edits
    (follow their direction), and the unlabeled rows the expert aimed this generation at. "" when there is none.
    The edited sources share `source_chars` characters."""
    feedback = context.feedback
    if not feedback:
        return ""
    parts = ["", "The domain expert reviewed the pool. Respect their judgement:"]
    for annotator, note in feedback.rejected[-max_items:]:
        parts.append(f"- REJECTED {annotator.name!r}" + (f" because: {_truncate(note)}" if note else "")
                     + ". Do not propose this idea again, in any wording.")
    for annotator, note in feedback.approved[-max_items:]:
        parts.append(f"- approved {annotator.name!r}" + (f" ({_truncate(note)})" if note else ""))
    edits = feedback.edits[-max_items:]
    for before, after, note in edits:
        parts.append(f"- edited {before.name!r}" + (f" ({_truncate(note)})" if note else "")
                     + "; follow the direction of the edit. After:\n```python\n"
                     + clip_source(after.source, source_chars // len(edits)) + "\n```")
    if feedback.focus_terms:
        parts.append(f"The expert asks for annotators for these unlabeled rows (words: "
                     f"{', '.join(feedback.focus_terms)}), which the pool does not label well:")
        parts += [render_example(ex, context.task, label=False) for ex in feedback.focus_examples[:max_items]]
    return "\n".join(parts)


def repair_messages(messages: list[dict], reply: str, errors: list[str], mode: str = "code") -> list[dict]:
    """One follow-up turn quoting why the previous answer was rejected."""
    listed = "\n".join(f"- {e}" for e in errors)
    if mode == "spec":
        return [*messages, {"role": "assistant", "content": reply},
                {"role": "user", "content": (
                    f"Your answer could not be used:\n{listed}\n\nFix these problems and reply again with one "
                    '```json list of {"label", "cues", "view"} objects, following every rule above.')}]
    return [*messages, {"role": "assistant", "content": reply},
            {"role": "user", "content": (
                f"Your answer could not be used:\n{listed}\n\nFix these problems and reply again: one complete "
                "```python block per annotator, each defining `def annotate(example: dict) -> str | None` and "
                "following every rule above.")}]
