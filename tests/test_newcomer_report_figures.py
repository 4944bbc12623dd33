"""The report as a new user read it: `fig_gap.png`'s title was cut on both sides, the inference headline called a
policy with a weakly determined field "recovered", and the per-chunk drift was drawn over an axis of token index."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from mimo_numerics import plots, presets
from mimo_numerics.sensitivity import FieldContribution, GapAttribution

STAGE1_OUTPUTS = ("dz", "dmimo_o", "dmimo_z", "states", "qk_dot")


def _gap(n_outputs: int) -> GapAttribution:
    """A gap seed_bf16 -> upstream_sm90 with the stage-1 fields that differ (the report's pair)."""
    a, b = presets.get("seed_bf16"), presets.get("upstream_sm90")
    outputs = STAGE1_OUTPUTS[:n_outputs]
    rows = [FieldContribution(f, va, vb, {o: 0.3 for o in outputs}, {o: 0.3 for o in outputs})
            for f, (va, vb) in a.diff(b, operator="mamba_mimo_bwd_fwd").items()]
    return GapAttribution(a, b, "device (the H200 outputs of the case)", outputs, {o: 1.0 for o in outputs},
                          {o: 0.0 for o in outputs}, rows, {o: 0.1 for o in outputs}, "rel_rms", 1)


def _inside(fig, artist) -> bool:
    FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    box, frame = artist.get_window_extent(), fig.bbox
    return box.x0 >= frame.x0 - 0.5 and box.x1 <= frame.x1 + 0.5 and box.y0 >= frame.y0 - 0.5 and \
        box.y1 <= frame.y1 + 0.5


def _title(fig):
    """The one title of ``fig`` (the figure's or its axes')."""
    texts = [t for t in fig.findobj(Text) if t.get_text().startswith("Gap ")]
    assert len(texts) == 1
    return texts[0]


@pytest.mark.parametrize("n_outputs", [1, 2, 5])
def test_gap_figure_title_and_legend_are_inside_the_figure(n_outputs):
    fig = plots.plot_gap_attribution(_gap(n_outputs))
    title = _title(fig)
    assert "seed_bf16" in title.get_text() and "upstream_sm90" in title.get_text()
    assert _inside(fig, title), (title.get_window_extent(), fig.bbox)
    assert _inside(fig, fig.axes[0].get_legend())
