"""LLM settings: `LLMConfig` from overrides, the environment, secrets and a server preset; the key never shown."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from engine.llm.seam import LLMAuthError

DEFAULT_MODEL = "gpt-4o-mini"
LOCAL_KEY = "not-needed"  # local servers (vLLM, Ollama, llama.cpp) accept any key
# Environment variable (also accepted as a top-level secrets.toml key) -> LLMConfig field.
ENV_VARS = {"OPENAI_API_KEY": "api_key", "OPENAI_BASE_URL": "base_url", "EVOPOOL_MODEL": "model",
            "EVOPOOL_TEMPERATURE": "temperature", "EVOPOOL_MAX_TOKENS": "max_tokens",
            "EVOPOOL_LLM_TIMEOUT": "timeout_s", "EVOPOOL_LLM_PARALLEL": "max_parallel",
            "EVOPOOL_LLM_MODE": "mode", "EVOPOOL_LLM_PRESET": "preset", "EVOPOOL_LLM_RETRIES": "max_retries"}


@dataclass(frozen=True)
class LLMConfig:
    base_url: str | None = None  # None = OpenAI's own endpoint
    api_key: str | None = field(default=None, repr=False)
    model: str = DEFAULT_MODEL
    temperature: float = 0.7
    max_tokens: int = 1500
    timeout_s: float = 60.0
    max_retries: int = 4  # the openai client's: attempts = 1 + max_retries
    max_parallel: int = 4
    mode: str = "auto"  # what the agents ask for: "code", "spec" (a JSON spec rendered by the engine), "auto"
    preset: str = ""  # the server kind whose settings filled the unset fields (engine/llm/presets.py)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.public().items())
        return f"LLMConfig({shown})"

    __str__ = __repr__

    def public(self) -> dict[str, Any]:
        """The settings safe to show or store: the key is reduced to whether one is set."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["api_key"] = "***" if self.api_key else None
        return out

    def resolved_api_key(self) -> str:
        if self.api_key:
            return self.api_key
        if self.base_url:
            return LOCAL_KEY
        raise LLMAuthError("no API key: set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server such as "
                           "vLLM, Ollama or llama.cpp, which need no key)")

    @classmethod
    def from_env(cls, overrides: Mapping[str, Any] | None = None, secrets: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> LLMConfig:
        """Settings by precedence: `overrides` > environment > `secrets` (e.g. st.secrets) > the preset named
        by any of those (`presets.py`) > defaults.

        `secrets` may hold the environment-variable names at top level and/or an `[llm]` table keyed
        by field name; blank values count as unset.
        """
        from engine.llm.presets import preset

        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if secrets:
            values.update(_pick(secrets, ENV_VARS))
            table = secrets.get("llm") if hasattr(secrets, "get") else None
            if table is not None and hasattr(table, "keys"):
                values.update(_pick(table, {f.name: f.name for f in fields(cls)}))
        values.update(_pick(env, ENV_VARS))
        values.update({k: v for k, v in (overrides or {}).items() if v is not None and v != ""})
        if not values.get("preset") and _is_local(values.get("base_url")) and not (
                {"max_parallel", "timeout_s"} & set(values)):
            values["preset"] = "local"  # a server on this machine most likely answers one request at a time
        values = {**preset(values.get("preset")), **values}
        known = {f.name: f for f in fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown LLM settings: {sorted(unknown)}")
        return cls(**{k: _coerce(v, known[k].default) for k, v in values.items()})


def _is_local(base_url: Any) -> bool:
    """Whether an endpoint runs on this machine (loopback), where one-at-a-time servers are the rule."""
    host = urlsplit(str(base_url or "")).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _pick(source: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    return {target: source[name] for name, target in names.items()
            if name in source and source[name] is not None and str(source[name]).strip() != ""}


def _coerce(value: Any, default: Any) -> Any:
    """Environment and secrets values are strings: convert to the type of the field's default."""
    try:
        if isinstance(default, bool) or default is None or isinstance(value, type(default)):
            return value.strip() if isinstance(value, str) else value
        return type(default)(value)
    except (TypeError, ValueError):
        raise ValueError(f"LLM setting {value!r} should be a {type(default).__name__}") from None
