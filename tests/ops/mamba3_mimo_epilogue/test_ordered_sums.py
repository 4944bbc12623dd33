"""``kernels/ordered_sums.py``: the references' sequential sums, scans and the angle walk in one Triton launch give
the bits of the torch loops they replace, in Triton's interpreter (CPU) and on CUDA (GPU tests skipped without a
GPU); the references on CUDA give the same bits with and without them; bad input is refused by name."""

import pytest
import torch

from mimo_numerics import kernels
from mimo_numerics.kernels import ordered_sums
from mimo_numerics.ops.mamba3_mimo import preprocess
from mimo_numerics.ops.mamba3_mimo_epilogue import reference as epilogue_reference

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _terms() -> torch.Tensor:
    """[1000, 3, 7] float32 over 60 decades with -0, subnormals (sums of them too), infinities and a NaN."""
    g = torch.Generator().manual_seed(5)
    terms = (torch.randn(1000, 3, 7, generator=g) * torch.logspace(-30, 30, 1000)[:, None, None]).float()
    terms[10, 0, 0], terms[11, 0, 1], terms[12, 1, 1] = -0.0, 1e-40, float("inf")
    terms[13, 1, 1], terms[14, 2, 2], terms[:, 2, 3] = float("-inf"), float("nan"), -0.0
    terms[:, 0, 4] = 1e-42 * torch.randn(1000, generator=g)  # a column of subnormals only: no flush to zero
    return terms


def _same_bits_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    both_nan = a.isnan() & b.isnan()
    return bool(torch.equal(a.isnan(), b.isnan())
                and torch.equal(a[~both_nan].view(torch.int32), b[~both_nan].view(torch.int32)))


@pytest.mark.gpu
@gpu
def test_ordered_row_sum_on_cuda_is_the_chain_of_torch_adds():
    terms = _terms()
    want = terms[0].clone()
    for row in terms[1:]:
        want = want + row
    got = ordered_sums.ordered_row_sum(terms.cuda()).cpu()
    assert _same_bits_or_both_nan(got, want)
    assert (got[0, 4] != 0) and got[0, 4].abs() < 1.2e-38  # a subnormal total survived


@pytest.mark.gpu
@gpu
def test_epilogue_long_sum_on_cuda_equals_its_cpu_numpy_path():
    terms = _terms().movedim(0, 1)  # the sum runs over dim 1, as the epilogue's bias sums over tokens
    assert terms.shape[1] > epilogue_reference.SEQUENTIAL_LOOP_MAX
    cpu = epilogue_reference._sum_sequential(terms, dim=1)
    cuda = epilogue_reference._sum_sequential(terms.cuda(), dim=1)
    assert cuda.is_cuda and _same_bits_or_both_nan(cuda.cpu(), cpu)


def _scan_loop(x: torch.Tensor, reverse: bool, exclusive: bool) -> torch.Tensor:
    """The running sum over dim 0 as torch adds, one per term (the references' loops)."""
    out = torch.empty_like(x)
    acc = torch.zeros_like(x[0]) if exclusive else None
    for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        if exclusive:
            out[t] = acc
            acc = acc + x[t]
        else:
            acc = x[t].clone() if acc is None else acc + x[t]
            out[t] = acc
    return out


def _angle_sums(n_chunks: int = 300) -> torch.Tensor:
    """[n_chunks, 4, 33] chunk sums of both signs, some many turns long, with -0 and exact multiples of 2π₃₂."""
    g = torch.Generator().manual_seed(11)
    sums = (torch.randn(n_chunks, 4, 33, generator=g) * torch.tensor([0.1, 3.0, 30.0, 300.0])[None, :, None]).float()
    sums[5, 0, 0], sums[:, 0, 1] = -0.0, ordered_sums.TWO_PI_F32
    return sums


needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="needs triton")


@needs_triton
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
def test_ordered_scan_in_the_interpreter_is_the_chain_of_torch_adds(reverse, exclusive):
    terms = _terms()[:200]
    got = ordered_sums.ordered_scan(terms, reverse=reverse, exclusive=exclusive)
    assert _same_bits_or_both_nan(got, _scan_loop(terms, reverse, exclusive))
    assert got.shape == terms.shape


@needs_triton
def test_angle_walk_in_the_interpreter_is_the_preprocessing_walk():
    sums = _angle_sums()
    want = preprocess._angle_chunk_walk(sums.movedim(0, 1))  # the reference walks dim 1 of [B, nc, H, K]
    got = ordered_sums.angle_state_walk(sums).movedim(0, 1)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert bool((got >= 0).all()) and bool((got < ordered_sums.TWO_PI_F32).all())
    assert bool((got[1:, 1] > 1.0).any())  # the large sums wrapped many turns and were brought back into range


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
def test_ordered_scan_and_angle_walk_on_cuda_are_the_torch_loops(reverse, exclusive):
    terms = _terms()[:200]
    got = ordered_sums.ordered_scan(terms.cuda(), reverse=reverse, exclusive=exclusive).cpu()
    assert _same_bits_or_both_nan(got, _scan_loop(terms, reverse, exclusive))
    sums = _angle_sums()
    walk = ordered_sums.angle_state_walk(sums.cuda()).cpu()
    assert torch.equal(walk, preprocess._angle_chunk_walk(sums.movedim(0, 1)).movedim(0, 1))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("policy", ["upstream_sm90", "fp32"])
def test_reference_chain_on_cuda_gives_the_same_bits_without_the_ordered_kernels(policy, monkeypatch):
    """The whole op's reference on CUDA: the ordered kernels (preprocessing walk, epilogue sums and scans) against
    the torch loops they replace (replayed from CUDA graphs), Out and every gradient bit for bit."""
    import mimo_numerics as mn
    from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs

    raw = make_op_inputs(OpCaseSpec(batch=1, seqlen=1024, heads=2, state_dim=32, value_dim=32, rank=2,
                                    chunk_size=16))

    def run():
        leaves = [None if raw[n] is None else raw[n].cuda().requires_grad_() for n in OP_INPUT_NAMES]
        out = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                             policy=policy, backend="reference")
        out.backward(raw["dout"].cuda().to(out.dtype))
        return [out.detach()] + [None if leaf is None else leaf.grad for leaf in leaves]

    with_kernels = run()
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    without = run()
    for name, a, b in zip(["Out"] + list(OP_INPUT_NAMES), with_kernels, without):
        if b is not None:
            assert _same_bits_or_both_nan(a.float(), b.float()), name


@pytest.mark.parametrize("x, error, match", [
    (torch.zeros(4, 3, dtype=torch.float64), TypeError, "x must be float32"),
    (torch.zeros(0, 3), ValueError, "at least one row"),
    ([1.0, 2.0], TypeError, "x must be a torch.Tensor"),
])
def test_ordered_kernels_refuse_bad_input_by_name(x, error, match):
    for call in (ordered_sums.ordered_row_sum, ordered_sums.ordered_scan, ordered_sums.angle_state_walk):
        with pytest.raises(error, match=match):
            call(x)
