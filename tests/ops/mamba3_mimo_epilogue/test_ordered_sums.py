"""``kernels/ordered_sums.py``: the epilogue's long sequential sums in one Triton launch on CUDA give the bits of
one torch add per term (GPU tests skipped without a GPU); bad input is refused by name on any machine."""

import pytest
import torch

from mimo_numerics.kernels import ordered_sums
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


@pytest.mark.parametrize("x, error, match", [
    (torch.zeros(4, 3, dtype=torch.float64), TypeError, "x must be float32"),
    (torch.zeros(4, 3), ValueError, "x must be a CUDA tensor"),
])
def test_ordered_row_sum_refuses_bad_input_by_name(x, error, match):
    with pytest.raises(error, match=match):
        ordered_sums.ordered_row_sum(x)
