"""The ray engine on a real local cluster (a head node and a worker node, `ray start` processes on this machine):
the same labeler gives the same labels, row by row, as the local engine; a killed writer actor is replaced.

Skipped where Ray is not installed (`pip install -e '.[ray]'`; `make test` installs it).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from engine.cli import main
from engine.corpus.engines import label_corpus
from engine.corpus.labeler import fit_labeler
from engine.corpus.reading import find_files, survey
from engine.corpus.shards import read_output
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
RAY_CLI = str(Path(sys.executable).parent / "ray")
PROCESS_GROUPS: set[int] = set()  # the test cluster's process groups: the only processes these tests kill


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], env: dict) -> subprocess.Popen:
    """One `ray start --block` node in its own process group (so teardown ends exactly its processes)."""
    proc = subprocess.Popen([RAY_CLI, "start", "--block", "--disable-usage-stats", "--num-cpus=1",
                             "--node-ip-address=127.0.0.1", "--object-store-memory=100000000", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = []
    for line in proc.stdout:  # "Ray runtime started." comes once the node has joined
        seen.append(line)
        if "Ray runtime started" in line:
            return proc
    raise RuntimeError("ray start failed:\n" + "".join(seen[-20:]))


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            time.sleep(0.5)
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster():
    """127.0.0.1:<port>, a head node and one worker node, 1 CPU each; workers import this checkout's engine."""
    temp = tempfile.mkdtemp(prefix="evr", dir="/tmp")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled"}  # a token left in ~/.ray by someone else must not lock the nodes out
    port = _free_port()
    PROCESS_GROUPS.clear()
    head = _start(["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}"], env)
    nodes = [head]
    try:
        nodes.append(_start([f"--address=127.0.0.1:{port}"], env))
        PROCESS_GROUPS.update(node.pid for node in nodes)  # start_new_session: each node leads its group
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(nodes):
            _stop(node)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ray") / "ws"
    assert main(["run", str(ROOT / "data/demo/youtube_spam.csv"), "--workdir", str(ws), "--generations", "2"]) == 0
    with SandboxExecutor() as executor:
        labeler = fit_labeler(Store.open(ws), executor, "auto")
    Store.close_all()
    return ws, labeler


def test_ray_and_local_engines_give_the_same_labels_row_by_row(cluster, fitted, tmp_path):
    """auto (embeddings, TF-IDF and votes) on 300 demo rows: each batch labeled on a cluster node equals the same
    batch labeled in this process, every column of every row."""
    _, labeler = fitted
    rows = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str).head(300)
    corpus = tmp_path / "c.parquet"
    rows.drop(columns=["label", "split"]).to_parquet(corpus, index=False)
    files = survey(find_files(corpus))
    local = label_corpus(labeler, files, tmp_path / "local", batch_size=75)
    on_ray = label_corpus(labeler, files, tmp_path / "ray", engine="ray", ray_address=cluster, batch_size=75)
    assert on_ray["engine"] == "ray" and on_ray["ray_nodes"] == 2 and on_ray["workers"] == 2
    assert local["rows"] == on_ray["rows"] == 300 and on_ray["shards"] == 4
    a, b = read_output(tmp_path / "local"), read_output(tmp_path / "ray")
    assert list(a["id"]) == list(rows["id"])
    pd.testing.assert_frame_equal(a, b)
    assert a["aggregator"].iloc[0].startswith("auto:") and (a["label"] != "").all()


def _writer_actor_pids(process_groups: set[int]) -> list[int]:
    """ShardWriter actors (Ray names them `ray::ShardWriter...`) whose parent is a raylet of this test's cluster
    (an actor leads its own process group, its raylet stays in its node's)."""
    listing = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in listing.splitlines() if len(line.split(None, 3)) == 4]
    ours = {int(pid) for pid, _, pgid, _ in rows if int(pgid) in process_groups}
    return [int(pid) for pid, ppid, _, args in rows if int(ppid) in ours and args.startswith("ray::ShardWriter")]


@pytest.mark.slow
def test_a_killed_writer_actor_is_replaced_and_its_batch_redone(cluster, fitted, tmp_path):
    """SIGKILL one writer actor's process mid-run: Ray restarts it, the batch is retried, the output is whole."""
    _, labeler = fitted
    text = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str)[["text"]]
    corpus = tmp_path / "c.jsonl"
    text.head(800).to_json(corpus, orient="records", lines=True)
    files = survey([corpus])
    killed: list[int] = []

    def kill_one_writer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            pids = _writer_actor_pids(PROCESS_GROUPS)
            if pids and list((tmp_path / "ray").glob("part-*.parquet")):
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_writer, daemon=True)
    killer.start()
    result = label_corpus(labeler, files, tmp_path / "ray", engine="ray", ray_address=cluster, batch_size=50)
    killer.join()
    assert killed, "no writer actor was running when a shard appeared"
    local = label_corpus(labeler, files, tmp_path / "local", batch_size=50)
    assert result["rows"] == local["rows"] == 800 and result["shards"] == 16
    pd.testing.assert_frame_equal(read_output(tmp_path / "ray"), read_output(tmp_path / "local"))


def test_a_relative_output_and_a_bad_row_behave_as_on_the_local_engine(cluster, fitted, tmp_path, monkeypatch):
    """The nodes run in other folders: a relative --output went to theirs (or failed there) while the run record
    stayed here. A row with no id, found by a worker, came back as Ray's wrapped traceback, not the error itself."""
    from engine.corpus.reading import CorpusError

    _, labeler = fitted
    rows = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str).head(120)[["id", "text"]]
    (tmp_path / "c.csv").write_text(rows.to_csv(index=False))
    monkeypatch.chdir(tmp_path)
    result = label_corpus(labeler, survey([Path("c.csv")]), "out", engine="ray", ray_address=cluster, batch_size=40)
    assert result["rows"] == 120 and len(read_output(tmp_path / "out")) == 120
    rows.loc[100, "id"] = None
    rows.to_json(tmp_path / "bad.jsonl", orient="records", lines=True)
    with pytest.raises(CorpusError, match="data row 100 has no 'id' value"):  # 0-based, as the corpus ids
        label_corpus(labeler, survey([Path("bad.jsonl")]), "bad", engine="ray", ray_address=cluster, batch_size=40)


def test_an_unreachable_cluster_is_an_error_at_once():
    """ray.init retried an address nothing listens on for minutes, saying nothing."""
    from engine.corpus.engines import EngineUnavailable, _check_reachable

    start = time.monotonic()
    with pytest.raises(EngineUnavailable, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        _check_reachable(f"127.0.0.1:{1}")
    assert time.monotonic() - start < 10
    _check_reachable("auto")  # not an address to try: Ray finds it
