# Source of 02_policy_swapping.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 02 · Policy swapping: toggle rounding sites and knobs, watch the outputs move
#
# **Question.** Starting from `upstream_sm90`, how do the five outputs move when one rounding site is switched off
# or one knob changed, both against the FP64 baseline and against the real H200 outputs? Which sites matter most
# (one-on / one-off sensitivity ranking), and which field explains the gap between `seed_bf16` and
# `upstream_sm90`?
#
# **Case.** The golden case `seed_branch_ro1_z1_d1` (B=1, S=32, H=1, N=P=64, R=4, C=16; every branch on); set
# `MIMO_CASE` to another golden case name before starting the kernel.
#
# **Presets.** `upstream_sm90` (varied), `seed_bf16`, `fp32`; baseline `fp64`; device: the upstream kernel's
# H200 outputs.

# %%
# %matplotlib inline
import os

from IPython.display import Markdown, display

from mimo_numerics import golden, plots, presets, sensitivity

CASE = os.environ.get("MIMO_CASE", golden.DEFAULT_CASE)
inputs, upstream = golden.golden_case(CASE)
base = presets.get("upstream_sm90")
variants = {
    "upstream_sm90": base,
    "diag_mode=mul_then_add": base.replace(diag_mode="mul_then_add"),
    "diag_accum off": base.replace(diag_accum=False),
    "state_operand off": base.replace(state_operand=False),
    "out off": base.replace(out=False),
    "silu_form=sigmoid": base.replace(silu_form="sigmoid"),
    "seed_bf16": presets.get("seed_bf16"),
    "fp32": presets.get("fp32"),
}

# %% [markdown]
# ## Outputs against FP64
#
# Switching a site off removes its rounding: the error against FP64 drops a little; the output stores of `states`,
# `dz` and `qk_dot` still round, so `fp32` keeps ~1.6e-3 there.

# %%
errors = sensitivity.output_errors(inputs, variants, "fp64")
plots.plot_output_errors(errors, baseline="fp64", title=f"Output error vs fp64 ({CASE})")

# %% [markdown]
# ## Outputs against the device (H200)
#
# Against the real upstream outputs, `upstream_sm90` reproduces `states`, `dz` and `qk_dot` exactly (hatched bars
# are 0) and the FP32 projections `dmimo_o`, `dmimo_z` to ~1e-6; every toggle moves it away.

# %%
against_device = sensitivity.output_errors(inputs, variants, upstream)
plots.plot_output_errors(against_device, baseline="H200 upstream", title=f"Output error vs the H200 ({CASE})")

# %% [markdown]
# ## Sensitivity ranking of `upstream_sm90`
#
# One-on: only this site rounded (every other switch off, same knobs); one-off: every site but this one. The score
# is the fraction of the policy's error the site adds on its own, averaged over the outputs.

# %%
table = sensitivity.rank_sites(inputs, "upstream_sm90", "fp64", progress=False)
plots.plot_sensitivity(table)

# %%
plots.plot_sensitivity(table, output="dz")

# %%
display(Markdown(table.to_markdown()))

# %% [markdown]
# ## What separates `seed_bf16` from `upstream_sm90` on the device data
#
# Each field where the two differ is moved alone from `seed_bf16` to its `upstream_sm90` value; the bar is the
# fraction of `seed_bf16`'s distance to the H200 outputs that this closes.

# %%
gap = sensitivity.attribute_gap(inputs, "seed_bf16", "upstream_sm90", target=upstream)
plots.plot_gap_attribution(gap)

# %%
display(Markdown(gap.to_markdown()))
