# Source of 05_whole_op.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 05 · The whole op: how wrong are the gradients, and which roundings make them wrong
#
# **Question.** A training step calls the whole op: preprocessing, the forward kernel, backward stage 1, backward
# stage 2 and the FP32 epilogue. Under BF16 upstream rounding (`upstream_sm90`), how far are `Out` and the 14
# gradients from FP64, does the package's chain reproduce the real upstream op, where along the chain does the error
# enter, and which rounding sites cause each gradient's error?
#
# **Case.** The whole op's first golden case with every branch on, `g_B1_S64_H2_N64_P64_R4_C16_zdo` (B=1, S=64, H=2,
# G=1, N=P=64, R=4, C=16; MIMO_Out, Z and D given; bfloat16). The device result is the real upstream op
# (`mamba3_mimo` with its TileLang kernels) on an NVIDIA H200, forward and autograd backward
# (`tests/data/upstream_h200_full_op_cases.pt`). The package's op runs from the raw inputs, with no recorded
# intermediate of upstream.
#
# **Presets.** `fp64` is the baseline (the FP64 oracles of every step, nothing rounded); `fp32` (FP32 math, lp only
# at the stores of the kernels' outputs) and `upstream_sm90` (the H200's rounding, verified against SASS). The
# same policy object sets all three kernels and the epilogue. `seed_bf16` defines stage 1 only, so it cannot run
# the whole op. `mimo-numerics report --op mamba3_mimo` writes everything below as a report.

# %%
# %matplotlib inline
from IPython.display import Image, Markdown, display

from mimo_numerics import drift, plots, sensitivity
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import runs
from mimo_numerics.studies import report as op_report

case = op_report.resolve_case(op_report.DEFAULT_CASE)
print(case.description)

# %% [markdown]
# ## Out and the 14 gradients against FP64
#
# One forward and one `backward(dout)` per policy. Under `fp32` most gradients are at the 1e-3 level: the kernels
# store `o`, `dq`, `dk`, `dv`, ... in BF16 even with FP32 math inside. `upstream_sm90` adds the rounding of the
# kernels' operands and intermediates, and the real H200 op lands on the same errors.

# %%
op_runs = {"fp64": runs.fp64_run(case.inputs)}
op_runs.update({name: runs.policy_run(case.inputs, name) for name in ("fp32", "upstream_sm90")})
op_runs[op_report.UPSTREAM_LABEL] = case.upstream
errors = {label: sensitivity.run_errors(run, op_runs["fp64"]) for label, run in op_runs.items() if label != "fp64"}
plots.plot_output_errors(errors, "fp64", ax=op_report.wide_axes(), title="Out and the gradients: error vs fp64")

# %% [markdown]
# Each policy against the real upstream op (relative RMS). `upstream_sm90` is several times closer to the H200 than
# `fp32` on every output: the remaining gap is FP32 summation order (the GPU's MMA against the CPU's BLAS), which
# flips a few BF16 roundings and carries them down the chain. `dD` is a sum whose terms cancel, so its relative
# error is large for every run.

# %%
upstream_outputs = runs.op_outputs(case.upstream)
agreement = {label: {o: rel_rms(got, upstream_outputs[o]) for o, got in runs.op_outputs(op_runs[label]).items()
                     if got is not None and upstream_outputs[o] is not None} for label in ("fp32", "upstream_sm90")}
display(Markdown("| output | `fp32` vs H200 | `upstream_sm90` vs H200 | ratio |\n|---|---|---|---|\n" + "\n".join(
    f"| `{o}` | {agreement['fp32'][o]:.3g} | {agreement['upstream_sm90'][o]:.3g} | "
    f"{agreement['fp32'][o] / agreement['upstream_sm90'][o]:.1f} |" for o in agreement["upstream_sm90"])))

# %% [markdown]
# ## Where along the chain the error enters
#
# Every recorded stage of the chain in chain order, one band per step: the preprocessing (FP32 scans, ~1e-7), the
# forward's stages, stage 1 (which recomputes the forward's state from the inputs, so it starts again near FP32
# level under `fp32` and at the BF16 level under `upstream_sm90`), stage 2 and the epilogue. The fp64 run's internal
# stages come from each operator's reference under `fp64` on the fp64 chain's own float64 tensors. The H200 gives
# each step's outputs only (the triangles).

# %%
chain_table = drift.stage_drift(op_runs, "fp64", "bfloat16", op=op_report.OP_NAME)
plots.plot_stage_drift(chain_table, groups=drift.stage_groups(chain_table.stages(), op_report.OP_NAME),
                       stage_width=0.17, title=f"mamba3_mimo: error of every stage vs the fp64 run ({case.name})")

# %% [markdown]
# ## Which roundings cause each gradient's error
#
# One switch of `upstream_sm90` off at a time (every site of the three kernels that the preset has on, and every
# other value of each knob), the whole op rerun from the raw inputs (`sensitivity.rank_sites` with
# `op="mamba3_mimo"`, the whole op as a composite operator). A cell is the quadrature share of that output's error
# the rounding accounts for, `sqrt(policy² − off²) / policy` (a share of 0.2 is a drop of the error by only 2 %);
# the score (rows, best first) is its mean over the gradients; the table below also gives each drop.
# Forward sites change `Out` only: the backward recomputes what it needs in stage 1 and reads no forward output.
# About 80 runs of the op, a few seconds.

# %%
site_ranking = sensitivity.rank_sites([case.inputs], "upstream_sm90", [op_runs["fp64"]], op=op_report.OP_NAME,
                                      progress=False, names=[case.name])
heat = {r.label: {o: site_ranking.fraction(r, o) for o in site_ranking.outputs} for r in site_ranking.ranked()[:20]}
plots.plot_score_matrix(heat, site_ranking.outputs, vmax=1.0, ylabel="rounding turned off",
                        colorbar="quadrature share of the error",
                        title="Quadrature share of each output's error, one rounding off")

# %%
display(Markdown(site_ranking.top_markdown()))

# %% [markdown]
# The shares do not add up to one: the roundings interact, and an output's error is the combined effect of many
# sites of stage 1 and stage 2. `reports/mamba3_mimo_site_ranking.md` has the same ranking averaged over every
# whole-op golden case.
#
# ## Does it matter for training?
#
# `mimo-numerics train-demo` trains a real layer around `mn.mamba3_mimo` from the same initial weights under `fp64`,
# `fp32`, `upstream_sm90` and `upstream_sm90` with a high-ranked site off, and records each gradient's error
# against the FP64 gradients of the same weights at every step (`reports/training_under_policy/`, with a reading of
# what the curves can and cannot show):

# %%
display(Image(filename="../reports/training_under_policy/loss.png", width=900))
display(Image(filename="../reports/training_under_policy/grad_error.png", width=900))
