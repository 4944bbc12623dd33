# Source of 04_forward_and_stage_two.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 04 · The forward and backward stage 2: where error enters, site by site
#
# **Question.** Notebook 01 follows the error of backward stage 1 through its stages. Do the forward kernel
# (`mamba_mimo_fwd`) and backward stage 2 (`mamba_mimo_bwd_bwd`) behave the same way: at which stage, rounded by
# which site, does the BF16 error enter, does the real H200 output agree with `upstream_sm90`, and does turning one
# site off change its own stage first?
#
# **Case.** Each operator's default report case: the first whole-op golden case with every branch on,
# `g_B1_S64_H2_N64_P64_R4_C16_zdo` (B=1, S=64, H=2, N=P=64, R=4, C=16; MIMO_O, Z and D given); stage 2 gets
# upstream's own stage-1 `states` and `qk_dot` from the golden data. The device result is the real upstream op on an
# H200 (`tests/data/upstream_h200_full_op_cases.pt`).
#
# **Presets.** `fp64` is the baseline (the reference with nothing rounded, in float64, recording every stage);
# `fp32` and `upstream_sm90`. `seed_bf16` (the NPU port's stage-1 policy) defines neither operator, so there is no
# emulated device here. Everything below comes from the operators' specs (`mimo_numerics.operator`): stage order,
# shapes, sequence axes and the rounding site of each stage.

# %%
# %matplotlib inline
from IPython.display import Markdown, display

from mimo_numerics import drift, operator, plots, presets, report
from mimo_numerics.policy import write_fields

FWD, STAGE2 = "mamba_mimo_fwd", "mamba_mimo_bwd_bwd"
fwd_case = report.resolve_case(report.default_case(FWD), FWD)
print(fwd_case.description)

# %% [markdown]
# ## The forward's stages and sites
#
# The pipeline of the forward, as its spec states it: every stage the reference records, its shape, the switch that
# rounds it (`–`: computed in FP32 only) and the axis that runs along the sequence.

# %%
display(Markdown(drift.describe_stages(FWD)))

# %% [markdown]
# ## The forward: error by stage against FP64
#
# Each tick names the stage and, in brackets, the site that rounds it. FP32 math stays near 1e-7 until the output
# store rounds `o`; under `upstream_sm90` the error is at the BF16 level from the first stage on (`gamma` reads the
# rounded `dt`: site `dt_input`). The device gives only `o`.

# %%
fwd_runs = drift.standard_runs(fwd_case.inputs, ("fp32", "upstream_sm90"), device_outputs=fwd_case.device_outputs,
                               device_label=fwd_case.device_label, op=FWD)
fwd_table = drift.stage_drift(fwd_runs, "fp64", op=FWD)
plots.plot_stage_drift(fwd_table, sites=True, title=f"Forward, error by stage vs fp64: {fwd_case.name}")

# %%
display(Markdown(fwd_table.to_markdown()))

# %% [markdown]
# Against `upstream_sm90` instead, the H200 output is ~1e-4 away (FP32-level differences that flip a few BF16
# roundings), while `fp32` is at the BF16 level from the first stage on:

# %%
display(Markdown(drift.stage_drift({label: run for label, run in fwd_runs.items() if label != "fp64"},
                                   "upstream_sm90", op=FWD).to_markdown()))

# %% [markdown]
# Per chunk along the sequence: the state starts at exactly 0 (chunk 0) and carries the error of the earlier chunks.

# %%
fwd_chunks = drift.sequence_drift(fwd_runs, "fp64", fwd_case.inputs["chunk_size"], per="chunk", op=FWD)
plots.plot_sequence_drift(fwd_chunks, drift.sequence_stages(FWD, "chunk"), title="Forward, error per chunk")

# %% [markdown]
# ## Each forward site changes its own stage first
#
# One site of `upstream_sm90` switched off at a time: the first stage (pipeline order) that departs from
# `upstream_sm90` is the first stage that site rounds. This is the check behind the `site` column above
# (`tests/test_drift.py` runs it on every operator). Sites that round weights (`phi_weight`, `psi_weight`,
# `qk_bias`, `dt_input`) have no stage of their own and are left out. To stay fast this runs on the first `smoke`
# case (S=16, N=P=16, R=2, C=8, every branch on) instead of the golden one.

# %%
small = operator.get(FWD).draw(operator.get(FWD).cases("smoke")[0])
small_base = drift.reference_run(small, "upstream_sm90", FWD)
fwd_sites = {s.site: s.name for s in reversed(operator.get(FWD).stages) if s.site}  # site -> first stage it rounds
fwd_entry = {site: drift.stage_drift(
    {"off": drift.reference_run(small, write_fields(presets.get("upstream_sm90"), FWD, **{site: False}), FWD)},
    small_base, op=FWD).entry_stage("off") for site in fwd_sites}
display(Markdown("| site off | its first stage | first stage departing |\n|---|---|---|\n" + "\n".join(
    f"| `{site}` | `{fwd_sites[site]}` | `{fwd_entry[site]}` |" for site in reversed(fwd_sites))))

# %% [markdown]
# ## Stage 2: error by stage against FP64
#
# Stage 2 records 35 stages (per token, per chunk, and the `L × L` score blocks of each chunk) and returns twelve raw
# outputs: the lp gradients `dq`, `dk`, `dv` and nine FP32 outputs. FP32 math keeps every stage and FP32 output
# below ~4e-7; the lp stores of `dq`, `dk`, `dv` round FP32 math to the BF16 level.

# %%
s2_case = report.resolve_case(report.default_case(STAGE2), STAGE2)
s2_runs = drift.standard_runs(s2_case.inputs, ("fp32", "upstream_sm90"), device_outputs=s2_case.device_outputs,
                              device_label=s2_case.device_label, op=STAGE2)
s2_table = drift.stage_drift(s2_runs, "fp64", op=STAGE2)
plots.plot_stage_drift(s2_table, sites=True, title=f"Stage 2, error by stage vs fp64: {s2_case.name}")

# %% [markdown]
# The H200 outputs against `upstream_sm90` and against `fp32`, per output (relative RMS). `dD` is a sum whose
# terms cancel, so its relative error is about ten times that of the other outputs for every run.

# %%
s2_vs_device = drift.stage_drift(s2_runs, s2_case.device_label, op=STAGE2)
display(Markdown(s2_vs_device.to_markdown()))

# %% [markdown]
# Per chunk: the state gradient `dstates` runs backwards, from exactly 0 after the last chunk.

# %%
s2_chunks = drift.sequence_drift(s2_runs, "fp64", s2_case.inputs["chunk_size"], per="chunk", op=STAGE2)
plots.plot_sequence_drift(s2_chunks, drift.sequence_stages(STAGE2, "chunk"), title="Stage 2, error per chunk")

# %% [markdown]
# ## Stage 2's sites, each switched off
#
# The same check as for the forward, on the same small case. One site departs earlier than its own stage:
# `gamma_diag` rounds γ into `gamma_lp`, which the reference records right after its consumer `dpsiv_accum`, so
# `dpsiv_accum` departs first.

# %%
small2 = operator.get(STAGE2).draw(operator.get(STAGE2).cases("smoke")[0])
small2_base = drift.reference_run(small2, "upstream_sm90", STAGE2)
s2_sites = {s.site: s.name for s in reversed(operator.get(STAGE2).stages) if s.site}
s2_entry = {site: drift.stage_drift(
    {"off": drift.reference_run(small2, write_fields(presets.get("upstream_sm90"), STAGE2, **{site: False}), STAGE2)},
    small2_base, op=STAGE2).entry_stage("off") for site in s2_sites}
display(Markdown("| site off | its first stage | first stage departing |\n|---|---|---|\n" + "\n".join(
    f"| `{site}` | `{s2_sites[site]}` | `{s2_entry[site]}` |" for site in reversed(s2_sites))))
