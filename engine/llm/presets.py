"""Settings that suit each kind of OpenAI-compatible server, picked with `--llm-preset` (or `preset` in the
studio's secrets). A preset fills only what the flags, the environment and the secrets leave unset.

Local servers (llama.cpp, Ollama by default) answer one request at a time and slowly: several parallel
requests with a short timeout time out in their queue, so their presets send one at a time, wait longer,
and let the small models they often serve fill JSON specs when free code keeps failing (mode "auto").
"""
from __future__ import annotations

from typing import Any

# A preset fills only what is unset; "local" is picked by itself for a loopback endpoint (see LLMConfig.from_env).
PRESETS: dict[str, dict[str, Any]] = {
    "openai": {"timeout_s": 60.0, "max_parallel": 4, "mode": "auto"},
    "vllm": {"base_url": "http://localhost:8000/v1", "timeout_s": 120.0, "max_parallel": 8, "mode": "auto"},
    "ollama": {"base_url": "http://localhost:11434/v1", "timeout_s": 300.0, "max_parallel": 1, "mode": "auto"},
    # chosen by itself for an endpoint on this machine when neither parallel calls nor a timeout are set
    "local": {"timeout_s": 300.0, "max_parallel": 1, "mode": "auto"},
    "llamacpp": {"base_url": "http://localhost:8080/v1", "timeout_s": 300.0, "max_parallel": 1, "mode": "auto",
                 "max_tokens": 600},
}


def preset(name: str | None) -> dict[str, Any]:
    """The LLMConfig fields of a preset ({} for None); raises ValueError naming the choices."""
    if not name:
        return {}
    if name not in PRESETS:
        raise ValueError(f"unknown LLM preset {name!r}; expected one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
