"""The names `auto` gives its choices ("avg(evoagg[masked],tfidf-only)", "student<mv>") read back: whether a
choice reads the pool's votes, and what each ingredient reads, in words an expert can check in the studio."""
from __future__ import annotations

PRIOR_SUFFIX = "+prior"  # a student whose class shares are pulled toward dev's (engine/aggregators/student.py)
STUDENT = "student<"  # a student of the teacher named inside: it reads text at prediction
VOTE_STUDENT = "student+votes<"  # a student that also reads the pool's votes at prediction


# the registry's single models under the names auto gives the same model among its ingredients (EvoAgg and the
# text-only model default to the embedding feature): the Labels screen matches auto's `left_out` against its table
INGREDIENT_OF = {"evoagg": "evoagg[embedding]", "embedding": "embedding-only"}


def ingredient_name(aggregator: str) -> str:
    """A registry aggregator's name as one of auto's ingredients ("evoagg" is auto's "evoagg[embedding]")."""
    return INGREDIENT_OF.get(aggregator, aggregator)


def is_student(name: str) -> bool:
    return name.startswith((STUDENT, VOTE_STUDENT))


def _teacher(name: str) -> str:
    """The teacher's name inside a student's name."""
    return name[name.index("<") + 1:name.rindex(">")]


def reads_votes(name: str) -> bool:
    """Whether a candidate (or average, or student) named as auto names them reads the pool's votes, a student's
    teacher included."""
    if name.startswith(VOTE_STUDENT):
        return True
    if name.startswith("avg(") or name.startswith(STUDENT):
        inner = name[4:-1] if name.startswith("avg(") else _teacher(name)
        return any(reads_votes(part) for part in _split_top(inner))
    return not name.endswith("-only")


def reads_votes_at_prediction(name: str) -> bool:
    """Whether the model itself reads the pool's votes when it labels a row (a `student<...>` does not, whatever
    its teacher read): its dev figures are then the ones the pool's selection on dev inflates."""
    if name.startswith(VOTE_STUDENT):
        return True
    if name.startswith(STUDENT):
        return False
    if name.startswith("avg("):
        return any(reads_votes_at_prediction(part) for part in _split_top(name[4:-1]))
    return reads_votes(name)


def _split_top(names: str) -> list[str]:
    """Split "a,avg(b,c),d" at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(names):
        depth += ch in "(<["
        depth -= ch in ")>]"
        if ch == "," and depth == 0:
            parts.append(names[start:i])
            start = i + 1
    parts.append(names[start:])
    return parts


# what each part of a candidate's name reads, in words an expert can check against the studio's plots
INGREDIENT_WORDS = {
    "mv": "majority vote of the pool", "wmv": "the pool's vote weighted by each annotator's dev accuracy",
    "ds": "Dawid-Skene over the pool's votes",
    "embedding": "MiniLM sentence embeddings", "tfidf": "TF-IDF of the text's words and word pairs",
    "relation": "TF-IDF of the words between and around the two entities",
    "masked": "MiniLM embeddings of the sentence with the two entities replaced by X and Y",
}


def describe_choice(name: str) -> str:
    """`name` (as auto names its choice) in words: each ingredient and what it reads."""
    if name.endswith(PRIOR_SUFFIX):
        return (describe_choice(name[: -len(PRIOR_SUFFIX)]) + "; its class shares on the unlabeled rows pulled "
                "toward dev's (a class its teacher rarely names is named more often)")
    if is_student(name):
        views, teacher = name[name.rindex(">") + 1:], _teacher(name)
        reads = "the text and the pool's votes" if name.startswith(VOTE_STUDENT) else "the text"
        return (f"a student: a model of {reads} trained on its teacher's labels of the unlabeled rows plus dev"
                + (f" (reading {views.strip('[]')})" if views else "") + f"; the teacher: {describe_choice(teacher)}")
    if name.startswith("avg("):
        return "the mean of " + "; ".join(describe_choice(part) for part in _split_top(name[4:-1]))
    if name == "evoagg[votes]":
        return "EvoAgg over the pool's votes alone"
    if name.startswith("evoagg["):
        return f"EvoAgg: the pool's votes with {INGREDIENT_WORDS.get(name[7:-1], name[7:-1])}"
    if name.endswith("-only"):
        return f"{INGREDIENT_WORDS.get(name[:-5], name[:-5])} alone (no votes)"
    return INGREDIENT_WORDS.get(name, name)
