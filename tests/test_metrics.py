"""Tests of mimo_numerics.metrics on hand-computed examples."""

import math

import pytest
import torch

from mimo_numerics import metrics
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import MimoBwdFwdOutputs


def _t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def test_rel_rms_hand_computed():
    # ||(0, 1)|| / ||(3, 4)|| = 1 / 5
    assert metrics.rel_rms(_t([3.0, 5.0]), _t([3.0, 4.0])) == pytest.approx(0.2, rel=1e-15)


def test_rel_rms_mixed_dtypes_computed_in_float64():
    actual = _t([1.0, 2.0], torch.bfloat16)
    expected = _t([1.0, 2.0 + 2.0 ** -20])
    assert metrics.rel_rms(actual, expected) == pytest.approx(2.0 ** -20 / math.sqrt(1 + (2 + 2.0 ** -20) ** 2))


@pytest.mark.parametrize(("actual", "expected", "result"), [
    ([0.0, 0.0], [0.0, 0.0], 0.0),
    ([0.0, 1e-30], [0.0, 0.0], math.inf),
])
def test_rel_rms_zero_reference(actual, expected, result):
    assert metrics.rel_rms(_t(actual), _t(expected)) == result


@pytest.mark.parametrize("which", ["actual", "expected"])
def test_metrics_nan_propagates(which):
    good, bad = _t([1.0, 2.0]), _t([1.0, math.nan])
    pair = (bad, good) if which == "actual" else (good, bad)
    assert math.isnan(metrics.rel_rms(*pair))
    assert math.isnan(metrics.max_abs(*pair))
    assert math.isnan(metrics.max_rel(*pair))


def test_max_abs_and_max_rel_hand_computed():
    actual, expected = _t([1.5, -2.0, 4.0]), _t([1.0, -4.0, 4.0])
    assert metrics.max_abs(actual, expected) == 2.0
    assert metrics.max_rel(actual, expected) == 0.5  # 2 / max|expected| = 2 / 4


def test_max_rel_zero_reference():
    assert metrics.max_rel(_t([0.0]), _t([0.0])) == 0.0
    assert metrics.max_rel(_t([1.0]), _t([0.0])) == math.inf


@pytest.mark.parametrize("fn", [metrics.rel_rms, metrics.max_abs, metrics.max_rel, metrics.bit_equal_fraction])
def test_shape_mismatch_raises(fn):
    with pytest.raises(ValueError, match="same shape"):
        fn(torch.zeros(2), torch.zeros(3))


def _bf16_from_bits(bits):
    return torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)


def test_ulp_distance_adjacent_and_binade_boundary():
    one = _t([1.0])
    # bf16 has 7 stored fraction bits: spacing 2^-7 in [1, 2), 2^-8 in [0.5, 1)
    assert metrics.ulp_distance(_t([1.0 + 2.0 ** -7]), one, "bfloat16").item() == 1
    assert metrics.ulp_distance(_t([1.0 - 2.0 ** -8]), one, "bfloat16").item() == 1
    # from the largest value below 2 to the smallest above it: 2 steps across the binade boundary
    assert metrics.ulp_distance(_t([2.0 - 2.0 ** -7]), _t([2.0 + 2.0 ** -6]), torch.bfloat16).item() == 2
    # float16 has 10 fraction bits: 1 + 2^-10 is one step, and 1 -> 2 is 1024 steps
    assert metrics.ulp_distance(_t([1.0 + 2.0 ** -10]), one, "float16").item() == 1
    assert metrics.ulp_distance(_t([2.0]), one, "fp16").item() == 1024


def test_ulp_distance_across_zero():
    tiny = 2.0 ** -133  # smallest positive bf16 subnormal
    assert metrics.ulp_distance(_t([tiny]), _t([-tiny]), "bfloat16").item() == 2
    assert metrics.ulp_distance(_t([0.0]), _t([-0.0]), "bfloat16").item() == 0
    assert metrics.ulp_distance(_t([-1.0]), _t([1.0]), "bfloat16").item() == 2 * 0x3F80
    # bit patterns: 0x8001 is -tiny, 0x0002 is 2·tiny
    assert metrics.ulp_distance(_bf16_from_bits([0x0002]), _bf16_from_bits([-0x7FFF]), "bfloat16").item() == 3


def test_ulp_distance_infinity_is_one_step_beyond_max():
    big = torch.finfo(torch.float16).max
    assert metrics.ulp_distance(_t([math.inf]), _t([big]), "float16").item() == 1


def test_ulp_distance_returns_int64_elementwise():
    dist = metrics.ulp_distance(_t([[1.0, 2.0], [4.0, -4.0]]), _t([[1.0, 2.0 + 2.0 ** -6], [4.0, -4.0]]), "bf16")
    assert dist.dtype == torch.int64
    assert dist.tolist() == [[0, 1], [0, 0]]


def test_ulp_distance_rejects_unrepresentable_values_and_nan():
    with pytest.raises(ValueError, match="not exactly representable"):
        metrics.ulp_distance(_t([1.0 + 2.0 ** -9]), _t([1.0]), "bfloat16")
    with pytest.raises(ValueError, match="NaN"):
        metrics.ulp_distance(_t([math.nan]), _t([1.0]), "bfloat16")
    with pytest.raises(ValueError, match="unknown fmt"):
        metrics.ulp_distance(_t([1.0]), _t([1.0]), "float8")


def test_ulp_histogram_buckets():
    expected = torch.ones(6, dtype=torch.float64)
    steps = [0, 0, 1, 3, 5, 300]
    actual = torch.tensor([1.0 + s * 2.0 ** -10 for s in steps], dtype=torch.float64)
    hist = metrics.ulp_histogram(actual, expected, "float16")
    assert list(hist)[:4] == ["0", "1", "2-3", "4-7"]
    assert list(hist)[-1] == ">=256"
    assert hist["0"] == 2 and hist["1"] == 1 and hist["2-3"] == 1 and hist["4-7"] == 1 and hist[">=256"] == 1
    assert sum(hist.values()) == 6
    assert metrics.ulp_histogram(actual, expected, "float16", bins=(0, 4)) == {"0-3": 4, ">=4": 2}


@pytest.mark.parametrize("bins", [(1, 2), (0, 2, 2), (), (0, 1.5)])
def test_ulp_histogram_rejects_bad_bins(bins):
    with pytest.raises(ValueError, match="bins"):
        metrics.ulp_histogram(_t([1.0]), _t([1.0]), "bfloat16", bins=bins)


def test_bit_equal_fraction():
    a = torch.tensor([1.0, 2.0, 0.0, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.0, -0.0, 3.5], dtype=torch.bfloat16)
    assert metrics.bit_equal_fraction(a, b) == 0.5  # -0 and +0 differ in bits
    assert metrics.bit_equal_fraction(a, a.clone()) == 1.0
    with pytest.raises(ValueError, match="same dtype"):
        metrics.bit_equal_fraction(a, a.float())


def _outputs(scale=1.0, with_z=True):
    states = torch.ones(1, 1, 2, 4, 4) * scale
    qk = torch.ones(1, 1, 3, 2, 2)
    dz = torch.ones(1, 3, 1, 4) * scale if with_z else None
    dmz = torch.ones(1, 1, 2, 4) if with_z else None
    return MimoBwdFwdOutputs(dmimo_o=None, states=states, dz=dz, dmimo_z=dmz, qk_dot=qk)


def test_compare_outputs_tuple_and_dict():
    result = metrics.compare_outputs(_outputs(2.0), _outputs(1.0).as_dict())
    assert result["dmimo_o"] is None
    assert result["states"]["rel_rms"] == pytest.approx(1.0)
    assert result["states"]["max_abs"] == 1.0 and result["states"]["max_rel"] == 1.0
    assert result["qk_dot"] == {"rel_rms": 0.0, "max_abs": 0.0, "max_rel": 0.0, "bit_equal_fraction": 1.0}
    assert set(result) == {"dmimo_o", "states", "dz", "dmimo_z", "qk_dot"}


def test_compare_outputs_mixed_dtypes_gives_nan_bit_equal():
    actual = _outputs()._replace(states=torch.ones(1, 1, 2, 4, 4, dtype=torch.bfloat16))
    result = metrics.compare_outputs(actual, _outputs())
    assert math.isnan(result["states"]["bit_equal_fraction"]) and result["states"]["rel_rms"] == 0.0


def test_compare_outputs_one_sided_none_names_output():
    with pytest.raises(ValueError, match="output dz"):
        metrics.compare_outputs(_outputs(with_z=False), _outputs(with_z=True))


def test_compare_outputs_shape_mismatch_names_output():
    bad = _outputs()._replace(qk_dot=torch.ones(1, 1, 4, 2, 2))
    with pytest.raises(ValueError, match="output qk_dot"):
        metrics.compare_outputs(bad, _outputs())


def test_compare_outputs_rejects_unknown_keys():
    d = dict(_outputs().as_dict(), extra=None)
    with pytest.raises(ValueError, match="extra"):
        metrics.compare_outputs(d, _outputs())
