"""engine.sandbox.executor: annotators run in real, limited worker processes; misbehaviour becomes counted faults."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.domain import ABSTAIN, Annotator, Candidate
from engine.sandbox.annotators import make_annotator
from engine.sandbox.executor import Executor, SandboxExecutor

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["ham", "spam", "other"]
EXAMPLES = [{"text": t} for t in ["win a free prize", "see you at lunch", "FREE entry", "ok", "call now to win"]]


def annotator(body: str, prelude: str = "") -> Annotator:
    source = textwrap.dedent(prelude) + "def annotate(example):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    return make_annotator(Candidate(source=source, agent="generator"), generation=1)


def unchecked(source: str) -> Annotator:
    """An annotator that skipped engine.sandbox.checks (e.g. a tampered store row); the worker must re-check it."""
    return Annotator(id="tampered", name="tampered", source=textwrap.dedent(source), agent="human", generation=0)


@pytest.fixture(scope="module")
def executor():
    with SandboxExecutor(workers=2, time_budget_s=0.5, per_example_s=0.0) as ex:
        yield ex


KEYWORDS = annotator(
    """
    text = example["text"].lower()
    if "win" in text or "free" in text:
        return "spam"
    if text == "ok":
        return "ham"
    return None
    """
)


def test_votes_are_label_indices_and_none_abstains(executor: Executor):
    other = annotator("return 'other' if len(example['text']) < 3 else None")
    (res, res2) = executor.run([KEYWORDS, other], EXAMPLES, LABELS)
    assert res.annotator_id == KEYWORDS.id
    assert res.votes.tolist() == [1, ABSTAIN, 1, 0, 1]
    assert res.votes.dtype == np.int64
    assert (res.faults, res.first_error) == (0, None)
    assert res2.votes.tolist() == [ABSTAIN, ABSTAIN, ABSTAIN, 2, ABSTAIN]


def test_exception_is_a_fault_and_the_first_error_is_kept(executor):
    ann = annotator(
        """
        if "o" in example["text"]:
            return example["entity1"]
        if "prize" in example["text"]:
            raise ValueError("no prize")
        return "ham"
        """
    )
    (res,) = executor.run([ann], EXAMPLES, LABELS)
    # rows 0 ("prize" but contains "o"? no: "win a free prize" has no "o"), 1, 3, 4 contain "o"
    assert res.votes.tolist() == [ABSTAIN, ABSTAIN, 0, ABSTAIN, ABSTAIN]
    assert res.faults == 4
    assert res.first_error == "ValueError: no prize on example 0"


def test_values_outside_the_label_set_are_faults(executor):
    ann = annotator("return {'ok': 1, 'FREE entry': ['spam']}.get(example['text'], 'spamm')")
    (res,) = executor.run([ann], EXAMPLES, LABELS)
    assert res.votes.tolist() == [ABSTAIN] * 5
    assert res.faults == 5
    assert res.first_error.startswith("returned 'spamm', not a label")


def test_chunks_keep_global_example_numbers_and_order():
    examples = [{"text": str(i)} for i in range(10)]
    ann = annotator("n = int(example['text'])\nif n == 7:\n    raise KeyError('entity1')\n"
                    "return 'spam' if n % 2 else 'ham'")
    with SandboxExecutor(workers=2, batch_size=3) as ex:
        seen = []
        (res,) = ex.run([ann], examples, LABELS, on_progress=lambda done, total: seen.append((done, total)))
    assert res.votes.tolist() == [0, 1, 0, 1, 0, 1, 0, ABSTAIN, 0, 1]
    assert (res.faults, res.first_error) == (1, "KeyError: 'entity1' on example 7")
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (10, 10)


def test_infinite_loop_times_out_and_the_executor_keeps_working(executor):
    loop = annotator("if example['text'] == 'ok':\n    while True:\n        pass\nreturn 'spam'")
    res, good = executor.run([loop, KEYWORDS], EXAMPLES, LABELS)
    # rows 0..2 voted before the loop at row 3; the timeout voids rows 3 and 4
    assert res.votes.tolist() == [1, 1, 1, ABSTAIN, ABSTAIN]
    assert res.faults == 2
    assert res.first_error == "timeout after 0.5s"
    assert good.votes.tolist() == [1, ABSTAIN, 1, 0, 1]
    assert executor.run([KEYWORDS], EXAMPLES, LABELS)[0].votes.tolist() == [1, ABSTAIN, 1, 0, 1]


def test_swallowed_timeouts_still_end_the_run(executor):
    stubborn = annotator(
        """
        n = 0
        while True:
            try:
                while True:
                    n += 1
            except BaseException:
                n = 0
        """
    )
    (res,) = executor.run([stubborn], EXAMPLES, LABELS)
    assert res.faults == 5 and res.votes.tolist() == [ABSTAIN] * 5
    assert res.first_error.startswith("timeout after 0.5s")
    assert executor.run([KEYWORDS], EXAMPLES, LABELS)[0].faults == 0


def test_c_level_loop_is_stopped_by_the_cpu_limit(executor):
    # sum() over a huge range never returns to the interpreter, so only the kernel's RLIMIT_CPU stops it
    hog = annotator("return 'spam' if sum(range(10 ** 12)) else None")
    (res,) = executor.run([hog, KEYWORDS], EXAMPLES, LABELS)[:1]
    assert res.faults == 5
    # normally the kernel's CPU limit ends it; on a badly overloaded machine the parent's wall-clock deadline may
    assert res.first_error.startswith("timeout after 0.5s: ")
    assert executor.run([KEYWORDS], EXAMPLES, LABELS)[0].votes.tolist() == [1, ABSTAIN, 1, 0, 1]


def test_a_run_that_does_not_answer_is_killed_at_the_wall_clock_deadline():
    hog = annotator("return 'spam' if sum(range(10 ** 12)) else None")
    with SandboxExecutor(workers=1, time_budget_s=0.2, per_example_s=0.0, grace_s=0.1) as ex:
        res, good = ex.run([hog, KEYWORDS], EXAMPLES, LABELS)
        assert res.faults == 5
        # the worker's deadline (2 x budget + grace / 2) kills the run's child; the parent's (2 x budget + grace)
        # kills the whole worker if the worker itself does not answer
        assert res.first_error.startswith("timeout after 0.2s: no answer within 0.")
        assert "s wall clock, run killed" in res.first_error or "s wall clock, worker killed" in res.first_error
        assert good.votes.tolist() == [1, ABSTAIN, 1, 0, 1]


def test_timeout_voids_the_rest_of_the_annotator_across_chunks():
    examples = [{"text": str(i)} for i in range(10)]
    slow = annotator("if example['text'] == '4':\n    while True:\n        pass\nreturn 'ham'")
    with SandboxExecutor(workers=2, batch_size=3, time_budget_s=0.3, per_example_s=0.0) as ex:
        (res,) = ex.run([slow], examples, LABELS)
    assert res.votes.tolist() == [0, 0, 0, 0] + [ABSTAIN] * 6
    assert res.faults == 6 and res.first_error == "timeout after 0.3s"


def test_memory_bomb_is_a_fault_not_a_crash(executor):
    bomb = annotator("x = 'a' * 10 ** 10\nreturn 'spam'")
    grow = annotator("x = [0] * (10 ** 9)\nreturn 'spam'")
    res, res2, good = executor.run([bomb, grow, KEYWORDS], EXAMPLES, LABELS)
    assert res.faults == 5 and res.first_error.startswith("MemoryError")
    assert res2.faults == 5 and res2.first_error.startswith("MemoryError")
    assert good.faults == 0


def test_module_level_failure_faults_every_row(executor):
    bad = annotator("return 'spam'", prelude="import re\nPAT = re.compile('(')\n")
    (res,) = executor.run([bad], EXAMPLES, LABELS)
    assert res.faults == 5 and res.first_error.startswith("error: missing )")
    assert res.first_error.endswith("at module level")


def test_annotators_cannot_change_what_the_next_one_sees(executor):
    vandal = annotator("example['text'] = 'ok'\nexample.clear()\nreturn None")
    nested = [{"text": "free", "tags": ["a"]}, {"text": "ok", "tags": []}, {"text": "ok", "tags": [["a"]]}]
    mutate_list = annotator("example['tags'].append('x')\nif example['tags'][0]:\n    example['tags'][0].append(1)")
    reader = annotator("return 'spam' if example['tags'] in (['a'], [['a']]) else 'ham'")
    res = executor.run([vandal, KEYWORDS, mutate_list, reader], nested, LABELS)
    assert res[1].votes.tolist() == [1, 0, 0]
    assert res[2].faults == 2  # str has no append (rows 0, 1); row 2 appends to a nested list
    assert res[3].votes.tolist() == [1, 0, 1]


@pytest.mark.parametrize("source, expected", [
    ("import os\ndef annotate(example):\n    return os.name\n", "rejected: imports 'os'"),
    ("def annotate(example):\n    return open('/etc/passwd').read()\n", "rejected: line 2: uses `open`"),
    ("def annotate(example):\n    return __import__('os').name\n", "rejected: line 2: uses `__import__`"),
    ("def annotate(example):\n    import socket\n    return socket.gethostname()\n", "rejected: imports 'socket'"),
    ("def annotate(example):\n    return ().__class__.__subclasses__()\n", "rejected: line 2: accesses attribute"),
])
def test_worker_rechecks_code_that_skipped_engine_code(executor, source, expected):
    (res,) = executor.run([unchecked(source)], EXAMPLES, LABELS)
    assert res.faults == 5 and res.votes.tolist() == [ABSTAIN] * 5
    assert res.first_error.startswith(expected)


def test_runtime_restrictions_hold_even_without_the_ast_check(tmp_path):
    """Second layer on its own: restricted builtins, guarded import, network and file limits."""
    script = textwrap.dedent(
        """
        import json, sys
        import engine.sandbox.worker as w
        w.check_source = lambda source: source  # switch the first layer off
        w._disable_network()
        import signal
        from engine.sandbox import confine
        signal.signal(signal.SIGPROF, w.Alarm.fire)
        confine.apply_rlimits(256)
        batch = w._Batch(0, ["ok"], [{"text": "x"}])
        bodies = {
            "open": "return open('/etc/hostname').read()",
            "dunder_import": "return __import__('os').name",
            "import_os": "import os\\n    return 'ok'",
            "import_socket": "import socket\\n    return 'ok'",
            "eval": "return eval('1')",
            "allowed": "import unicodedata, collections\\n    return 'ok'",
            "memory": "return 'a' * (300 * 2 ** 20)",
        }
        out = {}
        for name, body in bodies.items():
            reply = w.run_annotator("def annotate(example):\\n    " + body + "\\n", batch, 2.0)
            out[name] = [reply["votes"], reply["first_error"]]
        import socket
        try:
            socket.create_connection(("127.0.0.1", 9))
        except PermissionError as exc:
            out["network"] = str(exc)
        try:
            with open(sys.argv[1], "w") as fh:  # trusted code here: the limit itself is under test
                fh.write("x")
                fh.flush()
        except OSError as exc:
            out["file_write"] = exc.__class__.__name__
        sys.stdout.write(json.dumps(out))
        """
    )
    target = tmp_path / "written.txt"
    proc = subprocess.run([sys.executable, "-S", "-c", script, str(target)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["open"] == [[-1], "NameError: name 'open' is not defined on example 0"]
    assert out["dunder_import"][1].startswith("ImportError: import of 'os' is not allowed")
    assert out["import_os"][1] == "ImportError: import of 'os' is not allowed in the sandbox on example 0"
    assert out["import_socket"][1].startswith("ImportError: import of 'socket' is not allowed")
    assert out["eval"][1].startswith("NameError: name 'eval' is not defined")
    assert out["allowed"] == [[0], None]
    assert out["memory"][1].startswith("MemoryError")
    assert out["network"] == "network access is disabled in the sandbox"
    assert out["file_write"] == "OSError" and target.read_text() == ""  # RLIMIT_FSIZE = 0


def test_empty_inputs_and_reuse_after_close():
    ex = SandboxExecutor(workers=1)
    assert ex.run([], EXAMPLES, LABELS) == []
    (empty,) = ex.run([KEYWORDS], [], LABELS)
    assert empty.votes.shape == (0,) and empty.faults == 0
    ex.close()
    assert ex.run([KEYWORDS], EXAMPLES, LABELS)[0].votes.tolist() == [1, ABSTAIN, 1, 0, 1]
    ex.close()


def test_an_error_text_with_a_lone_surrogate_is_storable_and_object_is_a_builtin(executor):
    import duckdb

    raises = annotator("raise ValueError('bad \\ud800 text')")
    sentinel = annotator("missing = object()\nreturn 'spam' if example['text'] != missing else None")
    examples = [{"text": "win"}, {"text": "ok"}]
    bad, uses_object = executor.run([raises, sentinel], examples, ["spam", "ham"])
    assert bad.faults == 2 and "\\ud800" in bad.first_error
    # DuckDB refused the raw surrogate, so the run's votes were never stored and every later run failed on them
    assert duckdb.connect().execute("SELECT ?", [bad.first_error]).fetchone()[0] == bad.first_error
    assert uses_object.faults == 0 and list(uses_object.votes) == [0, 0]  # `object` passed the checker, then failed


def test_a_label_in_another_case_or_padded_names_it_unless_two_labels_fold_alike(executor):
    """Small models write `return 'spam'` for the label SPAM: that names it (no other label folds to "spam"). Two
    labels that differ only in case stay apart: a vote that folds to both is a fault."""
    ann = annotator("return {'a': 'SPAM', 'b': ' Ham\\n', 'c': 'other'}[example['text']]")
    (res,) = executor.run([ann], [{"text": t} for t in "abc"], ["ham", "spam", "Other", "OTHER"])
    assert res.votes.tolist() == [1, 0, ABSTAIN]
    assert res.faults == 1 and res.first_error.startswith("returned 'other', not a label")
