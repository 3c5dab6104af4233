"""What labeling N examples costs by prompting an LLM per example, against evolving a pool once and applying it.

Token counts come from the repo's own prompts rendered on real data: the ChemProt workspace bench/throughput.py
evolves (bench/results/tmp/throughput-chemprot; imported and evolved here if missing), its generator, improver
and refiner messages built exactly as the LLM agents build them (engine/agents/llm/prompts.py) from that workspace's
context, counted the way engine/llm/client.py counts a request when the server reports no usage
(`estimate_tokens`: characters / 4 of the request's messages). The per-example prompt is the agents' system
message for the task (task, labels) plus the row as JSON (full text and entity fields), asking for one label name;
its answer is the longest label name's tokens + 1.

Model (every assumption is a flag):
  per-example LLM  cost = N x (in x price_in + out x price_out);  time = N / rps
  pool             cost = generations x calls_per_generation x (prompt_in x price_in + out_per_call x price_out)
                   time = generations x ceil(calls_per_generation / parallel) x call_latency_s
                          + N x annotators / votes_per_s  (applying the pool: bench/results/throughput.json's
                            fastest measured applier at the largest row count, unless --votes-per-s)
Prices default to the repo's table (engine/llm/costs.py) for --model. The pool's gate, sandbox runs on dev and
aggregator fit are left out of its time (tens of seconds offline: bench/results/e2e_100k.md).

    python bench/llm_cost.py [--examples 100000] [--model gpt-4o-mini] [--rps 10] [--call-latency-s 20] ...
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.agents.llm import prompts  # noqa: E402
from engine.agents.llm.proposer import LLMProposer  # noqa: E402
from engine.evolve import EvolveConfig, build_context  # noqa: E402
from engine.llm.client import estimate_tokens  # noqa: E402
from engine.llm.config import DEFAULT_MODEL  # noqa: E402
from engine.llm.costs import PriceTable  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORKDIR = RESULTS / "tmp" / "throughput-chemprot"
PAPER = (4_500, 31_000)


def request_tokens(messages: list[dict]) -> int:
    """Tokens of a request as engine/llm/client.py estimates them without server usage: chars / 4."""
    return estimate_tokens(json.dumps(messages, ensure_ascii=False))


def label_prompt(task, example) -> list[dict]:
    """Prompting an LLM to label one row: the agents' task description and the row, one label name back."""
    row = {"text": example.text, **{k: str(example.fields.get(k, "")) for k in task.fields}}
    return [{"role": "system", "content": "You label examples for this task.\n\n" + prompts.describe_task(task)
             + "\n\nAnswer with exactly one of the label names, nothing else."},
            {"role": "user", "content": json.dumps(row, ensure_ascii=False)}]


def workspace() -> Store:
    """The evolved ChemProt workspace (bench/throughput.py's ensure_rows may have left it imported only)."""
    if (WORKDIR / "workspace.duckdb").exists():
        store = Store.open(WORKDIR)
        if store.last_complete_generation() > 0:
            return store
        Store.close_all()
    from bench.throughput import evolve_pool

    evolve_pool()
    return Store.open(WORKDIR)


def measured_tokens(store: Store, samples: int = 200, seed: int = 0) -> dict:
    """Mean request tokens per evolution call (by role) and per labeling call, on the real workspace."""
    task = store.load_task()
    generation = store.last_complete_generation() + 1
    context = build_context(store, generation, EvolveConfig(seed=seed))
    rng = np.random.default_rng(seed)
    per_call = LLMProposer.__init__.__kwdefaults__["per_call"]
    roles = {"generator": [request_tokens(prompts.generator_messages(context, rng, per_call)) for _ in range(5)],
             "improver": [request_tokens(prompts.improver_messages(context, rng, per_call)) for _ in range(5)]}
    targets = list(context.annotators)[:5]
    roles["refiner"] = [request_tokens(prompts.refiner_messages(context, a, rng, per_call)) for a in targets]
    rows = store.examples("pool")
    picked = rng.choice(len(rows), size=min(samples, len(rows)), replace=False)
    label_in = [request_tokens(label_prompt(task, rows[i])) for i in picked]
    label_out = max(estimate_tokens(json.dumps(label)) for label in task.labels) + 1
    return {"role_in": {r: round(float(np.mean(v))) for r, v in roles.items() if v},
            "label_in": round(float(np.mean(label_in))), "label_out": label_out, "per_call": per_call,
            "annotators": len(store.pool_ids())}


def fastest_votes_per_s(path: Path = RESULTS / "throughput.json") -> tuple[float, str] | None:
    """The fastest applier's votes/s at the largest row count of a bench/throughput.py result file."""
    if not path.exists():
        return None
    records = [r for r in json.loads(path.read_text())["records"] if "votes_per_s" in r]
    if not records:
        return None
    top = max(r["rows"] for r in records)
    best = max((r for r in records if r["rows"] == top), key=lambda r: r["votes_per_s"])
    return float(best["votes_per_s"]), f"{best['applier']} at {top:,} rows ({path})"


def model(args: argparse.Namespace, tokens: dict) -> dict:
    price_in, price_out = PriceTable.default().prices.get(args.model, (0.0, 0.0))
    price_in = args.price_in if args.price_in is not None else price_in
    price_out = args.price_out if args.price_out is not None else price_out
    n = args.examples
    llm_cost = n * (tokens["label_in"] * price_in + tokens["label_out"] * price_out) / 1e6
    llm_time = n / args.rps
    prompt_in = float(np.mean(list(tokens["role_in"].values())))
    calls = args.generations * args.calls_per_generation
    pool_cost = calls * (prompt_in * price_in + args.out_tokens_per_call * price_out) / 1e6
    if args.votes_per_s:
        vps, vps_from = args.votes_per_s, "--votes-per-s"
    else:
        vps, vps_from = fastest_votes_per_s(args.throughput) or (1e5, f"default 100,000 (no {args.throughput})")
    annotators = args.annotators or tokens["annotators"]
    apply_s = n * annotators / vps
    evolve_s = args.generations * math.ceil(args.calls_per_generation / args.parallel) * args.call_latency_s
    return {"examples": n, "model": args.model, "price_in_per_1m": price_in, "price_out_per_1m": price_out,
            "label_tokens_in": tokens["label_in"], "label_tokens_out": tokens["label_out"],
            "evolve_tokens_in_by_role": tokens["role_in"], "evolve_tokens_out_per_call": args.out_tokens_per_call,
            "evolve_calls": calls, "rps": args.rps, "call_latency_s": args.call_latency_s, "parallel": args.parallel,
            "annotators": annotators, "votes_per_s": vps, "votes_per_s_from": vps_from,
            "llm_usd": round(llm_cost, 4), "llm_s": round(llm_time, 1),
            "pool_usd": round(pool_cost, 4), "pool_evolve_s": round(evolve_s, 1), "pool_apply_s": round(apply_s, 2),
            "pool_s": round(evolve_s + apply_s, 1),
            "cost_ratio": round(llm_cost / pool_cost, 1) if pool_cost else None,
            "time_ratio": round(llm_time / (evolve_s + apply_s), 1),
            "apply_only_time_ratio": round(llm_time / apply_s, 1),
            "apply_only_cost_ratio": "unbounded (applying costs no tokens)"}


def markdown(r: dict) -> str:
    return (
        "# LLM per example vs an evolved pool: `bench/llm_cost.py` (issue 15)\n\n"
        f"Computed {r.get('when', '?')} at commit {r.get('commit', '?')} on {r.get('machine', '?')}: "
        f"`{r.get('command', 'python bench/llm_cost.py')}`.\n\n"
        f"Labeling {r['examples']:,} ChemProt examples with {r['model']} at ${r['price_in_per_1m']}/"
        f"${r['price_out_per_1m']} per 1M input/output tokens (engine/llm/costs.py). Tokens: the repo's prompts "
        "rendered on the evolved ChemProt workspace, chars/4 as engine/llm/client.py estimates them.\n\n"
        "| | LLM per example | evolve a pool once + apply |\n|---|---|---|\n"
        f"| calls | {r['examples']:,} ({r['label_tokens_in']} in + {r['label_tokens_out']} out tokens each) | "
        f"{r['evolve_calls']} (in: {r['evolve_tokens_in_by_role']} by role; {r['evolve_tokens_out_per_call']} "
        f"out each) |\n"
        f"| cost | ${r['llm_usd']:,.2f} | ${r['pool_usd']:,.4f} |\n"
        f"| time | {r['llm_s']:,.0f} s at {r['rps']} requests/s | {r['pool_evolve_s']:,.0f} s of calls "
        f"({r['call_latency_s']} s each, {r['parallel']} at a time) + {r['pool_apply_s']} s applying "
        f"{r['annotators']} annotators at {r['votes_per_s']:,.0f} votes/s ({r['votes_per_s_from']}) |\n\n"
        f"**Ratio (LLM / pool): cost {r['cost_ratio']:,}×, time {r['time_ratio']:,}×** (applying alone: "
        f"{r['apply_only_time_ratio']:,}× faster; it costs no tokens). The paper reports 4,500–31,000×.\n\n"
        "The pool's cost is fixed: it does not grow with the number of examples, so the cost ratio grows "
        "linearly with N; the time ratio approaches the apply-only figure as N grows.\n\n"
        "Assumptions (each a flag of the script):\n"
        f"- prices: {r['model']} at ${r['price_in_per_1m']} / ${r['price_out_per_1m']} per 1M input / output "
        "tokens, the repo's table (`--price-in`, `--price-out`);\n"
        f"- tokens: characters / 4 of the request's messages, as engine/llm/client.py counts a request whose "
        "server reports no usage; the labeling prompt is the agents' task description plus the row as JSON, "
        "its answer the longest label name + 1;\n"
        f"- rate: {r['rps']} labeling requests/s for the LLM per example (`--rps`); evolution calls "
        f"{r['call_latency_s']} s each, {r['parallel']} at a time (`--call-latency-s`, `--parallel`);\n"
        f"- evolution: {r['evolve_calls']} calls (5 generations x generator, improver, refiner x 3), each "
        f"replying {r['evolve_tokens_out_per_call']} tokens, the reply cap (an upper bound);\n"
        "- left out of the pool's time: the gate, dev votes and the aggregator fit (tens of seconds, "
        "bench/results/e2e_100k.md); left out of the LLM's: retries, rate-limit waits, a dev set to check it.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--price-in", type=float, help="USD per 1M input tokens (default: the repo's table)")
    parser.add_argument("--price-out", type=float, help="USD per 1M output tokens (default: the repo's table)")
    parser.add_argument("--rps", type=float, default=10.0, help="labeling requests per second the API allows")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--calls-per-generation", type=int, default=9,
                        help="generator + improver + refiner, 3 calls each (LLMProposer's n_per_role)")
    parser.add_argument("--out-tokens-per-call", type=int, default=1500,
                        help="evolution reply tokens (LLMConfig.max_tokens, the cap: an upper bound)")
    parser.add_argument("--call-latency-s", type=float, default=20.0, help="seconds per evolution call")
    parser.add_argument("--parallel", type=int, default=1, help="evolution calls at a time")
    parser.add_argument("--votes-per-s", type=float, help="pool apply speed (default: bench/results/throughput.json)")
    parser.add_argument("--annotators", type=int, help="pool size (default: the evolved workspace's)")
    parser.add_argument("--throughput", type=Path, default=RESULTS / "throughput.json",
                        help="a bench/throughput.py result: its fastest applier at its largest row count")
    parser.add_argument("--out", type=Path, default=RESULTS / "llm_cost")
    args = parser.parse_args()
    store = workspace()
    tokens = measured_tokens(store)
    Store.close_all()
    result = model(args, tokens)
    from datetime import UTC, datetime

    from bench.common import commit, machine
    result.update(when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), commit=commit(), machine=machine(),
                  command="python bench/llm_cost.py " + " ".join(sys.argv[1:]))
    print(json.dumps(result))
    if str(args.out) != "-":
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
