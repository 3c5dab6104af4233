"""Which agents write the annotators: the one list of choices and the one factory the CLI, jobs and studio use.

`offline` mines the dev split for cues (no network); `llm` asks an OpenAI-compatible endpoint; `mixed` runs
both side by side. The LLM modules are imported only when an LLM is chosen, so offline runs never load openai.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine.agents.base import Proposer
from engine.events import EventSink, quiet

if TYPE_CHECKING:
    from engine.llm.config import LLMConfig
    from engine.llm.costs import Budget, PriceTable
    from engine.store.workspace import Store

# name -> how a person sees it (the studio's radio); the keys are the CLI's --agents choices.
AGENTS: dict[str, str] = {"offline": "Offline (no LLM)", "llm": "LLM", "mixed": "Mixed"}
AGENT_CHOICES: tuple[str, ...] = tuple(AGENTS)
DEFAULT_AGENTS = "offline"


def make_proposer(agents: str, store: Store | None = None, *, llm_overrides: Mapping[str, Any] | None = None,
                  secrets: Mapping[str, Any] | None = None, budget: Budget | None = None,
                  prices: PriceTable | None = None, on_event: EventSink | None = None) -> Proposer:
    """The proposer for `agents`. The LLM agents read their endpoint from `llm_overrides` (blank values are
    unset), then the environment, then `secrets`, then the preset any of them names; their calls are logged
    in `store` and capped by `budget` (default: the workspace's stored limits, when there is a store)."""
    if agents not in AGENTS:
        raise ValueError(f"agents must be one of {', '.join(AGENT_CHOICES)}, not {agents!r}")
    from engine.agents.offline.proposer import OfflineProposer

    if agents == "offline":
        return OfflineProposer()
    from engine.agents.llm.proposer import LLMProposer
    from engine.llm.client import OpenAICompatibleClient
    from engine.llm.costs import PriceTable

    config = llm_config(llm_overrides, secrets)
    if budget is None and store is not None:
        from engine.llm.costs import Budget

        budget = Budget.for_workspace(store, save=False)
    client = OpenAICompatibleClient(config, store=store, prices=prices or PriceTable.default(), budget=budget)
    llm = LLMProposer(client, on_event=on_event, mode=config.mode)
    if agents == "llm":
        return llm
    from engine.agents.mixed import MixedProposer

    return MixedProposer(llm, OfflineProposer(), on_event=on_event or quiet)


def llm_config(llm_overrides: Mapping[str, Any] | None, secrets: Mapping[str, Any] | None) -> LLMConfig:
    """The LLM agents' settings as a run resolves them: the caller's non-blank overrides, then the environment, then
    `secrets` (the studio checks them before Run with this, so the check and the run agree)."""
    from engine.llm.config import LLMConfig

    return LLMConfig.from_env({k: v for k, v in (llm_overrides or {}).items() if v}, secrets=secrets)
