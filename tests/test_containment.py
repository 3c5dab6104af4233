"""The OS holds the line even when the code checker is beaten: hostile annotators run with the checker OFF and
full builtins (`SandboxExecutor(unchecked=True)`), so only the worker's confinement stands between them and the
app. Each attack must fail, leave the decoys byte-identical, and not change a benign annotator's votes.

Attacks that would hurt the machine if a layer regressed are probes (signal 0, a bounded fork loop)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from engine.domain import ABSTAIN, Annotator, Task
from engine.export.files import pool_as_python
from engine.sandbox import confine
from engine.sandbox.checks import CodeRejected, check_source
from engine.sandbox.executor import ContainmentTooWeak, SandboxExecutor

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["held", "breach", "spam"]
HELD, BREACH, SPAM = 0, 1, 2
EXAMPLES = [{"text": t} for t in ["win a free prize", "see you at lunch", "FREE entry", "ok"]]
BENIGN_VOTES = [SPAM, ABSTAIN, SPAM, ABSTAIN]


def hostile(name: str, attack: str, prelude: str = "") -> Annotator:
    """An annotator that returns "breach" when `attack` runs without raising, else "held"."""
    source = (
        "import os, sys, ctypes, socket, _socket, signal, time, re, builtins\n" + textwrap.dedent(prelude)
        + "def annotate(example):\n    try:\n" + textwrap.indent(textwrap.dedent(attack), "        ")
        + "\n    except BaseException:\n        return 'held'\n    return 'breach'\n"
    )
    return Annotator(id=name, name=name, source=source, agent="human", generation=0)


BENIGN = Annotator(id="benign", name="benign", agent="human", generation=0, source=(
    "import re\n\ndef annotate(example):\n    return 'spam' if re.search(r'free', example['text'], re.I) else None\n"))


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxExecutor]:
    with SandboxExecutor(workers=2, time_budget_s=1.0, per_example_s=0.0, unchecked=True) as ex:
        yield ex


@pytest.fixture(scope="module")
def report(pool: SandboxExecutor) -> dict[str, str]:
    return pool.containment()


def need(report: dict[str, str], *layers: str) -> None:
    """Skip (saying which layers are off here) unless at least one of `layers` is on."""
    if not any(report.get(layer, "").startswith("on") for layer in layers):
        pytest.skip("; ".join(f"{layer} {report.get(layer, 'off: not reported')}" for layer in layers))


def run_with_benign(pool: SandboxExecutor, *attacks: Annotator) -> list:
    results = pool.run([*attacks, BENIGN], EXAMPLES, LABELS)
    assert results[-1].votes.tolist() == BENIGN_VOTES and results[-1].faults == 0
    return results[:-1]


def assert_held(results: list) -> None:
    for res in results:
        assert BREACH not in res.votes.tolist(), (res.annotator_id, res.first_error)


@pytest.fixture
def decoys(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A secret where the app keeps its files and a real workspace DuckDB file; both must come out unchanged."""
    secret = ROOT / f".containment-decoy-{uuid.uuid4().hex[:8]}.toml"
    secret.write_text('api_key = "sk-decoy-not-a-real-key"\n')
    secret.chmod(0o644)  # readable by anyone: only the sandbox's own walls may stop the read
    db = tmp_path / "workspace.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("create table votes as select range as x from range(1000)")
    tmp_path.chmod(0o755)
    db.chmod(0o666)  # even world-writable: the uid alone must not be what holds
    before = {path: path.read_bytes() for path in (secret, db)}
    yield {"secret": secret, "db": db}
    try:
        for path, data in before.items():
            assert path.read_bytes() == data, f"{path} changed"
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("select count(*) from votes").fetchone() == (1000,)
    finally:
        secret.unlink(missing_ok=True)


def test_every_layer_is_reported_on_or_off_with_a_reason(report):
    expected = {"uid", "namespaces", "filesystem", "rlimits", "capabilities", "landlock", "seccomp", "cgroup",
                "pid namespace", "integrity", "wire", "checker"}
    assert expected <= set(report)
    for layer, status in report.items():
        assert status.startswith(("on: ", "off: ")) and len(status) > 8, (layer, status)
    assert report["checker"].startswith("off")  # this pool runs with the checker bypassed
    assert report["integrity"].startswith("on") and report["wire"].startswith("on")


def test_app_files_cannot_be_read(pool, report, decoys):
    need(report, "filesystem", "landlock")
    attacks = [hostile(f"read_{key}", f"open({str(path)!r}, 'rb').read(1)") for key, path in decoys.items()]
    attacks += [hostile("list_project", f"assert os.listdir({str(ROOT)!r})"),
                hostile("stat_db", f"os.stat({str(decoys['db'])!r})")]
    assert_held(run_with_benign(pool, *attacks))


def test_app_files_cannot_be_written_truncated_deleted_or_mapped(pool, report, decoys):
    need(report, "filesystem", "landlock")
    db = str(decoys["db"])
    attacks = [
        hostile("write", f"fh = open({db!r}, 'r+b')\nfh.write(b'XXXX')\nfh.flush()"),
        hostile("truncate", f"os.truncate({db!r}, 0)"),
        hostile("delete", f"os.remove({str(decoys['secret'])!r})"),
        hostile("rename", f"os.rename({db!r}, {db + '.moved'!r})"),
        hostile("mmap", f"import mmap\nfd = os.open({db!r}, os.O_RDWR)\nm = mmap.mmap(fd, 4096)\nm[:4] = b'XXXX'"),
    ]
    assert_held(run_with_benign(pool, *attacks))


def test_no_connection_reaches_a_listener_on_loopback(pool, report):
    need(report, "namespaces", "seccomp", "landlock")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        attacks = [
            hostile("raw_socket", f"s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
                                  f"s.settimeout(1)\ns.connect(('127.0.0.1', {port}))"),
            hostile("socket_module", f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)"),
            hostile("syscall_socket", "libc = ctypes.CDLL(None, use_errno=True)\n"
                                      "assert libc.syscall(41, 2, 1, 0) >= 0"),  # socket(AF_INET, SOCK_STREAM)
            hostile("unix_socket", "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\n"
                                   "s.connect('/run/systemd/private')"),
        ]
        assert_held(run_with_benign(pool, *attacks))
        listener.settimeout(0.3)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_other_processes_cannot_be_signalled_or_read(pool, report):
    need(report, "pid namespace", "seccomp", "landlock")
    decoy = subprocess.Popen(["sleep", "60"])
    me = os.getpid()
    try:
        attacks = [
            hostile("kill", f"os.kill({decoy.pid}, signal.SIGKILL)"),
            hostile("killpg", "os.killpg(0, signal.SIGKILL)"),
            hostile("kill_all", "os.kill(-1, 0)"),  # signal 0: probes, so a regression cannot kill the machine
            hostile("kill_init", "os.kill(1, signal.SIGKILL)"),
            hostile("environ", f"assert open('/proc/{me}/environ', 'rb').read()"),
            hostile("parent_mem", f"fh = open('/proc/{me}/mem', 'r+b')"),
            hostile("vm_read", f"""
                libc = ctypes.CDLL(None, use_errno=True)
                buf = ctypes.create_string_buffer(8)
                local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
                remote = (ctypes.c_void_p * 2)({id(me)}, 8)
                assert libc.process_vm_readv({me}, local, 1, remote, 1, 0) > 0
            """),
            hostile("ptrace", f"assert ctypes.CDLL(None, use_errno=True).ptrace(16, {decoy.pid}, 0, 0) == 0"),
        ]
        assert_held(run_with_benign(pool, *attacks))
        time.sleep(0.2)
        assert decoy.poll() is None, "the decoy process was killed"
    finally:
        decoy.kill()
        decoy.wait()
    assert pool.run([BENIGN], EXAMPLES, LABELS)[0].votes.tolist() == BENIGN_VOTES  # the pool survived


def test_no_shell_and_no_process_outlives_the_job(tmp_path, report):
    need(report, "seccomp")
    marker = tmp_path / "pwned"
    attacks = [
        hostile("system", f"assert os.system('touch {marker}') == 0"),
        hostile("exec", f"os.execv('/bin/sh', ['sh', '-c', 'touch {marker}'])"),
        hostile("fork", "pid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)"),
        hostile("fork_bomb", "for _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)"),  # bounded
        hostile("raw_clone", "assert ctypes.CDLL(None, use_errno=True).syscall(57) >= 0"),  # fork(2)
        hostile("setsid", "os.setsid()"),
    ]
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0, unchecked=True) as ex:
        results = ex.run([*attacks, BENIGN], EXAMPLES, LABELS)
        session = ex._workers[0].proc.pid  # the worker leads its own session; every descendant stays in it
    assert results[-1].votes.tolist() == BENIGN_VOTES
    assert_held(results[:-1])
    assert not marker.exists()
    time.sleep(0.2)
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # field 6 of /proc/<pid>/stat: the session id
            left.append(stat.parent.name)
    assert left == [], f"processes outlived the pool: {left}"


def test_poisoning_a_shared_module_does_not_change_the_next_annotator(report):
    poison = Annotator(id="poison", name="poison", agent="human", generation=0, source=(
        "import re, builtins\n\ndef annotate(example):\n"
        "    re.search = lambda *a, **k: True\n    re.compile = None\n"
        "    builtins.len = lambda x: 0\n    example['text'] = 'free'\n    return None\n"))
    with SandboxExecutor(workers=1, unchecked=True) as ex:  # one worker: the benign one runs right after
        first, second = ex.run([poison, BENIGN], EXAMPLES, LABELS)
        again = ex.run([BENIGN], EXAMPLES, LABELS)[0]
    assert first.votes.tolist() == [ABSTAIN] * 4  # it broke only itself (its own reply needs len)
    assert second.votes.tolist() == BENIGN_VOTES == again.votes.tolist()


def test_forged_and_oversized_replies_only_fault_their_own_annotator():
    frame = b'{"ok":true,"votes":[7,7,7,7,7],"faults":0,"first_error":null,"stopped":false,"seconds":0.0}'
    forge = hostile("forge", f"""
        data = len({frame!r}).to_bytes(4, 'big') + {frame!r}
        print({frame!r})
        sys.stdout.write('x')
        for fd in range(4096):
            try:
                os.write(fd, data)
            except OSError:
                pass
    """)
    huge = hostile("oversized", "for fd in range(3, 4096):\n    try:\n        os.write(fd, b'\\x7f\\xff\\xff\\xff')\n"
                                "    except OSError:\n        pass")
    flood = hostile("flood", "for _ in range(100):\n    os.write(1, b'x' * 1_000_000)\n"
                             "    os.write(2, b'y' * 1_000_000)")
    # a busy server hands the worker's reply pipe a high descriptor number: the attacks must not find it
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(200)]
    try:
        with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0, unchecked=True) as ex:
            ex.containment()
            forged, oversized, flooded, benign = ex.run([forge, huge, flood, BENIGN], EXAMPLES, LABELS)
            assert ex.run([BENIGN], EXAMPLES, LABELS)[0].votes.tolist() == BENIGN_VOTES
    finally:
        for fd in held:
            os.close(fd)
    assert benign.votes.tolist() == BENIGN_VOTES
    assert forged.faults == len(EXAMPLES) and "malformed votes" in forged.first_error
    assert oversized.faults == len(EXAMPLES) and "over the" in oversized.first_error
    # stdout and stderr are a pipe nobody reads: the write fails (and is the annotator's own business)
    assert flooded.faults == 0 and flooded.votes.tolist() == [HELD] * 4


def test_a_forged_run_time_faults_nobody_else_and_the_next_run_sees_no_earlier_reply():
    """A run writes a well-formed reply of its own whose seconds are 4,000 digits (valid JSON, too big for a
    float): its votes stand, its time is zero, and the other annotators of the call keep theirs (it once raised
    out of `run()` for all). The run after another finds no trace of that one's reply in the frames it inherits."""
    votes = "base64.b64encode(bytes([255, 255, 255, 255])).decode()"
    forge = hostile("seconds", f"""
        body = ('{{"ok":true,"votes":"%s","faults":0,"first_error":null,"stopped":false,"seconds":%s}}'
                % ({votes}, '9' * 4000)).encode()
        os.write(4, len(body).to_bytes(4, 'big') + body)
        os._exit(0)
    """, prelude="import base64\n")
    snoop = hostile("snoop", """
        frame = sys._getframe()
        while frame is not None and frame.f_code.co_name != 'serve':
            frame = frame.f_back
        if frame is None or frame.f_locals.get('reply') is not None:
            return 'breach'
        raise RuntimeError('no earlier reply in reach')
    """)
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0, unchecked=True) as ex:
        forged, benign, seen = ex.run([forge, BENIGN, snoop], EXAMPLES, LABELS)
    assert forged.faults == 0 and forged.votes.tolist() == [ABSTAIN] * 4 and forged.seconds == 0.0
    assert benign.votes.tolist() == BENIGN_VOTES
    assert seen.faults == 0 and seen.votes.tolist() == [HELD] * 4


def test_a_runs_stdout_is_no_host_file_and_it_starts_no_thread(pool):
    """fds 1 and 2 of a run were the host's /dev/null: an open fd lets utimes and flock reach the inode, which no
    Landlock right covers. Now they are a pipe (not a device: nothing of the host's to touch or lock). A run starts no
    thread (on x86_64 the RUN filter refuses clone first; RLIMIT_NPROC 0 stands in elsewhere, for a non-root uid)."""
    before = os.stat(os.devnull).st_mtime
    touch = hostile("touch", "os.utime(1)")
    same = hostile("same_inode", """
        st = os.fstat(1)
        import stat
        if stat.S_ISCHR(st.st_mode):
            return 'breach'
        raise RuntimeError('not a device')
    """)
    thread = hostile("thread", "import _thread\n_thread.start_new_thread(time.sleep, (1,))")
    touched, device, threaded = pool.run([touch, same, thread], EXAMPLES, LABELS)
    assert device.votes.tolist() == [HELD] * 4
    assert threaded.votes.tolist() == [HELD] * 4
    assert os.stat(os.devnull).st_mtime == before


def test_a_run_cannot_read_how_long_the_host_has_been_up(pool, report):
    """With no time namespace a run read the host's uptime (CLOCK_BOOTTIME, CLOCK_MONOTONIC): a fingerprint of the
    machine and of when it last booted. Its clocks now start at 0 when the worker starts."""
    need(report, "namespaces")
    if "no time namespace" in report["namespaces"]:
        pytest.skip(report["namespaces"])
    host = min(time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime(time.CLOCK_MONOTONIC))
    if host < 120:
        pytest.skip(f"the host booted {host:.0f} s ago: too recently to tell its uptime from the worker's")
    uptime = hostile("uptime", f"""
        if max(time.clock_gettime(time.CLOCK_BOOTTIME), time.monotonic()) < {host / 2}:
            raise RuntimeError('the clock of the worker, not of the host')
    """)
    # times(2) returns the host's clock ticks since boot (from a fixed start near 2^32): no namespace covers it
    ticks = hostile("ticks", """
        if not os.times().elapsed:  # refused: glibc answers 0 (it takes the syscall's -EPERM for a tick count)
            raise PermissionError('times refused')
    """)
    assert "time (the clocks of its runs start at 0" in report["namespaces"]
    attacks = [uptime, ticks] if report["seccomp"].startswith("on") else [uptime]  # BASE refuses times(2)
    held = run_with_benign(pool, *attacks)
    assert [result.votes.tolist() for result in held] == [[HELD] * 4] * len(attacks)  # held, not faulted: it ran


def test_cpu_and_memory_hogs_are_faults(pool):
    spin = hostile("spin", "while True:\n    try:\n        while True:\n            pass\n"
                           "    except BaseException:\n        pass")
    c_loop = hostile("c_loop", "sum(range(10 ** 13))")
    memory = hostile("memory", "x = bytearray(8 * 2 ** 30)")
    spin_res, c_res, mem_res = run_with_benign(pool, spin, c_loop, memory)
    assert spin_res.faults == len(EXAMPLES) and spin_res.first_error.startswith("timeout after")
    assert c_res.faults == len(EXAMPLES) and c_res.first_error.startswith("timeout after")
    assert mem_res.votes.tolist() == [HELD] * 4  # MemoryError, caught by the annotator itself


def test_with_the_checker_on_every_hostile_annotator_is_rejected_first():
    for attack in ("open('/etc/passwd')", "os.kill(1, 9)", "_socket.socket()"):
        with pytest.raises(CodeRejected):
            check_source(hostile("x", attack).source)


def test_a_required_layer_that_is_off_refuses_to_run():
    with SandboxExecutor(workers=1, require=["no-such-layer"]) as ex:
        assert "no-such-layer" not in ex.containment()  # the report itself still works
        with pytest.raises(RuntimeError, match="required sandbox layers are off: no-such-layer"):
            ex.run([BENIGN], EXAMPLES, LABELS)
    assert issubclass(ContainmentTooWeak, RuntimeError)


def test_confinement_as_a_non_root_user():
    """What a user without root gets: their own uid, and every other layer the kernel allows them."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user first")
    script = textwrap.dedent("""
        import json, os, sys
        from engine.sandbox import confine
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setgroups([]); os.setresgid(1000, 1000, 1000); os.setresuid(1000, 1000, 1000)
            try:
                report = confine.confine(256)
            except BaseException as exc:
                report = {"error": repr(exc)}
            report["root_listing"] = str(os.listdir("/")) if report["landlock"].startswith("off") else "n/a"
            os.write(write_fd, json.dumps(report).encode())
            os._exit(0)
        os.close(write_fd)
        data = os.read(read_fd, 1 << 16)
        os.waitpid(pid, 0)
        print(data.decode())
    """)
    proc = subprocess.run([sys.executable, "-S", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    report = json.loads(proc.stdout)
    assert report["uid"].startswith("off: not started as root, so it keeps uid 1000")
    assert report["capabilities"].startswith("on") and report["rlimits"].startswith("on")
    if report["namespaces"].startswith("off"):
        pytest.skip(f"user namespaces unavailable to non-root users here: {report['namespaces']}")
    assert report["filesystem"].startswith("on")
    assert report["seccomp"].startswith("on") or "x86_64 only" in report["seccomp"]
    assert confine.NOBODY == 65534


class _PoolOnly:
    """Just what `pool_as_python` reads of a store: the task and the pool's annotators."""

    def __init__(self, annotators: list[Annotator], task_name: str = "containment"):
        self._annotators = annotators
        self._task_name = task_name

    def load_task(self) -> Task:
        return Task(self._task_name, tuple(LABELS))

    def pool_ids(self) -> list[str]:
        return [a.id for a in self._annotators]

    def annotators(self, ids: list[str]) -> list[Annotator]:
        return [a for a in self._annotators if a.id in ids]


def test_names_in_the_exported_pool_are_never_code(tmp_path):
    """A task name holding a triple quote closed the file's docstring, and an annotator name holding a newline (a
    label from the data starts each offline name) left its comment line: either ran as code when the file was merely
    loaded, before its refusal to run without a sandbox (a red-team review)."""
    planted = [tmp_path / "by_task_name", tmp_path / "by_annotator_name"]
    task_name = f'spam"""if __import__("os").mkdir({json.dumps(str(planted[0]))})else"""'
    named = Annotator(id="named", name=f'spam\nimport os; os.mkdir({json.dumps(str(planted[1]))})\n#', agent="human",
                      generation=0, source=BENIGN.source)
    script = tmp_path / "pool.py"
    script.write_text(pool_as_python(_PoolOnly([named], task_name)))  # type: ignore[arg-type]
    bare = subprocess.run([sys.executable, "-I", "-S", str(script)], input="", capture_output=True, text=True,
                          timeout=60)
    assert "EvoPool is not installed" in bare.stderr  # it got as far as its refusal
    assert not any(path.exists() for path in planted)
    compiled = compile(script.read_text(), str(script), "exec")
    namespace: dict = {"__name__": "loaded"}
    exec(compiled, namespace)  # noqa: S102 - the export itself, loaded as a module: its names are data
    assert namespace["TASK"] == task_name and "named" in namespace["SOURCES"]


def test_the_exported_pool_runs_its_annotators_in_the_sandbox(tmp_path, decoys):
    """The exported .py: sandboxed where the engine is installed, refused without it unless --unsandboxed."""
    thief = Annotator(id="thief", name="thief", agent="human", generation=0, source=(
        f"def annotate(example):\n    return 'breach' if open({str(decoys['secret'])!r}).read() else None\n"))
    from engine.specs.templates import AnnotatorSpec, render

    # an offline template (its `normalise(text: object)` once failed without a sandbox: `object` was not allowed)
    # and a chatty one (print must not reach the labels on stdout)
    template = Annotator(id="template", name="template", agent="generator", generation=1,
                         source=render(AnnotatorSpec("cue", "spam", "sentence", ("free",))))
    chatty = Annotator(id="chatty", name="chatty", agent="human", generation=0,
                       source="def annotate(example):\n    print('hello')\n    return None\n")
    script = tmp_path / "pool.py"
    script.write_text(pool_as_python(_PoolOnly([thief, BENIGN, template, chatty])))  # type: ignore[arg-type]
    text = script.read_text()
    assert "THIS FILE RUNS CODE" in text and "exec(" not in text.split("_SAFE_BUILTINS")[0]
    rows = "\n".join(json.dumps(e) for e in EXAMPLES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sandboxed = subprocess.run([sys.executable, str(script)], input=rows, capture_output=True, text=True,
                               env=env, timeout=120, check=True)
    assert [json.loads(line)["label"] for line in sandboxed.stdout.splitlines()] == \
        ["spam", None, "spam", None]  # the thief faulted on every row; the benign annotator voted
    bare = [sys.executable, "-I", "-S", str(script)]  # no site-packages, no PYTHONPATH: no engine, no sandbox
    refused = subprocess.run(bare, input=rows, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "no sandbox" in refused.stderr
    restricted = subprocess.run(bare + ["--unsandboxed"], input=rows, capture_output=True, text=True,
                                timeout=60, check=True)
    assert [json.loads(line)["label"] for line in restricted.stdout.splitlines()] == ["spam", None, "spam", None]


def test_the_parent_trusts_no_worker_reply():
    from engine.sandbox.executor import _check_votes
    from engine.sandbox.process import WorkerFailed
    from engine.sandbox.wire import pack_votes

    good = {"votes": pack_votes([0, -1, 2], 3), "faults": 0, "stopped": False}
    _check_votes(dict(good), 3, 3)
    for bad, why in [({**good, "votes": pack_votes([0, 3, 1], 3)}, "outside the label set"),
                     ({**good, "votes": pack_votes([0, -2, 1], 3)}, "outside the label set"),
                     ({**good, "votes": [0, 1, 2]}, "malformed votes"),
                     ({**good, "votes": "AAE=!"}, "malformed votes"),
                     ({**good, "votes": pack_votes([0, 1], 3)}, "2 votes for 3"),
                     ({**good, "faults": "0"}, "malformed")]:
        with pytest.raises(WorkerFailed, match=why):
            _check_votes(bad, 3, 3)


def test_frames_are_capped_and_deadlined():
    from engine.sandbox.wire import FrameError, FrameReader, encode

    read_fd, write_fd = os.pipe()
    try:
        reader = FrameReader(read_fd)
        os.write(write_fd, encode({"ok": True, "n": 1}) + encode({"ok": True, "n": 2}))
        assert reader.read(1.0, 100) == {"ok": True, "n": 1}
        assert reader.read(1.0, 100)["n"] == 2
        os.write(write_fd, (1 << 30).to_bytes(4, "big"))
        with pytest.raises(FrameError, match="over the 100-byte cap"):
            reader.read(1.0, 100)
        reader = FrameReader(read_fd)
        os.write(write_fd, (10).to_bytes(4, "big") + b'{"ok"')  # a frame that never completes
        with pytest.raises(FrameError) as err:
            reader.read(0.2, 100)
        assert err.value.timed_out
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_evopool_doctor_prints_the_layers_as_json(capsys):
    from engine.cli import main

    assert main(["doctor"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["sandbox"]["checker"].startswith("on")
    assert out["layers_off"] == [name for name, status in out["sandbox"].items() if status.startswith("off")]
    assert out["sandbox"]["cgroup"].startswith("on" if os.geteuid() == 0 else "off")


def test_without_namespaces_the_other_layers_still_hold(decoys):
    """A machine without user namespaces: the worker says so, and Landlock, seccomp and nobody still refuse."""
    script = textwrap.dedent("""
        import sys
        from engine.sandbox import confine
        import engine.sandbox.worker as worker
        confine.enter_namespaces = lambda: "off: simulated (no user namespaces)"
        sys.argv = ["worker", "--reply-fd", sys.argv[1], "--unchecked"]
        worker.main()
    """)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-S", "-c", script, str(write_fd)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                            start_new_session=True, env={"PATH": "/usr/bin:/bin"})
    os.close(write_fd)
    from engine.sandbox.wire import FrameReader, unpack_votes

    frames = FrameReader(read_fd)
    try:
        report = frames.read(30, 1 << 20)["containment"]
        assert report["namespaces"].startswith("off: simulated")
        assert report["filesystem"].startswith("off") and report["pid namespace"].startswith("off")
        if not (report["landlock"].startswith("on") and report["seccomp"].startswith("on")):
            pytest.skip(f"needs Landlock and seccomp: {report['landlock']}; {report['seccomp']}")
        thief = hostile("thief", f"open({str(decoys['secret'])!r}, 'rb').read(1)")
        writer = hostile("writer", f"os.truncate({str(decoys['db'])!r}, 0)")
        load = {"op": "load", "offset": 0, "labels": LABELS, "examples": EXAMPLES}
        proc.stdin.write((json.dumps(load) + "\n").encode())
        proc.stdin.flush()
        assert frames.read(30, 1 << 20)["n"] == len(EXAMPLES)
        votes = {}
        for annotator in (thief, writer, BENIGN):
            run = {"op": "run", "source_bytes": len(annotator.source.encode()), "budget_s": 2.0, "wall_s": 10.0}
            proc.stdin.write((json.dumps(run) + "\n").encode())
            proc.stdin.flush()
            assert frames.read(30, 1 << 20) == {"ok": True, "awaiting": "source"}
            proc.stdin.write(annotator.source.encode())
            proc.stdin.flush()
            assert frames.read(30, 1 << 20) == {"ok": True, "awaiting": "nonce"}
            proc.stdin.write(b"%032x\n" % 1)
            proc.stdin.flush()
            votes[annotator.id] = unpack_votes(frames.read(30, 1 << 20)["votes"], len(LABELS)).tolist()
        assert votes["thief"] == votes["writer"] == [HELD] * 4
        assert votes["benign"] == BENIGN_VOTES
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        os.close(read_fd)


MEMORY_HOG = Annotator(id="hog", name="hog", agent="human", generation=0, source=(
    "def annotate(example):\n    block = b'x' * (300 << 20)\n    return 'breach' if block else 'held'\n"))


def test_the_worker_cgroup_caps_the_tree_memory_and_goes_with_the_worker(report):
    """300 MiB fits under the per-process address-space limit (512 MiB) but not under a 128 MiB cgroup: the
    hog is killed, its annotator faulted, the next annotator unharmed, and the cgroup gone with the worker."""
    need(report, "cgroup")
    with SandboxExecutor(workers=1, time_budget_s=2.0, per_example_s=0.0, unchecked=True) as ex:
        assert ex.run([MEMORY_HOG], EXAMPLES[:1], LABELS)[0].votes.tolist() == [BREACH]  # rlimits alone: fits
    with SandboxExecutor(workers=1, time_budget_s=2.0, per_example_s=0.0, unchecked=True,
                         tree_memory_mb=128) as ex:
        assert "128 MiB" in ex.containment()["cgroup"]
        group = ex._workers[0].cgroup
        assert ex._workers[0].proc.pid in group.pids()
        hog, benign = ex.run([MEMORY_HOG, BENIGN], EXAMPLES, LABELS)
        assert benign.votes.tolist() == BENIGN_VOTES
        assert hog.faults == len(EXAMPLES) and "memory cap" in hog.first_error
        members = group.pids()
    assert not any(d.exists() for d in group.dirs)
    for pid in members:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_the_cgroup_caps_forks_and_kills_everything_in_it(report):
    """pids.max holds a fork bomb in a process that joined the cgroup (seccomp refuses a run's forks before
    this in a worker); removing the cgroup leaves no process behind."""
    need(report, "cgroup")
    from engine.sandbox.cgroup import WorkerCgroup
    group, why = WorkerCgroup.create(256 << 20, 8)
    assert group is not None, why
    bomb = textwrap.dedent(f"""
        import os, sys, time
        for procs in {group.procs_files!r}:
            open(procs, "w").write(str(os.getpid()))
        made = 0
        for _ in range(40):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
                made += 1
            except OSError:
                pass
        print(made, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", bomb], stdout=subprocess.PIPE, text=True)
    try:
        made = int(proc.stdout.readline())
        members = group.pids()
        assert made < 8 and len(members) == made + 1
    finally:
        group.remove()
        proc.wait(timeout=10)
    assert not any(d.exists() for d in group.dirs)
    for pid in members:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_hostile_files_through_evopool_pool_add_are_refused_or_faulted(tmp_path, decoys, capsys):
    """The editor's headless path with the checker on: every hostile file is refused by the checks, and code
    that passes them but misbehaves (a spin, a raise) faults in the sandbox and the gate keeps it out."""
    from engine.cli import main

    ws = str(tmp_path / "ws")
    assert main(["run", str(ROOT / "data" / "demo" / "youtube_spam.csv"), "--workdir", ws, "--generations", "0"]) == 0
    attacks = [
        hostile("shell", "os.system('id')"),
        hostile("read_secret", f"open({str(decoys['secret'])!r}).read()"),
        hostile("truncate_db", f"open({str(decoys['db'])!r}, 'w')"),
        hostile("socket", "_socket.socket().connect(('127.0.0.1', 9))"),
        hostile("poison", "re.search = lambda *a, **k: True"),
        Annotator(id="spin", name="spin", agent="human", generation=0,
                  source="def annotate(example):\n    while True:\n        pass\n"),
        Annotator(id="raise", name="raise", agent="human", generation=0,
                  source="def annotate(example):\n    return {}['x']\n"),
    ]
    verdicts = {}
    for attack in attacks:
        path = tmp_path / f"{attack.id}.py"
        path.write_text(attack.source)
        code = main(["pool", "add", str(path), "--workdir", ws])
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 1 and not result["added"], (attack.id, result)
        verdicts[attack.id] = result["verdict"]
    assert {k: v for k, v in verdicts.items() if k not in ("spin", "raise")} == dict.fromkeys(
        ["shell", "read_secret", "truncate_db", "socket", "poison"], "refused")
    assert verdicts["spin"] == verdicts["raise"] == "reject"


def test_a_frame_on_the_reply_pipe_without_the_runs_nonce_is_refused():
    """Forge what the first pass feared: a well-formed acknowledgement and reply written straight into the
    init's reply pipe (as a process holding that descriptor could). Without this run's nonce the parent
    refuses it, kills the worker, and the next run on a fresh worker is right."""
    if os.geteuid() != 0:
        pytest.skip("opening another process's pipe through /proc needs root here")
    from engine.sandbox.process import WorkerFailed, WorkerProcess
    from engine.sandbox.wire import AWAITING_NONCE, AWAITING_SOURCE, encode, unpack_votes

    worker = WorkerProcess(256)
    try:
        load = {"op": "load", "offset": 0, "labels": LABELS, "examples": EXAMPLES}
        worker.load((json.dumps(load) + "\n").encode(), 30)
        run = (BENIGN.source, 1.0, 3.0, 10, 4096)
        assert unpack_votes(worker.run(*run)["votes"], len(LABELS)).tolist() == BENIGN_VOTES
        init = int(Path(f"/proc/{worker.proc.pid}/task/{worker.proc.pid}/children").read_text().split()[0])
        forged = {"ok": True, "votes": [BREACH] * 4, "faults": 0, "first_error": None, "stopped": False,
                  "seconds": 0.0, "nonce": "0" * 32}
        with open(f"/proc/{init}/fd/{worker.worker_reply_fd}", "wb") as pipe:
            pipe.write(encode(AWAITING_SOURCE) + encode(AWAITING_NONCE) + encode(forged))
        with pytest.raises(WorkerFailed, match="nonce"):
            worker.run(*run)
        assert not worker.alive()
    finally:
        worker.close()
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0) as ex:
        assert ex.run([BENIGN], EXAMPLES, LABELS)[0].votes.tolist() == BENIGN_VOTES


def test_a_source_with_a_lone_surrogate_faults_its_annotator_not_the_whole_run():
    """Text no UTF-8 can hold (an exported labeler's edited SOURCES may carry one) made run() raise for every
    annotator of the call; now it reaches the child as '?' and only its own annotator is judged."""
    odd = Annotator("odd", "odd", "def annotate(example):\n    return 'spam\ud83d'\n", "generator", 0)
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0) as ex:
        benign, broken = ex.run([BENIGN, odd], EXAMPLES, LABELS)
    assert benign.votes.tolist() == BENIGN_VOTES
    assert broken.faults == len(EXAMPLES) and (broken.votes == ABSTAIN).all()


def test_a_run_whose_child_fails_before_taking_its_source_ends_the_worker_not_the_parent():
    """Our own code in the run's child failing before it reads its source (here: a CPU budget it cannot set as its
    limit) left the holder reading the rest of a long source as requests, answering each while the parent, still
    writing, read nothing: both blocked for good, and close() with them. Now the worker ends and the parent's write
    fails at once; a source of short lines, of the checker's size, is what filled the pipes."""
    from engine.sandbox.process import WorkerFailed, WorkerProcess

    long_source = ("WORDS = [\n" + "".join(f"    'w{i}',\n" for i in range(7500))
                   + "]\ndef annotate(example):\n    return 'a'\n")
    worker = WorkerProcess(256)
    outcome: dict = {}

    def run() -> None:
        try:
            worker.run(long_source, 1e300, 5.0, 10.0, 4096)
        except WorkerFailed as err:
            outcome["failed"] = str(err)

    try:
        load = {"op": "load", "offset": 0, "labels": LABELS, "examples": EXAMPLES}
        worker.load((json.dumps(load) + "\n").encode(), 30)
        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        caller.join(30)  # a deadline for a hang, not a measurement
        assert not caller.is_alive(), "the run blocked for good"
        assert "failed" in outcome and not worker.alive()
    finally:
        closer = threading.Thread(target=worker.close, daemon=True)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() blocked"
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0) as ex:
        assert ex.run([BENIGN], EXAMPLES, LABELS)[0].votes.tolist() == BENIGN_VOTES


def test_a_run_cannot_change_the_limits_priority_or_cpus_every_later_run_inherits(report):
    need(report, "seccomp")
    attacks = [
        hostile("cpu_limit", "import resource\nresource.prlimit(1, resource.RLIMIT_CPU, (1, 1))"),
        hostile("files_limit", "import resource\nresource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))"),
        hostile("nice", "os.setpriority(os.PRIO_PROCESS, 1, 19)"),
        hostile("affinity", "os.sched_setaffinity(1, {0})"),
        hostile("scheduler", "os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))"),
    ]
    with SandboxExecutor(workers=1, unchecked=True) as ex:  # one worker: the benign runs come after, under its init
        results = ex.run([*attacks, BENIGN], EXAMPLES, LABELS)
        assert_held(results[:-1])
        for later in range(3):  # the limits used to stick: the benign annotator faulted for a thousand runs
            (benign,) = ex.run([BENIGN], EXAMPLES, LABELS)
            assert benign.votes.tolist() == BENIGN_VOTES and benign.faults == 0, (later, benign.first_error)
    # on itself it may still lower its own limits (glibc passes pid 0): that binds only the run's own process
    own = hostile("own", "import resource\nlimits = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                         "resource.prlimit(0, resource.RLIMIT_NOFILE, limits)")
    with SandboxExecutor(workers=1, unchecked=True) as ex:
        assert ex.run([own], EXAMPLES, LABELS)[0].votes.tolist() == [BREACH] * 4


PRIORITY_PROBE = Annotator(id="probe", name="probe", agent="human", generation=0, source=(
    "import os, ctypes\n\ndef annotate(example):\n"
    "    ioprio = ctypes.CDLL(None).syscall(252, 1, 0)  # ioprio_get(IOPRIO_WHO_PROCESS, self)\n"
    "    raise RuntimeError('nice=%d ioprio=%d' % (os.getpriority(os.PRIO_PROCESS, 0), ioprio))\n"))


def test_a_run_cannot_renice_its_process_group_or_uid(report):
    """who == 0 is the caller only with PRIO_PROCESS / IOPRIO_WHO_PROCESS: with PRIO_PGRP / PRIO_USER it is the
    caller's group or uid, which hold the init every later holder and run descends from."""
    need(report, "seccomp")
    ioprio = "assert ctypes.CDLL(None).syscall(251, {}, 0, 3 << 13) == 0"  # ioprio_set(which, 0, idle class)
    attacks = [hostile("nice_group", "os.setpriority(os.PRIO_PGRP, 0, 19)"),
               hostile("ioprio_group", ioprio.format(2))]  # IOPRIO_WHO_PGRP
    if report["pid namespace"].startswith("on"):  # by uid only where no process outside this worker is in reach
        attacks += [hostile("nice_user", "os.setpriority(os.PRIO_USER, 0, 19)"),
                    hostile("ioprio_user", ioprio.format(3))]  # IOPRIO_WHO_USER
    with SandboxExecutor(workers=1, unchecked=True) as ex:  # one worker: every run descends from the same init
        (before,) = ex.run([PRIORITY_PROBE], EXAMPLES[:1], LABELS)
        assert_held(ex.run(attacks, EXAMPLES, LABELS))
        (after,) = ex.run([PRIORITY_PROBE], EXAMPLES[:1], LABELS)
        assert after.first_error == before.first_error and "nice=" in after.first_error
        own = hostile("own", f"os.setpriority(os.PRIO_PROCESS, 0, 19)\n{ioprio.format(1)}")  # on itself: allowed
        assert ex.run([own], EXAMPLES, LABELS)[0].votes.tolist() == [BREACH] * 4


@pytest.fixture
def weak_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Executors started after `weak_host(namespaces=False, landlock_abi=N)` run their workers as on a machine
    without user namespaces and with Landlock ABI at most N (the worker's own confine, patched before it runs)."""
    def simulate(namespaces: bool = True, landlock_abi: int | None = None) -> None:
        shim = tmp_path / "weak_worker.py"
        shim.write_text(textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(ROOT)!r})
            from engine.sandbox import confine, landlock
            import engine.sandbox.worker as worker
            if not {namespaces!r}:
                confine.enter_namespaces = lambda: "off: simulated (no user namespaces)"
            if {landlock_abi!r} is not None:
                real_abi = landlock.abi_version
                landlock.abi_version = lambda: min(real_abi(), {landlock_abi!r})
            assert sys.argv[1:4] == ["-S", "-m", "engine.sandbox.worker"], sys.argv
            sys.argv = ["worker", *sys.argv[4:]]
            worker.main()
        """))
        wrapper = tmp_path / "python"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S {shim} "$@"\n')
        wrapper.chmod(0o755)
        tmp_path.chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(wrapper))  # engine.sandbox.process starts workers with it
    return simulate


def test_a_run_cannot_have_the_kernel_signal_for_it(report):
    """fcntl F_SETOWN / F_SETSIG / F_SETOWN_EX and O_ASYNC on a pipe: the kernel, not the run, would send the
    signal (SIGIO), which RUN's "no signals" rules never see."""
    need(report, "seccomp")
    attacks = [hostile(name, f"r, w = os.pipe()\nassert ctypes.CDLL(None).fcntl(r, {cmd}, {arg}) == 0")
               for name, cmd, arg in [("setown", 8, "os.getpid()"), ("setsig", 10, "signal.SIGKILL"),
                                      ("setown_ex", 15, "ctypes.byref((ctypes.c_int * 2)(1, os.getpid()))")]]
    getown = hostile("getown", "r, w = os.pipe()\nassert ctypes.CDLL(None).fcntl(r, 9) == 0")  # F_GETOWN: allowed
    with SandboxExecutor(workers=1, unchecked=True) as ex:
        results = ex.run([*attacks, getown], EXAMPLES, LABELS)
    assert_held(results[:-1])
    assert results[-1].votes.tolist() == [BREACH] * 4


def test_without_namespaces_or_signal_scoping_sigio_kills_no_process_of_nobody(weak_host):
    """Where nothing else holds (no pid namespace, Landlock before ABI 6), a run must still not have the kernel
    send SIGKILL (F_SETSIG) or SIGIO (F_SETOWN_EX) to a process of nobody outside its worker."""
    if os.geteuid() != 0:
        pytest.skip("the decoys run as nobody, which needs root")
    weak_host(namespaces=False, landlock_abi=5)
    decoys = [subprocess.Popen(["sleep", "60"], user=confine.NOBODY, group=confine.NOBODY, start_new_session=True)
              for _ in range(2)]
    try:
        owner = ["fcntl(r, 8, {pid}) == 0 and libc.fcntl(r, 10, signal.SIGKILL)",  # F_SETOWN, F_SETSIG
                 "fcntl(r, 15, ctypes.byref((ctypes.c_int * 2)(1, {pid})))"]  # F_SETOWN_EX (F_OWNER_PID)
        attacks = [hostile(f"sigio_{i}", f"""
            libc = ctypes.CDLL(None)
            r, w = os.pipe()
            assert libc.{how.format(pid=decoy.pid)} == 0
            assert libc.fcntl(r, 4, libc.fcntl(r, 3) | os.O_ASYNC) == 0  # F_SETFL
            os.write(w, b'x')  # the read end is ready: the kernel signals its owner
            time.sleep(0.1)
        """) for i, (how, decoy) in enumerate(zip(owner, decoys, strict=True))]
        with SandboxExecutor(workers=1, time_budget_s=2.0, per_example_s=0.0, unchecked=True) as ex:
            report = ex.containment()
            assert report["namespaces"].startswith("off: simulated") and report["pid namespace"].startswith("off")
            if not report["seccomp"].startswith("on"):
                pytest.skip(f"needs seccomp: {report['seccomp']}")
            assert "signals" not in report["landlock"]
            results = ex.run(attacks, EXAMPLES[:1], LABELS)
        time.sleep(0.2)
        assert [decoy.poll() for decoy in decoys] == [None, None], "a decoy was killed"
        assert_held(results)
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait()


def reaches_the_kernel(call: str) -> str:
    """Attack text: breach when `call` (a libc.syscall) is not refused by seccomp (EPERM)."""
    return (f"libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            f"assert {call} >= 0 or ctypes.get_errno() != 1")


def test_mounts_host_memory_writeback_and_truncate_are_refused(report):
    """listmount / statmount read the mount table without a path, sysinfo the host's memory and load, sync and
    syncfs start host-wide writeback, and truncate is outside Landlock before ABI 3."""
    need(report, "seccomp")
    listmount = "libc.syscall(458, ctypes.create_string_buffer(struct.pack('IIQQ', 24, 0, (1 << 64) - 1, 0)), " \
                "(ctypes.c_uint64 * 64)(), 64, 0)"  # LSMT_ROOT: every mount in this namespace
    calls = {"listmount": listmount, "statmount": "libc.syscall(457, None, None, 0, 0)",
             "truncate": "libc.syscall(76, b'/x', 0)", "ftruncate": "libc.syscall(77, os.pipe()[1], 0)",
             "sysinfo": "libc.syscall(99, ctypes.create_string_buffer(256))", "sync": "libc.syscall(162)",
             "syncfs": "libc.syscall(306, os.pipe()[0])"}
    attacks = [hostile(name, reaches_the_kernel(call), prelude="import struct\n") for name, call in calls.items()]
    with SandboxExecutor(workers=1, unchecked=True) as ex:
        assert_held(ex.run(attacks, EXAMPLES, LABELS))


def test_uname_does_not_name_the_host(pool, report):
    need(report, "namespaces")
    assert_held(run_with_benign(pool, hostile("hostname", f"assert os.uname().nodename == {socket.gethostname()!r}")))


def test_without_namespaces_and_landlock_before_abi_3_truncate_is_refused(weak_host):
    """Landlock has no truncate right before ABI 3: with no namespaces, a world-writable file any process of
    nobody can reach would be truncated by path, and the report must not say "no file access" as if it were all."""
    weak_host(namespaces=False, landlock_abi=2)
    folder = Path(tempfile.mkdtemp(prefix="containment-decoy-"))  # not under tmp_path, whose parents are 0700
    decoy = folder / "workspace.duckdb"
    try:
        folder.chmod(0o755)
        decoy.write_bytes(b"DUCK" * 1000)
        decoy.chmod(0o666)  # only the sandbox's own walls may stop the truncate
        with SandboxExecutor(workers=1, time_budget_s=2.0, per_example_s=0.0, unchecked=True) as ex:
            report = ex.containment()
            assert report["namespaces"].startswith("off: simulated")
            if not (report["landlock"].startswith("on: ABI 2") and report["seccomp"].startswith("on")):
                pytest.skip(f"needs Landlock (ABI 2 or more) and seccomp: {report['landlock']}; {report['seccomp']}")
            assert "but truncate" in report["landlock"]
            assert_held(run_with_benign(ex, hostile("truncate", f"os.truncate({str(decoy)!r}, 0)")))
        assert decoy.read_bytes() == b"DUCK" * 1000
    finally:
        shutil.rmtree(folder)


def forge_reply(name: str, frame: bytes) -> Annotator:
    """An annotator whose child writes `frame` on its own reply pipe (its one FIFO past stderr) and exits."""
    return hostile(name, f"""
        for fd in range(3, 1 << 10):
            try:
                if (os.fstat(fd).st_mode & 0o170000) == 0o010000:  # S_IFIFO
                    break
            except OSError:
                pass
        os.write(fd, len({frame!r}).to_bytes(4, 'big') + {frame!r})
        os._exit(0)
    """)


def test_a_forged_frame_of_nested_brackets_or_forged_seconds_faults_only_its_run():
    """A 4 KB frame of nested brackets made json.loads raise RecursionError past the holder's FrameError
    handling (the worker answered an error and was killed); forged seconds went into the results unchecked."""
    reply = b'{"ok":true,"votes":"AQEBAQ==","faults":0,"first_error":null,"stopped":false,"seconds":%s}'
    with SandboxExecutor(workers=1, time_budget_s=1.0, per_example_s=0.0, unchecked=True) as ex:
        ex.containment()
        worker = ex._workers[0].proc.pid
        began = time.perf_counter()
        nested, huge, negative, benign = ex.run([forge_reply("nested", b"[" * 2070 + b"]" * 2070),
                                                 forge_reply("huge", reply % b"1e308"),
                                                 forge_reply("negative", reply % b"-1e308"), BENIGN], EXAMPLES, LABELS)
        elapsed = time.perf_counter() - began
        assert ex._workers[0].proc.pid == worker, "the worker was replaced"
    assert nested.faults == len(EXAMPLES) and "not JSON" in nested.first_error, nested.first_error
    assert benign.votes.tolist() == BENIGN_VOTES
    # no more than the parent saw the run take, whatever the child says
    assert 0.0 < huge.seconds <= elapsed and negative.seconds == 0.0, (huge.seconds, negative.seconds, elapsed)


def heap_snoop(head: str, tail: str) -> Annotator:
    """Votes "breach" when `head` + `tail` is anywhere in the memory of its own process (pages 512 MiB either side
    of a heap object, each probed with write() to a pipe: EFAULT, not a crash, where nothing is mapped). It never
    holds the two together itself, so a find is memory it inherited."""
    return Annotator(id="snoop", name="snoop", agent="human", generation=0, source=textwrap.dedent(f"""
        import ctypes, os
        HEAD, TAIL = {head.encode()!r}, {tail.encode()!r}
        def annotate(example):
            libc = ctypes.CDLL(None)
            r, w = os.pipe()
            base = id(example) & ~0xFFF
            for page in range(-(1 << 17), 1 << 17):
                addr = base + page * 4096
                if addr <= 0 or libc.write(w, ctypes.c_void_p(addr), 4096) != 4096:
                    continue
                os.read(r, 4096)
                more = libc.write(w, ctypes.c_void_p(addr + 4096), 64) == 64 and len(os.read(r, 64)) == 64
                data = ctypes.string_at(addr, 4096 + 64 if more else 4096)
                at = data.find(HEAD)
                while at >= 0:
                    if data[at + len(HEAD):at + len(HEAD) + len(TAIL)] == TAIL:
                        return 'breach'
                    at = data.find(HEAD, at + 1)
            return 'held'
    """))


def test_a_run_cannot_read_earlier_annotators_sources_or_rows_in_inherited_memory():
    """The zygote used to compile (and cache) every source and parse every chunk: a later run's child, forked
    from it, could read them in its copy of the zygote's heap, freed or not. Now a run's child reads its own
    source, and each chunk goes to a fresh holder forked from an init that never read a request."""
    token = uuid.uuid4().hex[:12]
    secret = Annotator(id="secret", name="secret", agent="human", generation=0, source=(
        f"def annotate(example):\n    return 'spam' if 'secret-cue-of-another-user-{token}' in example['text'] "
        "else None\n"))
    holdout = [{"text": f"HOLDOUT-ROW-{token} patient {i}"} for i in range(200)]
    with SandboxExecutor(workers=1, time_budget_s=20.0, per_example_s=0.0, unchecked=True) as ex:
        ex.run([BENIGN], holdout, LABELS)  # an earlier call's rows (say another user's, on the studio's pool)
        source_snoop = heap_snoop("secret-cue-of-another-user-", token)
        _, sources = ex.run([secret, source_snoop], EXAMPLES[:1], LABELS)  # same call, same chunk
        (rows,) = ex.run([heap_snoop("HOLDOUT-ROW-", token)], EXAMPLES[:1], LABELS)
    assert (sources.votes.tolist(), sources.first_error) == ([HELD], None)
    assert (rows.votes.tolist(), rows.first_error) == ([HELD], None)


def test_rlimits_partly_refused_are_reported_off_not_on():
    script = ("import resource\nfrom engine.sandbox import confine\n"
              "def refuse(res, value):\n    raise ValueError('refused')\n"
              "resource.setrlimit = refuse\nprint(confine.apply_rlimits(512))\n")  # nothing applied: no harm
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("off: refused address space, file size, core, descriptors"), out.stdout + out.stderr


def test_a_run_that_closes_its_result_pipe_is_not_blamed_on_memory(pool):
    """The fault says what happened: a run that shut its own result pipe and lingered did not hit the memory cap
    (only a run that died as the pipe closed is read that way)."""
    closer = hostile("closer", "os.close(4)\ntime.sleep(30)")
    result = pool.run([closer], EXAMPLES, LABELS)[0]
    assert result.faults == len(EXAMPLES)
    assert "closed its result pipe without answering" in result.first_error and "memory" not in result.first_error
