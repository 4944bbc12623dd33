"""The whole op on CUDA (skipped without a GPU): replaying the ordered walks from CUDA graphs gives the eager bits.

``ops/_common/cuda_graph.replayed`` captures the state recurrences, the angle walk, the carried chunk sums and the
epilogue's sequential sums and scans; switched off, every one of their kernels is launched from Python. Out and
every gradient must be equal bit for bit, for a first call (capture), a second (replay) and the eager run.
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics.ops._common import cuda_graph, recurrence
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: 72 chunks (>= recurrence.CUDA_GRAPH_MIN_CHUNKS; the backward needs S a multiple of C), bf16 and fp16.
SPEC = OpCaseSpec(batch=2, seqlen=1152, heads=2, state_dim=32, value_dim=32, rank=4, chunk_size=16)


def _run(raw, policy):
    leaves = [None if raw[n] is None else raw[n].cuda().requires_grad_() for n in OP_INPUT_NAMES]
    out = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                         policy=policy)
    out.backward(raw["dout"].cuda().to(out.dtype))
    return [out.detach()] + [None if leaf is None else leaf.grad for leaf in leaves]


@pytest.mark.parametrize("policy,dtype", [("upstream_sm90", "bfloat16"), ("fp32", "bfloat16"),
                                          ("upstream_sm90_fp16", "float16")])
def test_whole_op_graph_replay_is_bit_identical_to_eager_launches(policy, dtype, monkeypatch):
    raw = make_op_inputs(SPEC.replace(dtype=dtype))
    assert SPEC.seqlen // SPEC.chunk_size >= recurrence.CUDA_GRAPH_MIN_CHUNKS
    captured, replay = _run(raw, policy), _run(raw, policy)
    monkeypatch.setattr(cuda_graph, "USE_CUDA_GRAPHS", False)
    monkeypatch.setattr(recurrence, "USE_CUDA_GRAPHS", False)
    eager = _run(raw, policy)
    names = ["Out"] + ["d" + n for n in OP_INPUT_NAMES]
    for name, a, b, c in zip(names, captured, replay, eager):
        if c is None:
            continue
        assert torch.equal(a, c), f"{name}: the captured call differs from the eager launches"
        assert torch.equal(b, c), f"{name}: the replayed call differs from the eager launches"
