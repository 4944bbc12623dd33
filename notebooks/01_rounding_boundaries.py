# Source of 01_rounding_boundaries.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 01 · Rounding boundaries: where error enters `mamba_mimo_bwd_fwd`, and how it grows
#
# **Question.** Stage by stage, how far from the FP64 baseline are FP32 math, BF16 with the NPU port's semantics
# (`seed_bf16`), BF16 with upstream Hopper semantics (`upstream_sm90`) and the device result? At which stage does
# the BF16 error enter, where do the two BF16 semantics part ways, and does the error grow along the sequence?
#
# **Case.** The golden case `seed_branch_ro1_z1_d1` (B=1, S=32, H=1, N=P=64, R=4, C=16; reduced DOUT, Z and D: every
# branch on). Set `MIMO_CASE` to another golden case name, or `MIMO_BUNDLE=<dir>[::case]` to a result bundle
# (`mimo_numerics.bundles`, e.g. an NPU run), before starting the kernel. The last section uses a longer realistic
# case (`sweep:0`, S=256) for the growth along the sequence.
#
# **Presets.** `fp64` is the baseline (the reference with nothing rounded, in float64, recording every stage);
# `fp32`, `seed_bf16`, `upstream_sm90`. **Device:** the real upstream kernel's outputs on an H200 (golden data), the
# bundle's outputs when one is given, or, for a case without device data, the Triton kernels under `seed_bf16`
# labelled *emulation* (the reference under `seed_bf16` where the kernels are not installed). A device gives only
# outputs, so it appears at the output stages (`out:…`) only.

# %%
# %matplotlib inline
import os

from IPython.display import Markdown, display

from mimo_numerics import drift, plots, report

CASE = os.environ.get("MIMO_BUNDLE") or os.environ.get("MIMO_CASE", report.DEFAULT_CASE)
case = report.resolve_case(CASE)
print(case.description)

# %%
runs = drift.standard_runs(case.inputs, ("fp32", "seed_bf16", "upstream_sm90"), device_outputs=case.device_outputs,
                           device_label=case.device_label or "device")
list(runs)

# %% [markdown]
# ## Error by stage against FP64
#
# Relative RMS error of every recorded stage (pipeline order of `docs/semantics.md`) and of the five outputs. FP32
# math stays near 1e-7 until the lp output stores (`out:states`, `out:dz`, `out:qk_dot`) round it; the BF16 policies
# enter at ~1e-3 at the very first rounded stage (`q_biased`) and stay there. The dip at `gate` is real: the SiLU
# gate is computed from `z` and `ζ` in FP32 and is never rounded.

# %%
table = drift.stage_drift(runs, "fp64")
plots.plot_stage_drift(table, title=f"Error by stage vs fp64: {case.name}")

# %%
display(Markdown(table.to_markdown()))

# %% [markdown]
# Max error in BF16 ULPs at each element (large where the FP64 value is close to zero, where one BF16 ULP is tiny):

# %%
plots.plot_stage_drift(table, metric="max_ulp", title="Max element error in bf16 ULPs vs fp64")

# %% [markdown]
# ## Where `seed_bf16` and the device part ways with `upstream_sm90`
#
# The same comparison against `upstream_sm90` instead of FP64: the first stage where a run departs is where its
# rounding semantics differ (`seed_bf16`: the diagonal rank sum `diag_accum`, rounded product then sum, and the state
# GEMM's FP32 summation order in `state`).

# %%
vs_upstream = drift.stage_drift({label: run for label, run in runs.items() if label not in ("fp64", "fp32")},
                                "upstream_sm90")
{label: vs_upstream.entry_stage(label) for label in vs_upstream.labels()}

# %%
plots.plot_stage_drift(vs_upstream, title="Error by stage vs upstream_sm90")

# %% [markdown]
# ## Along the sequence
#
# Per-token relative RMS error of a few stages against FP64.

# %%
per_token = drift.sequence_drift(runs, "fp64", case.inputs["chunk_size"], per="token")
plots.plot_sequence_drift(per_token, ["k_scaled", "out", "output.dz"], title=f"Error per token: {case.name}")

# %% [markdown]
# A longer realistic case (`sweep:0`: B=2, S=256, H=2, R=4, C=16, decays from one `dA`), per chunk: the state is
# carried from chunk to chunk in FP32, so its error is the sum of the chunks' roundings seen through the decay.

# %%
long_case = report.resolve_case("sweep:0")
long_runs = drift.standard_runs(long_case.inputs, ("fp32", "seed_bf16", "upstream_sm90"), emulation_policy=None)
per_chunk = drift.sequence_drift(long_runs, "fp64", long_case.inputs["chunk_size"], per="chunk")
plots.plot_sequence_drift(per_chunk, ["state", "out", "output.dz"], title=f"Error per chunk: {long_case.name}")

# %%
{label: round(per_chunk.growth(label, "state"), 2) for label in per_chunk.values}
