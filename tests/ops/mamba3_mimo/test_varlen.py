"""``mamba3_mimo(..., cu_seqlens=...)``: packed sequences of any length (tails, a one-token sequence).

The truth is the FP64 model run on each sequence alone and differentiated by autograd; the float32 chains are
checked against the same policy run on each sequence alone (the packing must change no real token), and the
Triton kernels against the reference on a varlen batch. Tolerances: ``mimo_numerics.tolerances``.
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import varlen
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case
from mimo_numerics.ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64

C = 8
#: Upstream's test's pattern at C = 8 (2C-1, 5C-3, 3C, 4C-1: three tails) plus a one-token sequence.
LENGTHS = (2 * C - 1, 5 * C - 3, 3 * C, 1, 4 * C - 1)


def _case(lengths=LENGTHS, seed=3, **fields):
    raw = make_op_inputs(small_case(seqlen=sum(lengths), chunk_size=C, seed=seed, **fields))
    offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    return raw, {n: raw[n] for n in OP_INPUT_NAMES}, offsets


def _sequence(x: dict, a: int, b: int) -> dict:
    return {n: (t if t is None or n not in varlen.TIME_AXES else t.narrow(varlen.TIME_AXES[n], a, b - a))
            for n, t in x.items()}


def _run(x: dict, raw: dict, policy, dout=None, **kwargs):
    """Out and every leaf's gradient (``dout`` given) of ``mn.mamba3_mimo``."""
    leaves = {n: (None if t is None else t.detach().clone().requires_grad_(dout is not None)) for n, t in x.items()}
    out = mn.mamba3_mimo(*leaves.values(), C, raw["rotary_dim_divisor"], policy=policy, **kwargs)
    if dout is not None:
        out.backward(dout.to(out.dtype))
    return out.detach(), {n: (None if leaf is None else leaf.grad) for n, leaf in leaves.items()}


def test_fp64_varlen_is_the_fp64_model_of_each_sequence():
    raw, x, offsets = _case()
    x64 = {n: (None if t is None else t.double()) for n, t in x.items()}
    bounds = varlen.sequence_bounds(offsets, 1, raw["V"].shape[1])
    leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x64.items()}
    truth = torch.cat([mamba3_mimo_fp64(*_sequence(leaves, a, b).values(), C, raw["rotary_dim_divisor"])
                       for a, b in bounds], dim=1)
    (truth * raw["dout"].double()).sum().backward()
    out, grads = _run(x64, raw, "fp64", raw["dout"].double(), cu_seqlens=offsets)
    bound = tolerances.get("varlen_fp64_vs_per_sequence_model_rel_rms")
    assert out.shape == truth.shape and rel_rms(out, truth) <= bound
    for name, leaf in leaves.items():
        if leaf is not None:
            assert grads[name].dtype == torch.float64 and rel_rms(grads[name], leaf.grad) <= bound, name
    state = mn.mamba3_mimo(*x64.values(), C, raw["rotary_dim_divisor"], policy="fp64", cu_seqlens=offsets,
                           return_state=True)
    assert [tuple(s.shape[:1]) for s in state[1:]] == [(len(LENGTHS),)] * 4
    for i, (a, b) in enumerate(bounds):
        alone = mamba3_mimo_fp64(*_sequence(x64, a, b).values(), C, raw["rotary_dim_divisor"], return_state=True)
        for got, want in zip(state[1:], alone[1:]):
            assert rel_rms(got[i:i + 1], want) <= bound


@pytest.mark.parametrize("policy", ["upstream_sm90", "fp32"])
def test_packing_changes_no_real_token(policy):
    """The float32 chain on the packed batch against the same policy on each sequence alone: Out (every length),
    and the per-token gradients where each sequence alone can run the backward (lengths multiples of C)."""
    raw, x, offsets = _case()
    bounds = varlen.sequence_bounds(offsets, 1, raw["V"].shape[1])
    bound = tolerances.get("reference_cross_cpu_rel_rms")  # measured: bit-equal (only BLAS shapes may differ)
    out, _ = _run(x, raw, policy, cu_seqlens=offsets)
    alone = torch.cat([_run(_sequence(x, a, b), raw, policy)[0] for a, b in bounds], dim=1)
    assert rel_rms(out.float(), alone.float()) <= bound
    whole = (3 * C, 2 * C, C)
    raw, x, offsets = _case(whole, seed=4)
    out, grads = _run(x, raw, policy, raw["dout"], cu_seqlens=offsets)
    for (a, b) in varlen.sequence_bounds(offsets, 1, sum(whole)):
        _, alone = _run(_sequence(x, a, b), raw, policy, raw["dout"][:, a:b])
        for name, axis in varlen.TIME_AXES.items():
            if alone[name] is not None:
                got = grads[name].narrow(axis, a, b - a)
                assert rel_rms(got.float(), alone[name].float()) <= bound, name


def test_varlen_gradients_are_closer_to_fp64_under_fp32_than_under_upstream_sm90():
    raw, x, offsets = _case(seed=5)
    exact = _run({n: (None if t is None else t.double()) for n, t in x.items()}, raw, "fp64",
                 raw["dout"].double(), cu_seqlens=offsets)
    errors = {}
    for policy in ("fp32", "upstream_sm90"):
        out, grads = _run(x, raw, policy, raw["dout"], cu_seqlens=offsets)
        errors[policy] = [rel_rms(out.double(), exact[0])] + [
            rel_rms(grads[n].double(), exact[1][n]) for n in ("ADT", "DT", "MIMO_V", "Angles", "D")]
    assert all(a < b for a, b in zip(errors["fp32"], errors["upstream_sm90"])), errors


@pytest.mark.skipif(not kernels.triton_available(), reason="needs triton")
def test_varlen_on_the_kernels_is_the_reference():
    raw, x, offsets = _case((C + 3, 1, 2 * C), seed=6)
    want, want_grads = _run(x, raw, "upstream_sm90", raw["dout"], cu_seqlens=offsets)
    got, grads = _run(x, raw, "upstream_sm90", raw["dout"], cu_seqlens=offsets, backend="triton")
    assert rel_rms(got.float(), want.float()) <= tolerances.get("whole_op_kernels_vs_reference_rel_rms")
    cancelling = ("Angles", "D", "DT", "ADT")
    for name, g in grads.items():
        if g is not None:
            key = ("whole_op_kernels_vs_reference_cancelling_rel_rms" if name in cancelling
                   else "whole_op_kernels_vs_reference_rel_rms")
            assert rel_rms(g.float(), want_grads[name].float()) <= tolerances.get(key), name
    # the per-sequence final states: the walk kernel's FINAL store through the padded chunks
    want = mn.mamba3_mimo(*x.values(), C, raw["rotary_dim_divisor"], cu_seqlens=offsets, return_state=True)
    got = mn.mamba3_mimo(*x.values(), C, raw["rotary_dim_divisor"], cu_seqlens=offsets, return_state=True,
                         backend="triton")
    assert got[2].shape[0] == 3
    assert rel_rms(got[2], want[2]) <= tolerances.get("kernels_interpreter_vs_reference_fp32_rel_rms")
    assert torch.equal(got[4], want[4])  # each sequence's last V itself
    # FINAL_K from the reference on one token vs within the rows: torch's cos/sin paths depend on tensor size
    assert rel_rms(got[3].float(), want[3].float()) <= tolerances.get("reference_cross_cpu_rel_rms")


@pytest.mark.parametrize("offsets, batch, error, match", [
    ([0, 8, 16], 1, TypeError, "cu_seqlens must be a torch.Tensor"),
    (torch.tensor([0.0, 16.0]), 1, TypeError, "cu_seqlens must have dtype torch.int32"),
    (torch.tensor([[0, 16]], dtype=torch.int32), 1, ValueError, "1-D with at least 2 entries"),
    (torch.tensor([1, 16], dtype=torch.int32), 1, ValueError, "must start at 0"),
    (torch.tensor([0, 8, 8, 16], dtype=torch.int32), 1, ValueError, "strictly increasing"),
    (torch.tensor([0, 8, 12], dtype=torch.int32), 1, ValueError, "end at the packed length S=16"),
    (torch.tensor([0, 16], dtype=torch.int32), 2, ValueError, "B = 1"),
])
def test_cu_seqlens_is_checked_by_name(offsets, batch, error, match):
    with pytest.raises(error, match=match):
        varlen.sequence_bounds(offsets, batch, 16)


def test_varlen_refusals_of_the_op():
    raw, x, offsets = _case()
    with pytest.raises(ValueError, match="record is not supported with cu_seqlens"):
        mn.mamba3_mimo(*x.values(), C, raw["rotary_dim_divisor"], cu_seqlens=offsets, record={})
    two = make_op_inputs(small_case(batch=2, seqlen=16, chunk_size=C))
    with pytest.raises(ValueError, match="B = 1"):
        mn.mamba3_mimo(*[two[n] for n in OP_INPUT_NAMES], C, two["rotary_dim_divisor"],
                       cu_seqlens=torch.tensor([0, 16], dtype=torch.int32))
    int64 = offsets.long()  # upstream casts int64 offsets to int32: taken
    assert torch.equal(mn.mamba3_mimo(*x.values(), C, raw["rotary_dim_divisor"], cu_seqlens=int64),
                       mn.mamba3_mimo(*x.values(), C, raw["rotary_dim_divisor"], cu_seqlens=offsets))
