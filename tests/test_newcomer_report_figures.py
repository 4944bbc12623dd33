"""The report as a new user read it: `fig_gap.png`'s title was cut on both sides, the inference headline called a
policy with a weakly determined field "recovered", and the per-chunk drift was drawn over an axis of token index."""

import pytest
import numpy as np
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


# ---------------------------------------------------------------------------------------------- inference headline
def _inference(neighbour_distances: dict, ties=()):
    """An InferenceResult with best upstream_sm90 at distance 0.0464 and one neighbour per changed field."""
    from mimo_numerics.inference import Candidate, Evaluation, InferenceResult

    best = presets.get("upstream_sm90")
    neighbours = [Candidate(best.replace(**{field: value}), distance, {}, {field: value})
                  for (field, value), distance in sorted(neighbour_distances.items(), key=lambda kv: kv[1])]
    return InferenceResult(best=best, distance=0.0464, evaluation=Evaluation(0.0464, {}, {}, {}),
                           start=presets.get("seed_bf16"), start_distance=0.9, alternatives=[],
                           neighbours=neighbours, ties=tuple(ties), trace=[], evaluations=255,
                           lp_dtype="bfloat16", n_cases=15)


def test_a_weakly_determined_field_is_no_recovered_policy():
    weak = _inference({("silu_form", "sigmoid"): 0.04645, ("diag_mode", "mul_then_add"): 0.6})
    assert weak.undetermined() == ("silu_form",)
    assert weak.headline() == "Best fit: upstream_sm90 (not determined by these data: silu_form)"
    first = weak.to_markdown().splitlines()[0]
    assert first.startswith("**Best-fitting policy, not a unique recovery**") and "`silu_form`" in first
    assert "Recovered policy" not in weak.to_markdown()
    assert plots.plot_inference(weak).axes[0].get_title().startswith("Best fit: upstream_sm90 (not determined")


def test_a_tie_is_no_recovered_policy():
    tied = _inference({("silu_form", "sigmoid"): 0.0464, ("diag_mode", "mul_then_add"): 0.6}, ties=("silu_form",))
    assert tied.headline().startswith("Best fit:") and "silu_form" in tied.headline()


def test_a_determined_policy_is_recovered():
    clear = _inference({("silu_form", "sigmoid"): 0.09, ("diag_mode", "mul_then_add"): 0.6})
    assert clear.undetermined() == ()
    assert clear.headline() == "Recovered policy: upstream_sm90"
    assert clear.to_markdown().startswith("**Recovered policy** (")
    assert plots.plot_inference(clear).axes[0].get_title().startswith("Recovered policy: upstream_sm90")


# ---------------------------------------------------------------------------------------------- drift along the sequence
@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    """``mimo-numerics report --case smoke:0`` (stage 1, an emulated device), in this process."""
    import argparse

    from mimo_numerics import report

    out = tmp_path_factory.mktemp("report") / "smoke"
    parser = report.add_report_arguments(argparse.ArgumentParser())
    report.run_report(parser.parse_args(["--case", "smoke:0", "--out", str(out), "--quiet"]))
    return out


def _drift_section(summary: str) -> str:
    start = summary.index("## Drift along the sequence")
    return summary[start:summary.index("\n## ", start + 1)]


def test_report_says_which_drift_is_per_token_and_which_per_chunk(smoke_report):
    section = _drift_section((smoke_report / "summary.md").read_text(encoding="utf-8"))
    figure_at = section.index("fig_drift_along_sequence.png")
    assert "Per token (the figure's x axis is the token index)" in section[:figure_at]
    table_intro = section[figure_at:]
    assert table_intro.index("Per chunk (") < table_intro.index("| run | stage | per chunk")


def test_sequence_drift_axis_names_what_it_indexes():
    from mimo_numerics.drift import SequenceDrift

    series = np.array([1e-4, 2e-4, 3e-4])
    for per, label in (("chunk", "chunk index along the sequence (chunk 0 first)"),
                       ("token", "token index along the sequence")):
        drift = SequenceDrift(per, "fp64", np.arange(3), {"upstream_sm90": {"out": series}}, None)
        fig = plots.plot_sequence_drift(drift)
        assert fig.axes[0].get_xlabel() == label
        assert f"per {per}" in fig.get_suptitle()
