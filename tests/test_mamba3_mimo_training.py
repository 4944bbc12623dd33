"""Smoke test of training one Mamba-3 MIMO layer under a policy (``mimo_numerics/ops/mamba3_mimo/training.py``):
a few steps at tiny sizes, the outputs written, and the checks that need no long run."""

import json
import math

import pytest
import torch

from mimo_numerics.ops.mamba3_mimo import training
from mimo_numerics.policy import PolicyUndefined

TINY_LAYER = training.LayerConfig(d_model=8, d_out=4, heads=2, state_dim=16, value_dim=8, rank=2, chunk_size=8)
TINY_TASK = training.TaskConfig(batch=2, seqlen=16, channels=4)


def test_fp64_policy_gradients_equal_the_fp64_layer_but_for_the_bf16_gradient_stores():
    """Under fp64 the op is exact; its bf16 inputs' gradients are stored in bf16 (autograd's dtype contract), which
    only the input projection sees. Every other parameter matches the independent FP64 layer to FP32 level."""
    params = training.init_params(TINY_LAYER, seed=3)
    x, y = training.make_batch(TINY_LAYER, TINY_TASK, training.teacher(TINY_LAYER, TINY_TASK, 3), 3, step=0)
    loss, grads, values = training.policy_step(params, x, y, TINY_LAYER, "fp64")
    loss64, grads64 = training.fp64_step(params, x, y, TINY_LAYER, op_values=values)
    assert math.isclose(loss, loss64, rel_tol=1e-5)
    for name in training.PARAM_NAMES:
        err = float(torch.linalg.norm(grads[name].double() - grads64[name]) / torch.linalg.norm(grads64[name]))
        if name == "in_proj":
            # one bf16 store per activation gradient element: structural, RN to bf16 errs by <= 2^-9 relative
            assert 1e-6 < err < 2 ** -8, name
        else:
            assert err < 1e-5, name  # float32 projections only


def test_train_demo_smoke(tmp_path):
    policies = ("fp64", "upstream_sm90", "upstream_sm90 - mamba_mimo_bwd_bwd.dphio_gate")
    result = training.train_demo(tmp_path, steps=3, seeds=(0,), policies=policies, lr=1e-2)
    names = {p.split("/")[-1] for p in result["files"]}
    assert names == {"results.json", "loss.png", "grad_error.png", "grad_error_per_param.png", "README.md"}
    data = json.loads((tmp_path / "results.json").read_text())
    runs = data["runs"]
    assert set(runs) == {"fp64", "upstream_sm90", "upstream_sm90 - mamba_mimo_bwd_bwd.dphio_gate"}
    for label, by_seed in runs.items():
        run = by_seed["0"]
        assert len(run["loss"]) == 3 and len(run["grad_rel_rms_all"]) == 3
        assert all(math.isfinite(v) and v > 0 for v in run["grad_rel_rms_all"]), label
        assert set(run["grad_rel_rms"]) == set(training.PARAM_NAMES)
    # every policy starts from the same weights on the same batch: the first losses agree to the op's rounding
    first = [by_seed["0"]["loss"][0] for by_seed in runs.values()]
    assert max(first) / min(first) < 1.01
    # upstream_sm90's gradient is further from FP64 than fp64's (bf16 stores only) on the parameters after the
    # projections
    first_error = {label: by_seed["0"]["grad_rel_rms"]["MIMO_V"][0] for label, by_seed in runs.items()}
    assert first_error["upstream_sm90"] > 100 * first_error["fp64"]
    assert "## Reading" in (tmp_path / "README.md").read_text()


def test_policy_labels():
    policy = training.policy_from_label("upstream_sm90 - mamba_mimo_bwd_bwd.dphio_gate")
    assert policy.section("mamba_mimo_bwd_bwd").dphio_gate is False
    assert policy.section("mamba_mimo_bwd_bwd").dphio is True
    with pytest.raises(ValueError, match="unknown site"):
        training.policy_from_label("upstream_sm90 - mamba_mimo_bwd_bwd.nope")
    with pytest.raises(PolicyUndefined):
        training.train(TINY_LAYER, TINY_TASK, "seed_bf16", 0, 1)
