"""Plotly figure builders. Each draws aggregates or a bounded sample, never one mark per example."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

HEIGHT = 340
# the top margin holds the title low, just above the plot: Streamlit's element toolbar and plotly's modebar
# float over the chart's top edge on hover and hid titles set in the middle of a 40-pixel margin
MARGIN = {"l": 10, "r": 10, "t": 64, "b": 36}  # b: the legend's row
VERDICT_COLORS = {"accept": "#2f6f5e", "approve": "#1f77b4", "reject": "#c0392b", "prune": "#e67e22",
                  "pending": "#999999"}


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left", "xref": "paper", "y": 1, "yanchor": "bottom",
                             "yref": "paper", "pad": {"b": 10}},
                      height=height, margin=MARGIN,
                      # at the foot of the figure, under the axis and its (often slanted) class names: placed on the
                      # plot's own scale it sat on top of long class names
                      legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"})
    return fig


def timeline(generations: pd.DataFrame, audit: dict[int, float] | None = None,
             fitness: dict[int, float] | None = None, partial: bool = False,
             sizes: dict[int, int] | None = None) -> go.Figure:
    """Pool size (bars) and dev macro-F1 (line) per complete generation; with audit rows, the fitness figure
    the gate optimised and, dashed, the same pool on the audit rows it never saw. `fitness`: the fitness figure
    of the same pools and rows as `audit`, drawn instead of the stored one where given, so that the two lines
    compare like with like; `partial`: both are over the classes the audit rows hold (some class has none);
    `sizes`: each generation's pool as it stands now (after the expert's verdicts), drawn instead of the stored size."""
    done = generations[generations["status"] == "complete"]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    size = [(sizes or {}).get(int(n), s) for n, s in zip(done["number"], done["pool_size"], strict=True)]
    fig.add_bar(x=done["number"], y=size, name="pool size", marker_color="#b7d7cd", width=0.5)
    line = [(fitness or {}).get(int(n), f) for n, f in zip(done["number"], done["dev_macro_f1_after"], strict=True)]
    name = ("fitness macro-F1" + (" (classes with audit rows)" if partial else "")) if audit else "dev macro-F1"
    fig.add_scatter(x=done["number"], y=line, name=name, mode="lines+markers",
                    line={"color": "#2f6f5e", "width": 3}, secondary_y=True)
    if audit:
        fig.add_scatter(x=list(audit), y=list(audit.values()), name="audit macro-F1", mode="lines+markers",
                        line={"color": "#c0392b", "width": 2, "dash": "dash"}, secondary_y=True)
    last = int(done["number"].max()) if len(done) else 1
    fig.update_xaxes(title="generation", dtick=1, range=[0.4, max(last, 4) + 0.6])
    fig.update_yaxes(title="annotators in the pool", secondary_y=False)
    fig.update_yaxes(title="dev macro-F1", range=[0, 1.02], tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1.0], showgrid=False,
                     secondary_y=True)
    return _layout(fig, "Generations: pool size and dev macro-F1")


def coverage_per_class(labels: tuple[str, ...], coverage: np.ndarray, dev_share: np.ndarray | None) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=list(labels), y=coverage, name="rows with ≥ 1 vote for the class", marker_color="#2f6f5e")
    if dev_share is not None:
        fig.add_bar(x=list(labels), y=dev_share, name="share of the class in dev", marker_color="#c9c9c9")
    fig.update_xaxes(title="class", tickangle=-30 if len(labels) > 4 else 0, automargin=True)
    fig.update_yaxes(title="share of rows", range=[0, 1])
    return _layout(fig, "Coverage per class")


def heatmap(matrix: np.ndarray, names: list[str], title: str, colorscale: str = "Greens") -> go.Figure:
    """Annotator x annotator; with many annotators the tick names are dropped (hover still names each cell)."""
    fig = go.Figure(go.Heatmap(z=matrix, x=names, y=names, colorscale=colorscale, zmin=0,
                               colorbar={"title": {"text": "share of rows"}},
                               hovertemplate="%{y}<br>%{x}<br>%{z:.3f}<extra></extra>"))
    fig.update_xaxes(title="annotator", showticklabels=len(names) <= 25, tickangle=45, automargin=True)
    fig.update_yaxes(title="annotator", showticklabels=len(names) <= 25, autorange="reversed", automargin=True)
    return _layout(fig, title, height=max(HEIGHT, min(700, 24 * len(names) + 120)))


def precision_coverage(table: pd.DataFrame) -> go.Figure:
    """One point per annotator (bounded by the pool size), coloured by verdict; `customdata` holds the id."""
    fig = go.Figure()
    for verdict, part in table.groupby("verdict"):
        fig.add_scatter(x=part["coverage"], y=part["precision"], mode="markers", name=str(verdict),
                        customdata=part[["id"]].to_numpy(), text=part["name"],
                        marker={"size": 11, "color": VERDICT_COLORS.get(str(verdict), "#555"), "opacity": 0.85},
                        hovertemplate="%{text}<br>coverage %{x:.3f}<br>precision %{y:.2f}<extra></extra>")
    fig.update_xaxes(title="coverage on dev")
    fig.update_yaxes(title="precision on dev", range=[-0.02, 1.05])
    return _layout(fig, "Precision vs coverage (click a point to open it)", height=420)


def contributions(names: list[str], values: np.ndarray) -> go.Figure:
    order = np.argsort(values)
    colors = ["#c0392b" if v < 0 else "#2f6f5e" for v in values[order]]
    fig = go.Figure(go.Bar(x=values[order], y=[names[i] for i in order], orientation="h", marker_color=colors,
                           hovertemplate="%{y}<br>%{x:+.4f}<extra></extra>"))
    fig.update_xaxes(title="dev macro-F1 lost without it")  # short: the chart sits in half the screen
    fig.update_yaxes(title="annotator", automargin=True)
    return _layout(fig, "What each annotator adds", height=max(HEIGHT, min(900, 22 * len(names) + 100)))


def confidence_histogram(confidence: np.ndarray, bins: int = 20) -> go.Figure:
    counts, edges = np.histogram(confidence, bins=bins, range=(0, 1))
    fig = go.Figure(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=1 / bins * 0.95, marker_color="#2f6f5e"))
    fig.update_xaxes(title="confidence (top class probability)", range=[0, 1])
    fig.update_yaxes(title="rows")
    return _layout(fig, "Confidence of the soft labels")


def class_balance(labels: tuple[str, ...], predicted: np.ndarray, dev: np.ndarray) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=list(labels), y=predicted, name="predicted (all rows)", marker_color="#2f6f5e")
    fig.add_bar(x=list(labels), y=dev, name="dev (gold)", marker_color="#c9c9c9")
    fig.update_xaxes(title="class", tickangle=-30 if len(labels) > 4 else 0, automargin=True)
    fig.update_yaxes(title="share", range=[0, 1])
    return _layout(fig, "Predicted class balance vs dev")


def reliability(bins: pd.DataFrame) -> go.Figure:
    """bins: confidence (mean per bin), accuracy, count. The diagonal is perfect calibration."""
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfectly calibrated",
                    line={"dash": "dot", "color": "#999"})
    fig.add_scatter(x=bins["confidence"], y=bins["accuracy"], mode="lines+markers", name="dev",
                    marker={"size": np.clip(np.sqrt(bins["count"].to_numpy()) * 3, 6, 24), "color": "#2f6f5e"},
                    text=bins["count"], hovertemplate="confidence %{x:.2f}<br>accuracy %{y:.2f}<br>%{text} rows")
    fig.update_xaxes(title="confidence", range=[0, 1])
    fig.update_yaxes(title="accuracy on dev", range=[0, 1.02])
    return _layout(fig, "Reliability diagram (dev)")


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> pd.DataFrame:
    """Mean confidence and accuracy per equal-width confidence bin (empty bins left out)."""
    edges = np.linspace(0, 1, n_bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, n_bins - 1)
    rows = [{"confidence": confidence[which == b].mean(), "accuracy": correct[which == b].mean(),
             "count": int((which == b).sum())} for b in range(n_bins) if (which == b).any()]
    return pd.DataFrame(rows, columns=["confidence", "accuracy", "count"])


def weak_spots(spots: list, labels: tuple[str, ...]) -> go.Figure:
    """One bar per cluster (named by its words): rows with no vote, with conflicting votes, and covered."""
    names = [f"{i + 1}. {', '.join(s.terms[:3])}" for i, s in enumerate(spots)]
    no_vote = [round(s.size * s.no_vote_share) for s in spots]
    conflict = [round(s.size * s.conflict_share) for s in spots]
    covered = [s.size - a - b for s, a, b in zip(spots, no_vote, conflict, strict=True)]
    fig = go.Figure()
    for values, name, color in ((no_vote, "no vote", "#c0392b"), (conflict, "conflicting votes", "#e67e22"),
                                (covered, "one class voted", "#b7d7cd")):
        fig.add_bar(y=names, x=values, name=name, orientation="h", marker_color=color,
                    hovertemplate="%{y}<br>%{x} rows " + name + "<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="rows")
    fig.update_yaxes(title="group of rows (its words)", autorange="reversed", automargin=True)
    return _layout(fig, "Where the pool is weak", height=max(HEIGHT, 28 * len(spots) + 120))
