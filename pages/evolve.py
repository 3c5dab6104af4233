"""Evolve: run generations in the background, watch the agents live, and judge the gate's verdicts."""
import streamlit as st

from engine.agents.choice import AGENT_CHOICES, AGENTS, llm_config
from engine.expert import review
from engine.jobs import REGISTRY, start_evolve
from engine.llm.costs import META_KEY as BUDGET_KEY
from engine.llm.costs import Budget
from engine.llm.seam import LLMAuthError
from studio import editor, figures, progress, queries, review_ui, state, widgets
from studio.refresh import AppRefresh, poll_job

DEFAULT_MAX_CALLS, DEFAULT_MAX_USD = 200, 2.0  # a first LLM run's limits, where the workspace has none yet

widgets.header("Evolve", "agents propose annotators, the sandbox runs them, the gate decides")
store = widgets.require_data()

workdir = store.path.parent
job = REGISTRY.running(workdir, "evolve")
last = store.last_complete_generation()

# ---- controls -------------------------------------------------------------------------------------
with st.container(border=True):
    left, mid = st.columns([2, 1])
    agents = left.radio("Agents", AGENT_CHOICES, horizontal=True, key="evolve_agents",
                        format_func=AGENTS.get,
                        help="Offline agents mine the dev split for cues; LLM agents need an OpenAI-compatible "
                             "endpoint (OPENAI_BASE_URL / OPENAI_API_KEY or .streamlit/secrets.toml).")
    until = mid.number_input("Run until generation", last + 1, last + 50, last + 1, key="evolve_until",
                             help="as `evopool run --generations N`: evolve until the pool has N complete "
                                  "generations")
    more = int(until) - last
    llm, budget = {}, {}
    if agents != "offline":
        editor.containment_note()  # a model's code will run: how walled in it is on this machine, layers off loudly
        with st.expander("LLM endpoint and budget"):
            a, b = st.columns(2)
            llm = {"base_url": a.text_input("Base URL (blank: from env / secrets)", key="llm_url"),
                   "model": b.text_input("Model (blank: from env / secrets)", key="llm_model")}
            # the workspace's own limits (set by `evopool run --max-calls` too; none stored there: 0, no limit), and a
            # first run's safety defaults only where no budget was ever set: Run stores what the fields hold
            now = Budget.for_workspace(store, save=False)
            fresh = store.get_meta(BUDGET_KEY) is None
            calls = now.max_calls if now.max_calls is not None else (DEFAULT_MAX_CALLS if fresh else 0)
            usd = now.max_usd if now.max_usd is not None else (DEFAULT_MAX_USD if fresh else 0.0)
            budget = {"max_calls": a.number_input("Max calls (0: no limit)", 0, max(10_000, calls), calls,
                                                  key=f"llm_calls_{workdir.name}"),
                      "max_usd": b.number_input("Max dollars (0: no limit)", 0.0, max(1000.0, usd), float(usd),
                                                key=f"llm_usd_{workdir.name}")}
            st.caption("The budget is the workspace's: every HTTP attempt (retries too) counts, across runs. "
                       f"Now: {now.describe()}.")
    unreachable = None
    if agents != "offline":  # said before Run, not as a failed run after it
        try:
            llm_config(llm, widgets.secrets()).resolved_api_key()  # resolved as the run will resolve it
        except (LLMAuthError, ValueError) as err:
            unreachable = str(err)
            fix = ("Fill **Base URL** above for a local server, or choose the offline agents." if
                   isinstance(err, LLMAuthError) else "Correct that setting (environment or .streamlit/secrets.toml).")
            st.warning(f"The LLM agents cannot run yet: {unreachable}. {fix}", icon=":material/key_off:")
    start, stop_soft, stop_hard = st.columns(3)
    if start.button(f"Run {more} generation{'s' if more > 1 else ''} (to {until})", type="primary",
                    disabled=job is not None or unreachable is not None,
                    icon=":material/play_arrow:", key="evolve_start"):
        try:
            start_evolve(workdir, int(more), agents, llm_overrides=llm, secrets=widgets.secrets(), budget=budget)
            st.rerun()
        except Exception as err:  # a refused start (already running, no data) is a message
            st.error(f"Could not start: {err}")
    if stop_soft.button("Stop after this generation", disabled=job is None, key="evolve_stop",
                        icon=":material/stop_circle:"):
        job.stop()
        st.toast("Stopping after the current generation.")
    if stop_hard.button("Stop now", disabled=job is None, key="evolve_stop_now", icon=":material/cancel:"):
        widgets.ask_confirm("stop_now")
    if widgets.confirm("stop_now", "Stop now? The unfinished generation is thrown away (its candidates are "
                       "re-proposed next time); complete generations are kept.", "Stop now"):
        running = REGISTRY.running(workdir, "evolve")
        if running:
            running.stop(now=True)

# ---- live progress ------------------------------------------------------------------------------
st.subheader("Live")


def live(refresh_app: AppRefresh) -> None:
    current = REGISTRY.running(workdir, "evolve")
    if job is not None and current is None:
        refresh_app()  # the run just ended: refresh the timeline and the verdicts
    progress.live_panel(store, current or REGISTRY.latest(workdir, "evolve"), progress.latest_evolve_job_id(store))


poll_job(live, 1.0 if job is not None else None)

# ---- timeline --------------------------------------------------------------------------------------
generations = store.generations()
if (generations["status"] == "complete").any():
    st.plotly_chart(figures.timeline(generations, *queries.audit_by_generation(store)), key="timeline")
else:
    st.info("The first generation is running: the timeline and its verdicts appear here when it completes."
            if job is not None else "No complete generation yet: press **Run** above.")
    st.stop()

idle = review.idle_generations(generations)
if idle >= 2:
    st.info(f"The last {idle} generations proposed nothing new: {review.IDLE_ADVICE} (the **Labels** screen, the "
            "**Project** screen, the **Annotator** editor, the agents' choice above).",
            icon=":material/hourglass_empty:")
review_ui.thin_class_note(store)

# ---- verdicts -------------------------------------------------------------------------------------
st.subheader("Verdicts")
st.caption("Every candidate with the gate's verdict and reasons. Approve or reject against the gate: your "
           "verdict needs a reason, is logged, and every later generation respects it; its **Undo** button takes it "
           "back.")
done = generations[generations["status"] == "complete"]["number"].tolist()
carded = store.gate_generations()  # generations with gate verdicts
# a generation completed since: show the newest one with verdicts (one whose agents proposed nothing new showed an
# empty list, with every card generations back)
newest = next((g for g in reversed(done) if g in carded), done[-1])
a, b = st.columns([1, 2])
# a newer generation opens by itself, but not on the run that carries a verdict given on the open one's card: its
# form would not be drawn and the verdict would be lost without a word (a run ending while the expert typed)
if st.session_state.get("verdict_newest") != done[-1] and not review_ui.verdict_pending():
    st.session_state["verdict_newest"], st.session_state["verdict_generation"] = done[-1], newest
elif "verdict_generation" not in st.session_state:  # back from another screen: the generation the expert had open
    picked = state.kept("verdict_generation", newest)
    st.session_state["verdict_generation"] = picked if picked in done else newest
number = a.selectbox("Generation", list(reversed(done)), key="verdict_generation",
                     format_func=lambda g: str(g) if g in carded else f"{g} (no gate verdicts)")
state.keep("verdict_generation", number)
only = b.segmented_control("Show", ["all", "accept", "reject", "prune"], default="all", key="verdict_filter")
review_ui.candidate_cards(store, int(number), only or "all")
