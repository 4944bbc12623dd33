"""Figures of the drift, sensitivity and inference results (matplotlib, no pyplot state).

Every function returns a ``matplotlib.figure.Figure`` (or draws into ``ax`` when given and returns its figure), with
labelled axes, log scales where errors span decades and a legend naming the runs or policies. Zeros cannot sit on a
log axis: they are drawn at the axis floor with a hollow marker (or a hatched bar) and the legend says so.
:func:`save_figure` writes a PNG. Figures made here display in Jupyter as the last expression of a cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from matplotlib.figure import Figure

from .drift import DriftTable, SequenceDrift, stage_sites
from .inference import InferenceResult, describe_policy
from .sensitivity import GapAttribution, SensitivityTable

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_STYLES = ("-", "--", "-.", ":")


def _style(i: int) -> dict:
    """Marker, line style and a marker size that shrinks with ``i``, so runs that coincide stay visible."""
    return {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": _STYLES[i % len(_STYLES)],
            "markersize": max(8.0 - 1.3 * i, 3.0)}


def _legend_outside(ax, handles=None, labels=None, fontsize=8):
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _axes(ax, size: Tuple[float, float]):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


def _figure_title(fig: Figure, text: str, **kwargs) -> None:
    """``text`` as the title of the whole figure (centred on it, room kept by the constrained layout), the figure
    widened where the title is wider than it: a title over one narrow axes (its legend outside) was cut on both
    sides."""
    title = fig.suptitle(text, **kwargs)
    fig.draw_without_rendering()
    needed = title.get_window_extent().width / fig.dpi + 0.3  # inches, with a margin
    if needed > fig.get_figwidth():
        fig.set_figwidth(needed)


def _positive_floor(values) -> float:
    finite = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    return min(finite) / 10.0 if finite else 1e-12


#: Where exact zeros sit on a log axis, as a factor below the smallest positive value.
_ZERO_BAND = 30.0
ZERO_LABEL = "0 (exact)"


def _zero_level(values) -> float:
    finite = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    return min(finite) / _ZERO_BAND if finite else 1.0


def _mark_zero_level(ax, level: float) -> None:
    """A dotted line and a ``0 (exact)`` tick at ``level`` of a log y axis, below a gap to the positive values."""
    ax.autoscale_view()
    top = ax.get_ylim()[1]
    decades = [10.0 ** e for e in range(int(np.ceil(np.log10(level * 3))), int(np.floor(np.log10(top))) + 1)]
    ax.axhline(level, color="gray", linestyle=":", linewidth=0.8)
    ax.set_yticks(decades + [level], [f"$10^{{{int(round(np.log10(t)))}}}$" for t in decades] + [ZERO_LABEL])
    ax.minorticks_off()
    ax.set_ylim(level / 2.5, top)


def save_figure(fig: Figure, path: Union[str, Path], dpi: int = 120) -> Path:
    """Write ``fig`` as a PNG (parent directories created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _short(stage: str) -> str:
    return stage.replace("output.", "out:")


def _ungrouped(stage: str, groups: Optional[Mapping[str, str]]) -> str:
    """``stage`` without its ``<group>.`` prefix (when ``groups`` names one)."""
    group = (groups or {}).get(stage)
    return stage[len(group) + 1:] if group and stage.startswith(group + ".") else stage


def _draw_groups(ax, names: Sequence[str]) -> None:
    """Shade every other run of equal ``names`` along the x axis (one name per tick), separate the runs by a line
    and write each run's name above the axes."""
    bounds = [i for i in range(1, len(names)) if names[i] != names[i - 1]]
    for band, (lo, hi) in enumerate(zip([0] + bounds, bounds + [len(names)])):
        if band % 2 == 0:
            ax.axvspan(lo - 0.5, hi - 0.5, color="tab:gray", alpha=0.12, linewidth=0)
        if lo > 0:
            ax.axvline(lo - 0.5, color="tab:gray", linewidth=0.8)
        ax.text((lo + hi - 1) / 2, 1.01, names[lo], transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=8, fontweight="bold")
    ax.set_xlim(-0.5, len(names) - 0.5)


# ---------------------------------------------------------------------------------------------- drift
def plot_stage_drift(table: DriftTable, metric: str = "rel_rms", ax=None, title: Optional[str] = None,
                     sites: bool = False, groups: Optional[Mapping[str, str]] = None,
                     stage_width: float = 0.42) -> Figure:
    """Error of every run against the baseline, stage by stage in the pipeline order of the table's operator (or
    its ``order``; log y).

    With ``sites``, each stage's tick also names the policy switch that rounds it (``Stage.site`` of the spec, as
    ``stage [site]``), so a jump in the line can be read against the site that makes it. With ``groups`` (stage ->
    group name, e.g. the operator of each stage of a chain; contiguous in the table's order), the stages of each
    group sit on a shaded band named above the axes and their ticks drop the ``<group>.`` prefix. A run that lacks
    some stages (a device giving outputs only) is drawn at the stages it has. ``stage_width``: inches per stage.
    """
    stages = table.stages()
    site_of = stage_sites(table.operator) if sites else {}
    data = table.pivot(metric)
    fig, ax = _axes(ax, (max(8.0, stage_width * len(stages) + 2), 4.8))
    floor = _zero_level([v for run in data.values() for v in run.values()])
    x = np.arange(len(stages))
    zero_drawn = False
    for i, label in enumerate(table.labels()):
        ys = np.array([data[label].get(s, np.nan) for s in stages], dtype=float)
        plotted = np.where(ys > 0, ys, np.nan)
        style = _style(i)
        line = ax.plot(x, plotted, linewidth=1.2, label=label, **style)[0]
        zeros = np.where(ys == 0)[0]
        if zeros.size:
            zero_drawn = True
            ax.plot(x[zeros], np.full(zeros.size, floor), linestyle="none", marker=style["marker"],
                    markersize=style["markersize"], markerfacecolor="none", color=line.get_color())
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([_short(_ungrouped(s, groups)) + (f" [{site_of[s]}]" if site_of.get(s) else "")
                        for s in stages], rotation=60 if groups is None else 90, ha="right" if groups is None else
                       "center", fontsize=8 if groups is None else 7)
    names = {"rel_rms": "relative RMS error", "max_abs": "max abs error",
             "max_ulp": f"max error [{table.lp_dtype} ULP]"}
    ax.set_ylabel(f"{names.get(metric, metric)} vs {table.baseline}")
    if groups:
        _draw_groups(ax, [groups.get(s, "") for s in stages])
        ax.set_xlabel("stage (chain order, grouped by the band above; outputs. = the step's outputs)")
    else:
        ax.set_xlabel("stage (pipeline order; out: = kernel output"
                      + ("; [site] = its rounding switch)" if sites else ")"))
    ax.grid(True, which="major", axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if zero_drawn:
        from matplotlib.lines import Line2D

        _mark_zero_level(ax, floor)
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="gray"))
        labels.append(f"hollow, on the {ZERO_LABEL} line: bit-identical")
    _legend_outside(ax, handles, labels)
    ax.set_title(title or "Error by stage", pad=16 if groups else None)
    return fig


def plot_sequence_drift(drift: SequenceDrift, stages: Optional[Sequence[str]] = None, title: Optional[str] = None
                        ) -> Figure:
    """Error along the sequence (per chunk or token), one panel per stage, one line per run (log y)."""
    available = drift.stages()
    stages = [s for s in (stages or available) if s in available]
    if not stages:
        raise ValueError(f"none of the stages is in the drift result; available: {available}")
    fig = Figure(figsize=(max(6.0, 4.2 * len(stages)), 4.0), layout="constrained")
    axes = fig.subplots(1, len(stages), squeeze=False)[0]
    for ax, stage in zip(axes, stages):
        values = [v for run in drift.values.values() if stage in run for v in run[stage]]
        floor = _positive_floor(values)
        for i, (label, run) in enumerate(drift.values.items()):
            if stage not in run:
                continue
            ys = run[stage]
            xs = np.arange(len(ys))
            style = _style(i)
            line = ax.plot(xs, np.where(ys > 0, ys, np.nan), linewidth=1.2, label=label, **style)[0]
            zeros = np.where(ys == 0)[0]
            if zeros.size:
                ax.plot(xs[zeros], np.full(zeros.size, floor), linestyle="none", marker=style["marker"],
                        markersize=style["markersize"], markerfacecolor="none", color=line.get_color())
        ax.set_yscale("log")
        ax.set_xlabel("chunk index along the sequence (chunk 0 first)" if drift.per == "chunk"
                      else "token index along the sequence")
        ax.set_ylabel(f"relative RMS error vs {drift.baseline}")
        ax.set_title(_short(stage))
        ax.grid(True, which="major", axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    if any((run[s] == 0).any() for run in drift.values.values() for s in stages if s in run):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="gray"))
        labels.append("hollow: 0 (exact), drawn at the floor")
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=min(len(labels), 5))
    fig.suptitle(title or f"Error along the sequence, per {drift.per}")
    return fig


# ---------------------------------------------------------------------------------------------- sensitivity
def plot_sensitivity(table: SensitivityTable, output: Optional[str] = None, top: Optional[int] = None, ax=None,
                     title: Optional[str] = None, show_policy_values: bool = False) -> Figure:
    """The sensitivity ranking as horizontal bars.

    With ``output`` None: each site's score (fraction of the policy's error it reproduces alone, mean over
    outputs) on a linear x axis, each bar labelled with its value (scores of 0.07 and 0.44 must not look alike, as
    they do on a log axis). With an output: its one-on and one-off errors (log x, errors span decades), with the
    all-off floor and the full policy's error as vertical lines. Knob rows at the policy's own value (one-off = the
    policy itself) are left out unless ``show_policy_values`` (``diag_mode`` is always shown: its one-on turns
    ``diag_accum`` on).
    """
    rows = [r for r in table.ranked(output) if show_policy_values or r.kind == "switch" or r.site == "diag_mode"
            or r.value != getattr(table.policy, r.site)]
    if top is not None:
        rows = rows[:top]
    rows = rows[::-1]  # best at the top
    fig, ax = _axes(ax, (8.0 if output is None else 10.5, max(3.5, 0.28 * len(rows) + 1.5)))
    y = np.arange(len(rows))
    labels = [r.label for r in rows]
    if output is None:
        values = np.array([r.score for r in rows], dtype=float)
        colors = ["tab:blue" if r.kind == "switch" else "tab:purple" for r in rows]
        ax.barh(y, values, color=colors)
        span = max(float(np.nanmax(np.abs(values))) if values.size else 0.0, 1e-12)
        for yi, v in zip(y, values):
            text = "0 (no effect)" if v == 0 else f"{v:.2g}"
            ax.text(max(v, 0.0) + 0.01 * span, yi, text, va="center", ha="left", fontsize=7)
        ax.set_xlim(min(0.0, float(np.nanmin(values)) * 1.1) if values.size else 0.0, 1.15 * span)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"score: fraction of {table.policy.name}'s error the site adds alone (mean over outputs; "
                      "linear)")
        from matplotlib.patches import Patch

        handles = [Patch(color="tab:blue", label="switch on alone"), Patch(color="tab:purple", label="knob value")]
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    else:
        on = np.array([r.one_on[output] for r in rows])
        off = np.array([r.one_off[output] for r in rows])
        floor = _positive_floor(np.concatenate([on, off]))
        h = 0.4
        ax.barh(y + h / 2, np.where(on > 0, on, floor), height=h, color="tab:orange", label="one-on (only this site)")
        ax.barh(y - h / 2, np.where(off > 0, off, floor), height=h, color="tab:green",
                label="one-off (all but this site)")
        ax.axvline(table.floor_error[output], color="gray", linestyle="--", label="all switches off")
        ax.axvline(table.policy_error[output], color="black", linestyle=":", label=f"all of {table.policy.name}")
        ax.set_xlabel(f"relative RMS error of {output} vs {table.baseline}")
        _legend_outside(ax)
        ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylabel("site (switch, or knob=value)")
    ax.grid(True, which="major", axis="x", alpha=0.3)
    ax.set_title(title or f"Sensitivity of {table.policy.name} vs {table.baseline} ({table.n_cases} case(s))"
                 + (f": {output}" if output else ""))
    return fig


def plot_output_errors(errors: Mapping[str, Mapping[str, float]], baseline: str = "fp64", ax=None,
                       title: Optional[str] = None) -> Figure:
    """Grouped bars: per output, one bar per policy (log y). ``errors`` is ``{label: {output: error}}``."""
    labels = list(errors)
    outputs = list(dict.fromkeys(o for e in errors.values() for o in e))
    fig, ax = _axes(ax, (max(7.0, 1.4 * len(outputs) + 0.3 * len(labels) * len(outputs)), 4.5))
    floor = _positive_floor([v for e in errors.values() for v in e.values()])
    width = 0.8 / max(len(labels), 1)
    x = np.arange(len(outputs))
    for i, label in enumerate(labels):
        values = np.array([errors[label].get(o, np.nan) for o in outputs], dtype=float)
        bars = ax.bar(x - 0.4 + width * (i + 0.5), np.where(values > 0, values, floor), width=width, label=label)
        for bar, v in zip(bars, values):
            if v == 0:
                bar.set_hatch("//")
                bar.set_alpha(0.4)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(outputs)
    ax.set_xlabel("output")
    ax.set_ylabel(f"relative RMS error vs {baseline}")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    _legend_outside(ax)
    ax.set_title(title or "Output error per policy (hatched: 0)")
    return fig


def plot_score_matrix(values: Mapping[str, Mapping[str, float]], columns: Optional[Sequence[str]] = None, ax=None,
                      title: Optional[str] = None, xlabel: str = "output", ylabel: str = "site",
                      colorbar: str = "score", vmax: Optional[float] = None) -> Figure:
    """A heat map of ``values`` (``{row: {column: value}}``; rows top to bottom in the given order, columns in
    ``columns`` or first-seen order), each cell's value written in it (2 decimals); cells a row lacks (or NaN) are
    left white and marked ``–``. Meant for site × output tables of fractions (the share of each output's error a
    site causes); the colour scale runs from 0 to ``vmax`` (default: the largest value)."""
    rows = list(values)
    columns = list(columns) if columns is not None else list(dict.fromkeys(c for v in values.values() for c in v))
    grid = np.array([[values[r].get(c, np.nan) for c in columns] for r in rows], dtype=float).reshape(len(rows),
                                                                                                    len(columns))
    finite = grid[np.isfinite(grid)]
    top = vmax if vmax is not None else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
    fig, ax = _axes(ax, (max(6.0, 0.62 * len(columns) + 4.0), max(3.0, 0.3 * len(rows) + 1.8)))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="Blues", vmin=0.0, vmax=top, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        text = "–" if not np.isfinite(v) else f"{v:.2f}"
        dark = np.isfinite(v) and v > 0.6 * top
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(np.arange(len(columns)))
    ax.set_xticklabels(columns, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(np.arange(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, label=colorbar, shrink=0.8)
    ax.set_title(title or "Score per row and column")
    return fig


def plot_gap_attribution(gap: GapAttribution, ax=None, title: Optional[str] = None) -> Figure:
    """Per output, the fraction of ``d(A)`` each differing field closes on its own, plus the interactions."""
    outputs = [o for o in gap.outputs if gap.gap[o] > 0]
    own = ax is None
    fig, ax = _axes(ax, (max(6.0, 1.6 * len(outputs) + 2), 4.2))
    names = [f"{r.field}: {r.value_a}→{r.value_b}" for r in gap.rows] + ["interactions"]
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(outputs))
    for i, name in enumerate(names):
        if i < len(gap.rows):
            values = [gap.rows[i].forward[o] / gap.gap[o] for o in outputs]
        else:
            values = [gap.interaction[o] / gap.gap[o] for o in outputs]
        ax.bar(x - 0.4 + width * (i + 0.5), values, width=width, label=name)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(outputs)
    ax.set_xlabel("output")
    ax.set_ylabel(f"fraction of d({gap.policy_a.name}) closed")
    _legend_outside(ax)
    ax.grid(True, axis="y", alpha=0.3)
    text = title or f"Gap {gap.policy_a.name} → {gap.policy_b.name} ({gap.metric} to {gap.target})"
    if own:
        _figure_title(fig, text)
    else:
        ax.set_title(text)
    return fig


# ---------------------------------------------------------------------------------------------- inference
def plot_inference(result: InferenceResult, top: int = 15, extra: Optional[Mapping[str, float]] = None, ax=None,
                   title: Optional[str] = None) -> Figure:
    """Distance of the recovered policy and of its nearest single-field neighbours (log x).

    Args:
        result (InferenceResult): from ``infer_policy``.
        top (int): how many neighbours to draw.
        extra (dict, optional): more labelled distances to draw (e.g. the start policy's).
    """
    entries = [(f"best: {describe_policy(result.best)}", result.distance, "tab:green")]
    entries += [(c.label(), c.distance, "tab:gray") for c in result.neighbours[:top]]
    for label, value in (extra or {}).items():
        entries.append((label, value, "tab:orange"))
    entries = entries[::-1]
    fig, ax = _axes(ax, (8.0, max(3.5, 0.3 * len(entries) + 1.5)))
    values = np.array([v for _, v, _ in entries], dtype=float)
    floor = _positive_floor(values)
    y = np.arange(len(entries))
    bars = ax.barh(y, np.where(values > 0, values, floor), color=[c for _, _, c in entries])
    for bar, v in zip(bars, values):
        if v == 0:
            bar.set_hatch("//")
            bar.set_facecolor("none")
            bar.set_edgecolor("tab:green")
    ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels([label for label, _, _ in entries], fontsize=8)
    ax.set_xlabel("distance to the target outputs (see mimo_numerics.inference)")
    ax.set_ylabel("policy (best, then one field changed)")
    from matplotlib.patches import Patch

    handles = [Patch(color="tab:green", label="best fit" if result.undetermined() else "recovered policy"),
               Patch(color="tab:gray", label="neighbour (one field changed)")]
    if extra:
        handles.append(Patch(color="tab:orange", label="other policies"))
    if (values == 0).any():
        handles.append(Patch(facecolor="none", hatch="//", edgecolor="tab:green", label="0 (bit-exact)"))
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    ax.grid(True, which="major", axis="x", alpha=0.3)
    ax.set_title(title or f"{result.headline()}\n(distance {result.distance:.3g}, "
                 f"{result.n_cases} case(s)) and its single-field neighbours", fontsize=10)
    return fig


def plot_decode_drift(study: Mapping, title: Optional[str] = None) -> Figure:
    """A decode-drift study (``studies.decode_drift.run``). Left: per policy, the decode's per-token error of Out
    against FP64 (solid, a running mean over 1 % of the tokens) and the chunked op's at the same tokens (dashed).
    Right: the carried state's errors at the checkpoints (SSM state solid, k dotted, the angle mod 2π dashed),
    log-log."""
    fig = Figure(figsize=(15, 5), layout="constrained")
    left, right = fig.subplots(1, 2)
    window = max(1, study["tokens"] // 100)
    for i, (label, record) in enumerate(study["results"].items()):
        color = f"C{i}"
        for key, style, suffix in (("out", "-", "decode"), ("chunked", "--", "chunked op")):
            if not record[key]:
                continue
            smooth = np.convolve(np.asarray(record[key], dtype=float), np.ones(window) / window, mode="valid")
            left.plot(np.arange(window - 1, window - 1 + len(smooth)), smooth, style, color=color,
                      label=f"{label}, {suffix}", linewidth=1.2)
        marks = sorted(record["state"], key=int)
        steps = [int(t) + 1 for t in marks]
        for key, style in (("ssm", "-"), ("k", ":"), ("angle", "--")):
            right.plot(steps, [record["state"][t][key] for t in marks], style, color=color, marker=".",
                       label=f"{label}: {key}")
    left.set_yscale("log")
    left.set_xlabel(f"decoded token (after a prefill of {study['prefill']})")
    left.set_ylabel("Out rel RMS vs FP64 (running mean)")
    left.legend(fontsize=7)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("decoded tokens")
    right.set_ylabel("state rel RMS vs FP64")
    _legend_outside(right, fontsize=7)
    _figure_title(fig, title or f"Decode drift: {study['spec']}", fontsize=9)
    return fig


def is_png(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a non-empty PNG file (signature check)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size <= 8:
        return False
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89PNG\r\n\x1a\n"


def png_size(path: Union[str, Path]) -> Tuple[int, int]:
    """``(width, height)`` of a PNG from its IHDR chunk."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
