# Source of 06_decode.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 06 · Decoding: which roundings the step has, does a port reproduce them, and does the error grow with length
#
# **Question.** After a prefill (`mamba3_mimo(..., return_state=True)`), upstream decodes token by token with two
# kernels: a Triton rotary step and a CuTe state update (`Mamba3.step`). Which of their roundings cause the decode's
# error, does the package's step reproduce upstream's rotary kernel bit for bit, and does the error grow as the
# decode goes on?
#
# **Case.** A realistic head (N = 128, P = 64, R = 4, H = 4 heads sharing one group, C = 64, bf16, Z and D on): a
# prefill of 256 tokens, then 512 decoded, against FP64 (`mimo_numerics.studies.decode_drift`); and the five cases
# of upstream's rotary kernel run on an NVIDIA H200 (`tests/data/upstream_h200_decode_rotary_cases.pt`).
#
# **Presets.** `fp64` is the truth (the FP64 prefill and step). `upstream_sm90` rounds as the H200 does: the step
# has three lp sites, the stores of the rotated q, the rotated k (the next token's `k_state`) and the output, all
# switched by `round_outputs`. `fp32` differs from it in the step only in FP32-level knobs; the chunked op it
# prefills with keeps k in FP32. `special_functions="fast_sm90"` adds the H200's fast special functions.

# %%
# %matplotlib inline
from IPython.display import Image, Markdown, display

import mimo_numerics as mn
from mimo_numerics import golden_data, plots
from mimo_numerics.ops.mamba3_mimo import decode_cases
from mimo_numerics.studies import decode_drift

spec = decode_drift.default_spec(prefill=256, tokens=512)
print(spec.case_id)

# %% [markdown]
# ## The decode against FP64, and the chunked op at the same tokens
#
# Four decodes from the same prefill state: `fp32`, `upstream_sm90`, `upstream_sm90` with every FP32-level model,
# and `upstream_sm90` without the step's three lp stores. The dashed lines are the chunked op under the same policy
# over every token, at the decoded tokens. A minute or so on a CPU.

# %%
study = decode_drift.run(spec, prefill=256, progress=False)
plots.plot_decode_drift(study)

# %% [markdown]
# Means over the first and the last tenth of the decoded tokens, and the carried state at the first and last
# checkpoints. The decode's output error is set by its lp stores: without them it falls by two orders of magnitude
# once the prefill's error has decayed out of the state. The chunked op under `upstream_sm90` is further from FP64
# than the decode: its kernels round many more operands.

# %%
rows = decode_drift.reading(study)
display(Markdown("| policy | decode, first | decode, last | chunked, last | state, last | k, last | angle, last |\n"
                 "|---|---|---|---|---|---|---|\n" + "\n".join(
                     f"| {label} | {r['decode_first']:.2e} | {r['decode_last']:.2e} | {r['chunked_last']:.2e} | "
                     f"{r['ssm_last']:.2e} | {r['k_last']:.2e} | {r['angle_last']:.2e} |" for label, r in rows.items())))

# %% [markdown]
# ## Does the package's step reproduce upstream's rotary kernel?
#
# The rotary kernel's golden data: each case's steps rerun from the stored inputs, fed back as upstream fed them.
# The fraction of bit-identical elements of the rotated q, k (lp) and of the FP32 angle state. With
# `special_functions="fast_sm90"` the sigmoid is the H200's (MUFU.EX2 and `div.full.f32`, read from the kernel's
# SASS) and every angle state is upstream's, the 256-step chain included.

# %%
cases = golden_data.load("decode_rotary")
table = []
for name, case in cases.items():
    preset = mn.presets.get("upstream_sm90" if case["fields"]["dtype"] == "bfloat16" else "upstream_sm90_fp16")
    for label, policy in (("preset", preset), ("fast_sm90", preset.replace(special_functions="fast_sm90"))):
        got = decode_cases.run_rotary_case(case, policy)
        same = {key: (got[key] == case["upstream"][key]).double().mean().item()
                for key in ("q_out", "k_out", "angle_state")}
        table.append(f"| {name} | {label} | {same['q_out']:.5f} | {same['k_out']:.5f} | {same['angle_state']:.5f} |")
display(Markdown("| case | policy | q bits | k bits | angle bits |\n|---|---|---|---|---|\n" + "\n".join(table)))

# %% [markdown]
# ## Long decodes
#
# Upstream's step keeps the angle sum unreduced in FP32, so the angle's error grows with its magnitude, and the
# carried state (in rotated coordinates) inherits it. The output does not: q and k share the angle, and the error
# cancels in their product. Over 32768 decoded tokens (`reports/decode_drift_long`, `scripts/measure_decode_drift.py`):

# %%
display(Image(filename="../reports/decode_drift_long/decode_drift.png", width=1000))
