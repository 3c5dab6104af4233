"""The OpenAI-compatible client: the real `openai` package over HTTP against a scripted local server."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from fake_openai_server import FakeOpenAIServer

from engine.llm.client import OpenAICompatibleClient, request_hash
from engine.llm.config import LOCAL_KEY, LLMConfig
from engine.llm.costs import Budget, BudgetExhausted, PriceTable
from engine.llm.seam import LLMAuthError, LLMCallFailed
from engine.store.workspace import Store

KEY = "sk-test-SECRET-0123456789abcdef"
MESSAGES = [{"role": "system", "content": "You write annotators."}, {"role": "user", "content": "Write one."}]


def make_client(server: FakeOpenAIServer, store: Store | None = None, budget: Budget | None = None,
                **overrides) -> OpenAICompatibleClient:
    settings = {"base_url": server.base_url, "api_key": KEY, "timeout_s": 2.0, "max_retries": 2, **overrides}
    return OpenAICompatibleClient(LLMConfig(**settings), store=store, budget=budget)


# ---- configuration -----------------------------------------------------------------------------
def test_config_precedence_overrides_env_secrets_defaults():
    secrets = {"OPENAI_API_KEY": "sk-from-secrets", "EVOPOOL_MODEL": "from-secrets",
               "llm": {"temperature": "0.1", "max_tokens": 111}}
    env = {"EVOPOOL_MODEL": "from-env", "EVOPOOL_MAX_TOKENS": "222", "EVOPOOL_LLM_TIMEOUT": "9.5",
           "OPENAI_BASE_URL": "", "EVOPOOL_LLM_PARALLEL": "2"}
    config = LLMConfig.from_env({"max_tokens": 333}, secrets=secrets, env=env)
    assert config.model == "from-env"  # env beats secrets
    assert config.max_tokens == 333  # overrides beat env
    assert config.temperature == pytest.approx(0.1)  # secrets table, converted from text
    assert config.timeout_s == pytest.approx(9.5)
    assert config.api_key == "sk-from-secrets"
    assert config.base_url is None  # a blank variable counts as unset
    assert config.max_parallel == 2 and config.max_retries == 4


def test_config_rejects_unknown_settings_and_bad_numbers():
    with pytest.raises(ValueError, match="unknown LLM settings"):
        LLMConfig.from_env({"modle": "x"}, env={})
    with pytest.raises(ValueError, match="should be a float"):
        LLMConfig.from_env(env={"EVOPOOL_TEMPERATURE": "warm"})


def test_local_server_needs_no_key_but_openai_does():
    assert LLMConfig(base_url="http://localhost:8000/v1").resolved_api_key() == LOCAL_KEY
    with pytest.raises(LLMAuthError, match="OPENAI_API_KEY"):
        LLMConfig().resolved_api_key()


def test_repr_masks_the_key():
    config = LLMConfig(api_key=KEY, model="m")
    for shown in (repr(config), str(config), str(config.public())):
        assert KEY not in shown
        assert "***" in shown


# ---- prices, budget, helpers -------------------------------------------------------------------
def test_price_table_defaults_prefixes_and_files(tmp_path: Path):
    prices = PriceTable.default()
    assert prices == PriceTable()
    assert prices.cost("gpt-4o-mini", 1_000_000, 0) == pytest.approx(0.15)
    # a dated snapshot takes its longest known prefix (gpt-4o-mini, not gpt-4o)
    assert prices.cost("gpt-4o-mini-2024-07-18", 0, 1_000_000) == pytest.approx(0.60)
    assert prices.cost("llama3.1:8b", 10_000, 10_000) == 0.0
    # a router's provider prefix (OpenRouter, LiteLLM): priced as the model, not as an unknown one at $0, which
    # --max-usd never stopped
    assert prices.cost("openai/gpt-4o-mini", 1_000_000, 0) == pytest.approx(0.15)
    assert prices.price("llama3.1:8b") is None and prices.price("meta/llama3.1:8b") is None
    (tmp_path / "p.json").write_text('{"my-model": [1.0, 3.0], "gpt-4o-mini": {"input": 0, "output": 0}}')
    from_json = PriceTable.from_file(tmp_path / "p.json")
    assert from_json.cost("my-model", 2_000_000, 1_000_000) == pytest.approx(5.0)
    assert from_json.cost("gpt-4o-mini", 1_000_000, 1_000_000) == 0.0
    assert from_json.cost("gpt-4o", 1_000_000, 0) == pytest.approx(2.5)  # defaults kept
    (tmp_path / "p.toml").write_text('"qwen2.5" = [0.5, 0.5]\n')
    assert PriceTable.from_file(tmp_path / "p.toml").cost("qwen2.5-7b", 1_000_000, 1_000_000) == pytest.approx(1.0)
    # valid JSON of the wrong shape: a ValueError naming the file (the CLI prints it), not a TypeError
    for bad in ('[1]', '{"m": 1}', '{"m": {"in": 1}}', '{"m": [1, "x"]}'):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(ValueError, match="bad.json"):
            PriceTable.from_file(tmp_path / "bad.json")


def test_budget_counts_calls_exactly_across_threads():
    budget = Budget(max_calls=5)
    granted, refused = [], []

    def take() -> None:
        try:
            budget.reserve_call()
            granted.append(1)
        except BudgetExhausted:
            refused.append(1)

    threads = [threading.Thread(target=take) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 5 and len(refused) == 7
    assert Budget(max_tokens=10).exhausted is False
    spent = Budget(max_usd=0.01)
    spent.charge(100, 0.02)
    assert spent.exhausted and spent.spent() == {"calls": 0, "tokens": 100, "usd": 0.02}


def test_a_retry_after_beyond_two_minutes_is_not_waited_for(fake_openai, store):
    """openai's own rule: a server asking for more than two minutes gets no retry, so the call fails at once."""
    fake_openai.fail(429, headers={"Retry-After": "1000"})
    with pytest.raises(LLMCallFailed, match="failed after 1 attempt: HTTP 429"):
        make_client(fake_openai, store, max_retries=3).complete(MESSAGES, role="generator")
    assert len(fake_openai.requests) == 1 and len(store.llm_calls()) == 1


def test_request_hash_depends_on_every_part():
    base = request_hash("m", MESSAGES, 0.7, 100, 0)
    assert base == request_hash("m", [dict(m) for m in MESSAGES], 0.7, 100, 0)
    variants = {request_hash("m2", MESSAGES, 0.7, 100, 0), request_hash("m", MESSAGES[:1], 0.7, 100, 0),
                request_hash("m", MESSAGES, 0.2, 100, 0), request_hash("m", MESSAGES, 0.7, 99, 0),
                request_hash("m", MESSAGES, 0.7, 100, 1),
                request_hash("m", MESSAGES, 0.7, 100, 0, base_url="http://127.0.0.1:8080/v1")}
    assert base not in variants and len(variants) == 6
    # the same model name on another server (a swapped GGUF behind `--model local`) is another request
    here = request_hash("local", MESSAGES, 0.7, 100, 0, base_url="http://127.0.0.1:8080/v1")
    assert here == request_hash("local", MESSAGES, 0.7, 100, 0, base_url="http://127.0.0.1:8080/v1/")
    assert here != request_hash("local", MESSAGES, 0.7, 100, 0, base_url="http://127.0.0.1:11434/v1")


# ---- calls over HTTP ---------------------------------------------------------------------------
def test_success_sends_request_and_records_the_call(fake_openai, store):
    fake_openai.reply("```python\ndef annotate(example):\n    return None\n```",
                      usage={"prompt_tokens": 100, "completion_tokens": 50})
    client = make_client(fake_openai, store, model="gpt-4o-mini", temperature=0.3, max_tokens=700)
    reply = client.complete(MESSAGES, role="generator", seed=7)
    assert reply.text.startswith("```python") and not reply.cached
    assert (reply.tokens_in, reply.tokens_out) == (100, 50)
    assert reply.cost_usd == pytest.approx((100 * 0.15 + 50 * 0.60) / 1e6)
    (request,) = fake_openai.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["messages"] == MESSAGES
    assert (request.body["model"], request.body["temperature"], request.body["max_tokens"],
            request.body["seed"]) == ("gpt-4o-mini", 0.3, 700, 7)
    (row,) = store.llm_calls().to_dict("records")
    assert (row["role"], row["model"], row["tokens_in"], row["tokens_out"]) == ("generator", "gpt-4o-mini", 100, 50)
    assert pd.isna(row["error"]) and row["reply"] == reply.text
    assert row["request_hash"] == request_hash("gpt-4o-mini", MESSAGES, 0.3, 700, 7, base_url=fake_openai.base_url)


def test_missing_usage_is_estimated_from_characters(fake_openai):
    fake_openai.reply("x" * 400, usage=None)
    reply = make_client(fake_openai, model="local-model").complete(MESSAGES, role="generator")
    assert reply.tokens_out == 100
    assert reply.tokens_in > 0 and reply.cost_usd == 0.0


def test_429_waits_at_least_retry_after_then_succeeds(fake_openai, store):
    fake_openai.fail(429, headers={"Retry-After": "1"})
    fake_openai.reply("done")
    reply = make_client(fake_openai, store).complete(MESSAGES, role="generator")
    assert reply.text == "done"
    first, second = fake_openai.requests
    assert second.at - first.at >= 1.0
    errors = store.llm_calls()["error"]
    assert errors.iloc[0] == "HTTP 429: scripted HTTP 429" and pd.isna(errors.iloc[1])


def test_cancel_ends_the_wait_before_a_retry(fake_openai, store):
    """A stopped run does not sit out a server's Retry-After: the wait ends on cancel() and no retry is sent."""
    fake_openai.fail(429, headers={"Retry-After": "30"})
    fake_openai.reply("never asked for")
    client = make_client(fake_openai, store)
    failed: list[Exception] = []

    def call() -> None:
        try:
            client.complete(MESSAGES, role="generator")
        except LLMCallFailed as err:
            failed.append(err)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 20
    while not fake_openai.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the 429 read: the caller now waits out the Retry-After
    client.cancel()
    caller.join(timeout=10)  # a deadline for a hung wait, far below the 30 s asked for
    assert not caller.is_alive(), "the wait before the retry outlived cancel()"
    assert len(failed) == 1 and "cancelled" in str(failed[0])
    assert len(fake_openai.requests) == 1


def test_500_then_success_is_retried_by_openai_and_each_attempt_is_logged(fake_openai, store):
    fake_openai.fail(500, message="overloaded")
    fake_openai.fail(502)
    fake_openai.reply("ok")
    assert make_client(fake_openai, store).complete(MESSAGES, role="improver").text == "ok"
    # the openai client did the retrying: it numbers its attempts in a header
    assert [r.headers.get("x-stainless-retry-count") for r in fake_openai.requests] == ["0", "1", "2"]
    calls = store.llm_calls()
    assert list(calls["error"].fillna("")) == ["HTTP 500: overloaded", "HTTP 502: scripted HTTP 502", ""]
    assert list(calls["reply"].fillna("")) == ["", "", "ok"] and calls["request_hash"].nunique() == 1
    assert (calls["tokens_out"] > 0).sum() == 1  # only the answered attempt is charged


def test_hang_past_timeout_is_retried(fake_openai, store):
    fake_openai.hang(5)
    fake_openai.reply("after the hang")
    reply = make_client(fake_openai, store, timeout_s=0.3).complete(MESSAGES, role="refiner")
    assert reply.text == "after the hang"
    assert len(fake_openai.requests) == 2
    assert store.llm_calls()["error"].iloc[0].startswith("timed out")


def test_hangs_beyond_retries_raise_call_failed(fake_openai):
    fake_openai.hang(5)
    fake_openai.hang(5)
    with pytest.raises(LLMCallFailed, match="failed after 2 attempts: timed out"):
        make_client(fake_openai, timeout_s=0.3, max_retries=1).complete(MESSAGES, role="generator")
    assert len(fake_openai.requests) == 2


def test_server_errors_beyond_retries_raise_call_failed(fake_openai):
    for _ in range(3):
        fake_openai.fail(503)
    with pytest.raises(LLMCallFailed, match="3 attempts: HTTP 503"):
        make_client(fake_openai, max_retries=2).complete(MESSAGES, role="generator")


def test_refused_connections_are_retried_then_fail(store):
    with FakeOpenAIServer() as gone:
        base_url = gone.base_url  # a port that was just closed: connecting is refused
    client = OpenAICompatibleClient(LLMConfig(base_url=base_url, api_key=KEY, max_retries=1), store=store)
    with pytest.raises(LLMCallFailed, match="failed after 2 attempts: connection failed"):
        client.complete(MESSAGES, role="generator")
    errors = list(store.llm_calls()["error"])
    assert len(errors) == 2 and all(e.startswith("connection failed: ") for e in errors)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_key_raises_auth_error_without_retrying(fake_openai, store, status):
    fake_openai.fail(status, message=f"Incorrect API key provided: {KEY}")
    with pytest.raises(LLMAuthError) as info:
        make_client(fake_openai, store, max_retries=4).complete(MESSAGES, role="generator")
    assert str(info.value) == f"the endpoint refused the API key ({status}) — check OPENAI_API_KEY"
    assert len(fake_openai.requests) == 1
    (error,) = store.llm_calls()["error"]
    assert error.startswith(f"HTTP {status}") and KEY not in error


def test_other_client_errors_are_not_retried(fake_openai):
    fake_openai.fail(404, message="model 'nope' not found")
    with pytest.raises(LLMCallFailed, match=r"HTTP 404\): model 'nope' not found"):
        make_client(fake_openai, model="nope").complete(MESSAGES, role="generator")
    assert len(fake_openai.requests) == 1


def test_cache_answers_a_rerun_without_any_request(fake_openai, store):
    fake_openai.reply("first answer")
    first = make_client(fake_openai, store).complete(MESSAGES, role="generator", seed=3)
    assert len(fake_openai.requests) == 1
    budget = Budget(max_calls=0)  # a cached reply spends nothing, so even an empty budget is fine
    again = make_client(fake_openai, store, budget=budget).complete(MESSAGES, role="generator", seed=3)
    assert (again.text, again.cached, again.cost_usd) == (first.text, True, 0.0)
    assert len(fake_openai.requests) == 1 and len(store.llm_calls()) == 1
    fake_openai.reply("another sample")
    other = make_client(fake_openai, store).complete(MESSAGES, role="generator", seed=4)
    assert other.text == "another sample" and len(fake_openai.requests) == 2


def test_failed_calls_are_not_cached(fake_openai, store):
    fake_openai.fail(500)
    with pytest.raises(LLMCallFailed):
        make_client(fake_openai, store, max_retries=0).complete(MESSAGES, role="generator")
    fake_openai.reply("now it works")
    assert make_client(fake_openai, store, max_retries=0).complete(MESSAGES, role="generator").text == "now it works"


def test_budget_refuses_before_sending(fake_openai):
    fake_openai.reply("one")
    fake_openai.reply("two")
    budget = Budget(max_calls=1)
    client = make_client(fake_openai, budget=budget)
    client.complete(MESSAGES, role="generator", seed=1)
    with pytest.raises(BudgetExhausted, match="1 of 1 calls"):
        client.complete(MESSAGES, role="generator", seed=2)
    assert len(fake_openai.requests) == 1 and fake_openai.pending == 1


def test_token_budget_is_charged_from_usage(fake_openai):
    fake_openai.reply("a", usage={"prompt_tokens": 60, "completion_tokens": 40})
    budget = Budget(max_tokens=100)
    client = make_client(fake_openai, budget=budget)
    client.complete(MESSAGES, role="generator")
    assert budget.spent()["tokens"] == 100
    with pytest.raises(BudgetExhausted, match="100 of 100 tokens"):
        client.complete(MESSAGES, role="generator", seed=1)


def test_parallel_calls_are_capped(fake_openai):
    for i in range(6):
        fake_openai.hang(0.2, then=f"reply {i}")
    client = make_client(fake_openai, max_parallel=2)
    replies: list[str] = []
    threads = [threading.Thread(target=lambda i=i: replies.append(
        client.complete(MESSAGES, role="generator", seed=i).text)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(replies) == [f"reply {i}" for i in range(6)]
    assert fake_openai.max_in_flight == 2


def test_api_key_never_reaches_the_store(fake_openai, store):
    fake_openai.reply("an answer that does not echo the key")
    fake_openai.fail(500, message=f"upstream said: bad key {KEY}")
    fake_openai.reply("second")
    client = make_client(fake_openai, store)
    client.complete(MESSAGES, role="generator", seed=1)
    client.complete(MESSAGES, role="improver", seed=2)
    calls = store.llm_calls()
    assert len(calls) == 3
    for column in calls.columns:
        assert not calls[column].astype(str).str.contains("SECRET").any(), column
    assert KEY not in repr(client) and KEY not in repr(client.config)


def test_models_refusing_max_tokens_or_temperature_get_a_reshaped_request(fake_openai):
    fake_openai.fail(400, message="Unsupported parameter: 'max_tokens' is not supported with this model. "
                                  "Use 'max_completion_tokens' instead.")
    fake_openai.fail(400, message="Unsupported value: 'temperature' does not support 0.7 with this model.")
    fake_openai.reply("fine")
    fake_openai.reply("fine again")
    client = make_client(fake_openai, model="gpt-5-mini", max_retries=0, max_tokens=900)
    assert client.complete(MESSAGES, role="generator").text == "fine"
    first, second, third = (r.body for r in fake_openai.requests)
    assert first["max_tokens"] == 900 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 900 and "max_tokens" not in second and second["temperature"] == 0.7
    assert "temperature" not in third and third["max_completion_tokens"] == 900
    assert client.complete(MESSAGES, role="generator", seed=1).text == "fine again"  # reshaped from the start
    assert len(fake_openai.requests) == 4 and "temperature" not in fake_openai.requests[3].body


def test_a_retry_after_a_timeout_waits_as_long_as_the_raised_timeout(fake_openai, store):
    # a slow local server: each answer takes 0.8 s; the first attempt times out at 0.5 s and doubles the timeout
    fake_openai.hang(0.8, then="slow but fine")
    fake_openai.hang(0.8, then="slow but fine")
    client = make_client(fake_openai, store, timeout_s=0.5, max_retries=1)
    reply = client.complete(MESSAGES, role="generator")  # the retry had kept 0.5 s and timed out again
    assert reply.text == "slow but fine" and client.timeout_s >= 1.0
    assert len(fake_openai.requests) == 2


def test_calls_in_flight_hold_what_they_may_spend_so_parallel_calls_cannot_pass_a_limit(fake_openai, store):
    from concurrent.futures import ThreadPoolExecutor

    budget = Budget(max_tokens=1000)
    assert budget.reserve_call(1000, 0.0) is None and budget.reserved_tokens == 1000
    with pytest.raises(BudgetExhausted, match="up to 1000 more in flight"):
        budget.reserve_call(1000, 0.0)  # nothing spent yet, but the first call may spend 1000
    budget.release(1000, 0.0)
    budget.reserve_call(1000, 0.0)  # its hold ended: room again
    # over HTTP: two calls at once under a 700-token limit: the first holds its prompt plus max_tokens (700), so
    # the second is refused though nothing is spent yet (both went, and the limit was passed)
    fake_openai.hang(0.5, then="first")
    fake_openai.reply("second")
    client = make_client(fake_openai, store, budget=Budget(max_tokens=700), max_tokens=700)
    with ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(client.complete, MESSAGES, role="generator", seed=s) for s in (0, 1)]
        outcomes = [c.exception() or c.result().text for c in calls]
    assert sum(isinstance(o, BudgetExhausted) for o in outcomes) == 1 and len(fake_openai.requests) == 1
    assert client.budget.reserved_tokens == 0  # the answered call's hold ended


def test_an_empty_reply_is_not_served_from_the_cache(fake_openai, store):
    fake_openai.reply("")  # a 200 with nothing in it (some servers, under load)
    fake_openai.reply("```python\ndef annotate(example):\n    return None\n```")
    client = make_client(fake_openai, store)
    assert client.complete(MESSAGES, role="generator").text == ""
    again = client.complete(MESSAGES, role="generator")  # the same request: asked again, not answered ""
    assert not again.cached and "def annotate" in again.text and len(fake_openai.requests) == 2
    assert client.complete(MESSAGES, role="generator").cached  # a good reply is cached as before


# ---- what real servers send besides a completion (a review against a scripted server) -----------------------
def test_a_web_page_answered_with_200_is_a_call_failure_not_a_crash(fake_openai, store):
    """A web UI or a proxy's login page behind the base URL: the SDK hands back the page as text, and reading its
    `.choices` raised AttributeError through `evopool run` (a traceback), past `--agents mixed`'s fallback."""
    fake_openai.raw(200, "<!doctype html><html><title>Open WebUI</title></html>")
    with pytest.raises(LLMCallFailed, match=r"answered with a page, not a chat completion .*ends in /v1"):
        make_client(fake_openai, store).complete(MESSAGES, role="generator")
    assert store.llm_calls()["error"].iloc[-1].startswith("the endpoint answered with a page")


def test_an_error_body_answered_with_200_says_the_providers_words(fake_openai):
    fake_openai.raw(200, '{"error": {"message": "Provider returned error", "code": 502}}', "application/json")
    with pytest.raises(LLMCallFailed, match="answered 200 with an error: Provider returned error"):
        make_client(fake_openai).complete(MESSAGES, role="generator")


def test_a_server_that_takes_no_seed_gets_requests_without_one(fake_openai):
    fake_openai.fail(400, message="Unrecognized request argument supplied: seed")
    fake_openai.reply("fine")
    fake_openai.reply("fine again")
    client = make_client(fake_openai, max_retries=0)
    assert client.complete(MESSAGES, role="generator", seed=3).text == "fine"
    assert client.complete(MESSAGES, role="generator", seed=4).text == "fine again"
    assert [("seed" in r.body) for r in fake_openai.requests] == [True, False, False]


def test_a_plain_text_404_says_the_servers_words_and_where_the_api_usually_is(fake_openai):
    fake_openai.raw(404, "404 page not found", "text/plain")  # Ollama, asked without /v1
    client = make_client(fake_openai, base_url=fake_openai.base_url.removesuffix("/v1"), max_retries=0)
    with pytest.raises(LLMCallFailed, match=r"\(HTTP 404\): 404 page not found \(the base URL .* does not end in /v1"):
        client.complete(MESSAGES, role="generator")
    fake_openai.fail(404, message="The model `gpt-4o-mni` does not exist")  # a JSON error names its own cause
    with pytest.raises(LLMCallFailed) as info:
        client.complete(MESSAGES, role="generator", seed=2)
    assert "does not exist" in str(info.value) and "/v1" not in str(info.value)


def test_giving_up_on_server_errors_keeps_the_servers_last_words(fake_openai):
    for _ in range(2):
        fake_openai.fail(500, message="CUDA out of memory")
    with pytest.raises(LLMCallFailed, match=r"2 attempts: HTTP 500 \(CUDA out of memory\)"):
        make_client(fake_openai, max_retries=1).complete(MESSAGES, role="generator")


def test_a_server_that_stops_answering_is_not_waited_for_call_after_call(fake_openai, store):
    """Each timed-out attempt doubled the timeout and every call began again: with the local preset's 300 s and 4
    retries, a hung server kept a run silent for about 2.4 hours before the generator failed."""
    for _ in range(3):
        fake_openai.hang(5)
    client = make_client(fake_openai, store, timeout_s=0.3, max_retries=4)
    with pytest.raises(LLMCallFailed, match="failed after 2 attempts: timed out.*no more calls in this run"):
        client.complete(MESSAGES, role="generator")
    with pytest.raises(LLMCallFailed, match="the improver call was not sent"):
        client.complete(MESSAGES, role="improver")
    assert len(fake_openai.requests) == 2
    # retries that run out on timeouts alone (EVOPOOL_LLM_RETRIES=1: two attempts) stop the run's calls too
    fake_openai.hang(5)
    fake_openai.hang(5)
    fewer = make_client(fake_openai, timeout_s=0.3, max_retries=1)
    with pytest.raises(LLMCallFailed, match="none answered within its timeout"):
        fewer.complete(MESSAGES, role="generator", seed=1)
    with pytest.raises(LLMCallFailed, match="was not sent"):
        fewer.complete(MESSAGES, role="improver", seed=1)
    assert len(fake_openai.requests) == 4


def test_a_long_wait_before_a_retry_is_said_and_a_context_overflow_names_the_setting(fake_openai, monkeypatch):
    """A 429 with Retry-After: 120 was honoured in silence (minutes that looked like a hang); a context-length
    refusal did not name the setting that makes the request smaller."""
    import engine.llm.transport as transport_module

    monkeypatch.setattr(transport_module, "LONG_WAIT_S", 1.0)  # a test-sized "long" wait
    fake_openai.fail(429, headers={"Retry-After": "1"})
    fake_openai.reply("done")
    client = make_client(fake_openai)
    said: list[str] = []
    client.on_note = said.append
    assert client.complete(MESSAGES, role="generator").text == "done"
    assert any("asked to wait 1 s before the next attempt (Retry-After)" in note for note in said), said
    fake_openai.fail(400, message="This model's maximum context length is 4096 tokens. However, you requested 5000")
    with pytest.raises(LLMCallFailed, match="lower EVOPOOL_MAX_TOKENS"):
        make_client(fake_openai, max_retries=0).complete(MESSAGES, role="generator", seed=9)
