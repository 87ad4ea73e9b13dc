"""The plot widget's pure parts: resampling into columns and drawing bars with a limit line."""

from aithermctl.widgets.gauge import bar
from aithermctl.widgets.trace_plot import bucket, plot_lines


def test_bucket_keeps_the_max_per_column_and_gaps_as_none():
    points = [(0.0, 1.0), (1.0, 5.0), (2.0, None), (5.0, 3.0), (9.0, 2.0)]
    assert bucket(points, 5, t_end=10.0, span_s=10.0) == [5.0, None, 3.0, None, 2.0]
    assert bucket(points, 5, t_end=10.0, span_s=10.0, pick="last") == [5.0, None, 3.0, None, 2.0]
    assert bucket([(0.0, 1.0), (0.5, 0.2)], 1, t_end=1.0, span_s=1.0, pick="last") == [0.2]
    assert bucket(points, 2, t_end=10.0, span_s=4.0) == [None, 2.0]  # points before t=6 fall out


def test_bucket_holds_sparse_samples_as_steps_but_not_across_a_missing_one():
    points = [(0.0, 4.0), (4.0, 8.0), (6.0, None), (9.0, 2.0)]
    assert bucket(points, 10, t_end=10.0, span_s=10.0) == [4.0, None, None, None, 8.0, None, None, None, None,
                                                           2.0]
    assert bucket(points, 10, t_end=10.0, span_s=10.0, hold_s=3.0) == [4.0, 4.0, 4.0, 4.0, 8.0, 8.0, None,
                                                                       None, None, 2.0]
    assert bucket([(0.0, 1.0)], 4, t_end=4.0, span_s=4.0, hold_s=2.0) == [1.0, 1.0, 1.0, None]
    assert bucket([(-5.0, 3.0), (3.5, 1.0)], 4, t_end=4.0, span_s=4.0, hold_s=9.0) == [3.0, 3.0, 3.0, 1.0]


def test_plot_lines_draw_bars_from_the_bottom_and_the_limit_on_top():
    rows = [r.plain for r in plot_lines([0.0, 50.0, 100.0, None], [75.0, 75.0, 75.0, 75.0], 4, 100.0)]
    assert rows == ["━━━━",  # 75 of 100 lies in the top row (75–100)
                    "  █ ",
                    " ██ ",
                    " ██·"]  # a missing sample is a dot on the floor


def test_bar_uses_eighths():
    assert bar(0.5, 4) == "██  "
    assert bar(1 / 32, 4) == "▏   "
    assert bar(2.0, 3) == "███"
    assert bar(None, 3) == "···"
