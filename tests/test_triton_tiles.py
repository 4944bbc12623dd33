"""``ops/_common/triton_tiles``: Triton 3.6's tile layouts and the order of ``tl.cumsum``/``tl.sum`` over them.

The layouts below were read from the TTGIR that Triton 3.6.0 compiles for ``sm_90`` (``triton.compile`` on a CPU,
``angle_dt_fwd_kernel`` with the divisibility hints of contiguous tensors whose column count is a multiple of 16):
``(C, BLOCK_D, num_warps) -> threadsPerWarp[0]``. The golden tests of the helpers' bits are in
``tests/ops/mamba3_mimo/test_fp32_level_golden.py``.
"""

import pytest
import torch

from mimo_numerics.ops._common import triton_tiles as tt

#: ``(C, BLOCK_D, num_warps): lanes per warp along the rows``, from Triton 3.6.0's TTGIR (2026-12-04).
TTGIR_LANES = {
    (8, 16, 2): 4, (8, 16, 4): 2, (8, 32, 2): 4, (8, 32, 4): 2, (8, 32, 8): 1,
    (16, 16, 2): 8, (16, 16, 4): 4, (16, 16, 8): 2, (16, 32, 2): 4, (16, 32, 4): 4, (16, 32, 8): 2,
    (32, 16, 2): 8, (32, 16, 4): 8, (32, 16, 8): 4, (32, 32, 2): 4, (32, 32, 4): 4, (32, 32, 8): 4,
    (64, 16, 2): 8, (64, 16, 4): 8, (64, 16, 8): 8, (64, 32, 2): 4, (64, 32, 4): 4, (64, 32, 8): 4,
}


@pytest.mark.parametrize("key", sorted(TTGIR_LANES))
def test_layout_rule_reproduces_tritons_layouts(key):
    chunk, block_d, num_warps = key
    layout = tt.tile_layout(chunk, block_d, num_warps)
    assert layout.lanes == TTGIR_LANES[key]
    assert layout.warps == num_warps and layout.lanes * layout.warps * layout.repeats == chunk
    assert layout.block_d == block_d and block_d % layout.columns_per_thread == 0


def test_unaligned_columns_take_one_column_per_thread():
    """K = 8 (not a multiple of 16): no vectorised loads, so 4 lanes of 8 columns at C = 32 (TTGIR, num_warps 2)."""
    layout = tt.tile_layout(32, 8, 2)
    assert (layout.lanes, layout.warps, layout.repeats, layout.columns_per_thread) == (4, 2, 4, 1)


def test_angle_dt_layout_takes_the_measured_pick_and_checks_num_warps():
    assert tt.angle_dt_layout(16, 16).warps == tt.ANGLE_DT_FWD_NUM_WARPS[(16, 16, True)]
    assert tt.angle_dt_layout(16, 16, backward=True).warps == tt.ANGLE_DT_BWD_NUM_WARPS[(16, 16, True)]
    assert tt.angle_dt_layout(16, 16, num_warps=2).warps == 2
    assert tt.angle_dt_layout(128, 64).warps == tt.DEFAULT_NUM_WARPS  # no golden run measured it
    with pytest.raises(ValueError, match="num_warps must be one of"):
        tt.angle_dt_layout(16, 16, num_warps=3)
    with pytest.raises(ValueError, match="power of 2"):
        tt.tile_layout(12, 16, 4)


LAYOUTS = [tt.TileLayout(1, 16, 1), tt.TileLayout(2, 8, 1), tt.TileLayout(8, 2, 1), tt.TileLayout(4, 2, 2),
           tt.TileLayout(4, 1, 4), tt.TileLayout(16, 1, 1)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_scan_and_sum_are_prefix_sums_in_some_order(layout):
    """On small integers every order is exact: the scan is the prefix sum, the sum the total, with or without the
    contracted products."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-8, 9, (5, 16), generator=g).float()
    b = torch.randint(-8, 9, (5, 16), generator=g).float()
    x = a * b
    want = torch.cumsum(x, dim=-1)
    for factors in (None, (a, b)):
        assert torch.equal(tt.tile_cumsum(x, layout, factors), want)
        assert torch.equal(tt.tile_sum(x, layout, factors), want[..., -1])


def test_the_order_is_the_layouts():
    """Hillis-Steele within a warp, then the warp totals left to right: 2^24 + 1 rounds away the 1 in one order and
    not in the other (the exact prefix sums are 2^24, 2^24 + 1, 1, 2)."""
    x = torch.tensor([[2.0 ** 24, 1.0, -(2.0 ** 24), 1.0]])
    one_warp = tt.tile_cumsum(x, tt.TileLayout(4, 1, 1))  # step 1: [a, a+b, b+c, c+d]; step 2 adds two lanes back
    assert one_warp.tolist() == [[2.0 ** 24, 2.0 ** 24, 1.0, 1.0]]
    per_warp = tt.tile_cumsum(x, tt.TileLayout(1, 4, 1))  # one row per warp: the totals added left to right
    assert per_warp.tolist() == [[2.0 ** 24, 2.0 ** 24, 0.0, 1.0]]


def test_contraction_fuses_the_product_into_the_first_add():
    """fma(a, b, x_before) keeps the product's low bits, which the rounded product loses."""
    a = torch.tensor([[1.0, 1.0 + 2.0 ** -12]])
    b = torch.tensor([[-1.0, 1.0 + 2.0 ** -12]])
    x = a * b  # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11
    layout = tt.TileLayout(2, 1, 1)
    assert tt.tile_cumsum(x, layout, (a, b))[0, 1].item() == 2.0 ** -11 + 2.0 ** -24
    assert tt.tile_cumsum(x, layout)[0, 1].item() == 2.0 ** -11
    # the butterfly's lane 0 fuses its own product a0·b0 (exact here) with the partner's rounded one: the sum and
    # the scan's last element differ, as they do on the H200
    assert tt.tile_sum(x, layout, (a, b))[0].item() == 2.0 ** -11


def test_column_sum_pads_to_the_tile_and_checks_its_width():
    layout = tt.tile_layout(16, 12, 4)  # BLOCK_D 16, unaligned: one column per thread
    x = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    assert torch.equal(tt.column_sum(x, layout), x.sum(dim=-1))
    with pytest.raises(ValueError, match="more than the tile"):
        tt.column_sum(torch.zeros(2, 20), layout)
    with pytest.raises(TypeError, match="float32"):
        tt.tile_sum(torch.zeros(2, 16, dtype=torch.float64), layout)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="columns must be >= 1"):
        tt.tile_layout(16, 0, 4)
    with pytest.raises(TypeError, match="num_warps must be an int"):
        tt.tile_layout(16, 16, 4.0)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., C\] with C = 16"):
        tt.tile_cumsum(torch.zeros(2, 8), tt.TileLayout(4, 4, 1))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., C\] with C = 16"):
        tt.tile_sum(torch.zeros(2, 8), tt.TileLayout(4, 4, 1))
