"""Every plot says what its axes are: a reader should not have to guess from the title."""
from __future__ import annotations

import numpy as np

from studio import figures


def test_heatmaps_name_their_axes_and_the_colour_scale():
    fig = figures.heatmap(np.eye(3), ["a", "b", "c"], "Overlap")
    assert fig.layout.xaxis.title.text == "annotator" and fig.layout.yaxis.title.text == "annotator"
    assert fig.data[0].colorbar.title.text == "share of rows"


def test_class_plots_name_their_axes_and_tilt_long_tick_rows():
    labels = tuple(f"class with a long name {i}" for i in range(9))
    share = np.full(9, 1 / 9)
    for fig in (figures.class_balance(labels, share, share), figures.coverage_per_class(labels, share, share)):
        assert fig.layout.xaxis.title.text == "class" and fig.layout.xaxis.tickangle == -30
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.title.text
    few = figures.class_balance(("HAM", "SPAM"), np.array([0.5, 0.5]), np.array([0.4, 0.6]))
    assert few.layout.xaxis.tickangle == 0


def test_the_legend_sits_under_slanted_class_names_not_on_them():
    """Class names on "Coverage per class" and "Predicted class balance" were cut off or under the legend."""
    labels = tuple(f"a rather long class name {i}" for i in range(9))
    for fig in (figures.coverage_per_class(labels, np.full(9, 0.5), np.full(9, 0.1)),
                figures.class_balance(labels, np.full(9, 0.1), np.full(9, 0.1))):
        assert fig.layout.xaxis.tickangle == -30 and fig.layout.xaxis.automargin
        assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # the figure's foot


def test_plot_names_keep_the_head_and_the_tail_of_long_annotator_names():
    from studio.queries import SHORT_NAME, short

    names = {"a" * 12: "Unilateral change: may, modify, amend, revise, chang* [sentence]",
             "b" * 12: "Unilateral change: may, modify, amend, revise, chang* [lead]"}
    shown = [short(i, names) for i in names]
    assert shown[0] != shown[1] and shown[0].split(" ·")[0].endswith("[sentence]")
    assert all(len(s.split(" ·")[0]) <= SHORT_NAME for s in shown)
    assert short("c" * 12, {"c" * 12: "SPAM: subscrib*"}) == "SPAM: subscrib* ·cccccc"
