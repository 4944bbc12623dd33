"""On CUDA the float32 chain runs its steps on slices of batch rows (``chain.SLICE_ROWS``): outputs and records are
joined back whole, within FP32 summation noise of the unsliced chain.

``chain.SLICE_ROWS`` bounds the ``B·S·H`` rows the forward, stage 1 and stage 2 see at once, so that the peak memory
stays bounded at large batches (issue 22). A case with B = 3 runs unsliced, in slices of one batch row and in
slices of two (2 + 1): the same output and record keys in the same order, shapes, and every value within 1e-5
relative RMS. Not bit for bit: torch picks its CUDA reduction layout, and cuBLAS its GEMM kernel, by the batch count,
so a slice may sum some FP32 terms in another order (seen on the H200 here in stage 2's ``ddA`` and ``dD``; the
figures at shape (d) are in ``reports/bench/whole_op_cuda_d.md``). The CPU keeps whole tensors
(``chain.SLICE_DEVICES``); the CPU test forces slicing there to check the joining.
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs

SPEC = OpCaseSpec(batch=3, seqlen=32, heads=2, state_dim=16, value_dim=16, rank=2, chunk_size=8)
CASES = [("upstream_sm90", SPEC), ("fp32", SPEC.replace(reduce_o=False)),
         ("upstream_sm90_fp16", SPEC.replace(dtype="float16", groups=2, has_d=False))]


def _close(a, b):
    """Within FP32 summation noise: relative RMS <= 1e-5 (the slices' last-bit changes are ~1e-7)."""
    return rel_rms(a, b) <= 1e-5


def _run(raw, policy, device):
    leaves = [None if raw[n] is None else raw[n].to(device).requires_grad_() for n in OP_INPUT_NAMES]
    record = {}
    out = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                         policy=policy, record=record)
    out.backward(raw["dout"].to(device).to(out.dtype))
    grads = {"d" + n: leaf.grad for n, leaf in zip(OP_INPUT_NAMES, leaves) if leaf is not None}
    return {"Out": out.detach(), **grads}, record


def _compare_sliced_with_whole(policy, spec, device, monkeypatch):
    raw = make_op_inputs(spec)
    monkeypatch.setattr(chain, "SLICE_ROWS", 10**9)
    whole, whole_record = _run(raw, policy, device)
    rows = spec.seqlen * spec.heads
    for per_slice in (rows, 2 * rows):
        monkeypatch.setattr(chain, "SLICE_ROWS", per_slice)
        assert len(chain.batch_slices(spec.batch, spec.seqlen, spec.heads, device)) > 1
        sliced, sliced_record = _run(raw, policy, device)
        assert list(sliced) == list(whole)
        for name, value in whole.items():
            assert sliced[name].shape == value.shape and sliced[name].dtype == value.dtype, name
            assert _close(sliced[name], value), f"{name} differs with {per_slice} rows per slice"
        assert list(sliced_record) == list(whole_record), "the record's keys or their order changed"
        for key, value in whole_record.items():
            assert sliced_record[key].shape == value.shape, key
            assert _close(sliced_record[key], value), f"record {key} differs with {per_slice} rows per slice"


def test_batch_slices_cover_the_batch_once():
    cuda = torch.device("cuda")
    assert chain.batch_slices(8, 4096, 32, cuda) == [slice(b, b + 1) for b in range(8)]
    assert chain.batch_slices(1, 8192, 16, cuda) == [slice(0, 1)]
    assert chain.batch_slices(5, 2048, 8, cuda, rows=2 * 2048 * 8) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert chain.batch_slices(3, 10**6, 64, cuda, rows=16) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert chain.batch_slices(4, 16, 2, cuda, rows=10**9) == [slice(0, 4)]
    assert chain.batch_slices(8, 4096, 32, torch.device("cpu")) == [slice(0, 8)]
    for bad in (dict(batch=0), dict(seqlen=-1), dict(heads=1.5), dict(rows=0)):
        args = {"batch": 2, "seqlen": 16, "heads": 2, "device": cuda, "rows": None, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            chain.batch_slices(**args)


@pytest.mark.parametrize("policy,spec", CASES)
def test_forced_slices_on_cpu_join_outputs_and_records(policy, spec, monkeypatch):
    monkeypatch.setattr(chain, "SLICE_DEVICES", ("cpu",))
    _compare_sliced_with_whole(policy, spec, "cpu", monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("policy,spec", CASES)
def test_sliced_chain_joins_outputs_and_records_on_cuda(policy, spec, monkeypatch):
    _compare_sliced_with_whole(policy, spec, "cuda", monkeypatch)
