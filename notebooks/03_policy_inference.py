# Source of 03_policy_inference.ipynb (jupytext percent format); rebuild with scripts/build_notebooks.py.

# %% [markdown]
# # 03 · Policy inference: which rounding policy produced these outputs?
#
# **Question.** Given only a device's inputs and outputs, which `RoundingPolicy` reproduces them best, how far is
# it, and how much worse is each of its single-field neighbours? First on policies we know (synthetic outputs made
# by the reference, recovered exactly), then on the real H200 outputs.
#
# **Case.** Synthetic: a tiny realistic case with every branch on (S=40, N=P=16, R=2, C=16). Device: the golden
# case `seed_branch_ro1_z1_d1` (every branch on) and the three other golden cases with Z; set `MIMO_CASE` to a
# golden case name or `MIMO_BUNDLE=<dir>[::case]` to a result bundle to use that instead.
#
# **Presets.** The search starts from `seed_bf16` (the NPU port's policy); the answer expected for the H200 is
# `upstream_sm90` (`diag_mode="fma"`). Distance: `mimo_numerics.inference` (lp outputs: 10 × mismatch fraction;
# every output: relative RMS in units of the bf16 unit roundoff).

# %%
# %matplotlib inline
import os

import torch
from IPython.display import Markdown, display

from mimo_numerics import cases, golden, inference, plots, report

# %% [markdown]
# ## Synthetic check: a random policy is recovered
#
# Outputs made by the reference under a random policy; the search must reproduce them bit for bit and agree with the
# policy on every *identifiable* field (a field is identifiable when changing it changes some output bit).

# %%
tiny = cases.make_inputs(cases.CaseSpec(formula="realistic", seqlen=40, state_dim=16, value_dim=16, rank=2,
                                        chunk_size=16, has_z=True, has_d=True))
secret = inference.random_policy(torch.Generator().manual_seed(2026))
found = inference.infer_policy(tiny, inference.run_reference(tiny, secret), start="seed_bf16")
inference.compare_to_truth(tiny, secret, found)

# %% [markdown]
# ## The H200 outputs

# %%
if os.environ.get("MIMO_BUNDLE") or os.environ.get("MIMO_CASE"):
    chosen = [report.resolve_case(os.environ.get("MIMO_BUNDLE") or os.environ["MIMO_CASE"])]
else:
    chosen = [report.resolve_case(name) for name in
              (golden.DEFAULT_CASE, "seed_branch_ro0_z1_d0", "seed_tail_chunk", "seed_gqa")]
print([c.name for c in chosen])
result = inference.infer_policy([c.inputs for c in chosen], [c.device_outputs for c in chosen], start="seed_bf16")
display(Markdown(result.to_markdown()))

# %%
plots.plot_inference(result, extra={f"start: {result.start.name}": result.start_distance})

# %% [markdown]
# The search trace (accepted moves) and the distance's parts for the recovered policy:

# %%
[step.to_dict() for step in result.trace]

# %%
result.evaluation.to_dict()
