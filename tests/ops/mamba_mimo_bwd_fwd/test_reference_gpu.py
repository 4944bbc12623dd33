"""The reference on CUDA (skipped without a GPU): CUDA-graph replay of the state recurrence gives the eager bits."""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops._common import recurrence
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SPEC = CaseSpec(batch=2, seqlen=1100, heads=2, groups=1, state_dim=32, value_dim=32, rank=4, chunk_size=16,
                reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=8)


@pytest.mark.parametrize("policy", ["upstream_sm90", "seed_bf16"])
def test_reference_cuda_graph_recurrence_is_bit_identical_to_the_eager_loop(policy, monkeypatch):
    inputs = make_inputs(SPEC, device="cuda")
    assert SPEC.seqlen // SPEC.chunk_size >= recurrence.CUDA_GRAPH_MIN_CHUNKS
    graph = stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)
    again = stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)  # replay
    monkeypatch.setattr(recurrence, "USE_CUDA_GRAPHS", False)
    eager = stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)
    for a, b, c in zip(graph, again, eager):
        if a is not None:
            assert torch.equal(a, c) and torch.equal(b, c)


def test_reference_cuda_matches_cpu_within_fp32_order_noise():
    inputs = make_inputs(SPEC)
    cpu = stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy="upstream_sm90")
    cuda_inputs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = stage1_reference.mamba_mimo_bwd_fwd(*as_args(cuda_inputs), **as_kwargs(cuda_inputs), policy="upstream_sm90")
    for a, b in zip(cpu, gpu):
        if a is not None:
            assert mn.metrics.rel_rms(b.cpu(), a) <= mn.tolerances.get("same_policy_rel_rms")
