"""Reliability of input handling: fuzzed bad inputs and valid but unusual tensor layouts.

* **Bad inputs** (hypothesis): one random defect per example (a wrong shape, rank or zero-size dimension, a wrong
  dtype, another device (``meta``), a non-tensor, a missing required tensor, an unpaired ``z``/``mimo_z``, a
  sparse/nested/mkldnn tensor, a bad ``chunk_size``/``rotary_dim_divisor`` such as ``nan``, ``inf``, ``2.5``, ``"4"``,
  ``True``, ``0``, ``-1`` or a 0-d tensor) applied to a valid case. The reference, the oracle and the Triton
  kernels must each raise ``TypeError`` or ``ValueError`` (never an internal error) whose message names the
  argument; the kernels must raise the reference's exception and message. ``q`` and ``v`` define the sizes, so a
  size defect in them may be reported on the first tensor that disagrees (the message then names that one).
* **Layouts** (decision, see ``reports/reliability.md``): inputs are read-only values, so non-contiguous views,
  views with a storage offset, and overlapping views (``expand``, ``as_strided`` with zero or repeated strides) are
  *valid*: the reference and the kernels (both copy every input to a contiguous tensor first) return the same bits
  as for contiguous copies of the same values, the oracle the same values to FP64 rounding (finding F8), and none
  of them writes into its inputs.
* Tensors with ``requires_grad=True`` are valid inputs (the reference runs under ``torch.no_grad``); ``meta``
  tensors give shape-only outputs in the reference and the oracle and a ``ValueError`` naming the device in the
  kernels.
"""

from __future__ import annotations

import collections
import math
import re

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mimo_numerics as mn  # noqa: E402
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OPTIONAL_INPUTS, OUTPUT_NAMES

# ---------------------------------------------------------------------------------------------------- profiles
from reliability_support import counts_writer, kernels_or_none, profile  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402

COUNTS = collections.Counter()
_write_counts = counts_writer(COUNTS, __file__)


KERNELS = kernels_or_none()

# ---------------------------------------------------------------------------------------------------- base cases
#: valid tiny cases (every branch combination is reachable by removing optional inputs); kernel-supported sizes
BASES = (
    CaseSpec(seqlen=8, heads=2, groups=1, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True),
    CaseSpec(seqlen=7, state_dim=16, value_dim=16, rank=1, chunk_size=3, reduce_o=False, has_z=True,
             dtype="float16", rotary_dim_divisor=2, formula="realistic"),
    CaseSpec(batch=2, seqlen=5, heads=2, groups=2, state_dim=16, value_dim=16, rank=3, chunk_size=2, has_d=True),
    CaseSpec(seqlen=6, state_dim=16, value_dim=16, rank=2, chunk_size=6, reduce_o=False),
)
_BASE_INPUTS = {}


def base_inputs(i: int) -> dict:
    if i not in _BASE_INPUTS:
        _BASE_INPUTS[i] = make_inputs(BASES[i])
    return dict(_BASE_INPUTS[i])  # a shallow copy: mutations replace tensors, never write into them


def policy_for(spec: CaseSpec) -> str:
    return "upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16"


IMPLEMENTATIONS = ("reference", "oracle") + (("kernels",) if KERNELS is not None else ())


def call(impl: str, inputs: dict, policy):
    if impl == "reference":
        return stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)
    if impl == "oracle":
        return stage1_oracle.mamba_mimo_bwd_fwd_oracle(*as_args(inputs), **as_kwargs(inputs))
    return KERNELS.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)


def names_argument(message: str, names) -> bool:
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", message) for n in names)


# ---------------------------------------------------------------------------------------------------- defects
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64)
NOT_TENSORS = ([[1.0]], 1.0, 3, "q", {"a": 1}, (1, 2), np.zeros((2, 2), dtype=np.float32), object())
BAD_SCALARS = (float("nan"), float("inf"), float("-inf"), 0, -1, -16, 2.5, 4.0, "4", None, True, False,
               torch.tensor(4), np.float64(4.0), 2 ** 70, [4])
BAD_DIVISORS = (float("nan"), 0, 1, 3, 8, -4, 2.0, "2", None, True, torch.tensor(2))
SIZE_DEFINING = ("q", "v")
ALL_ARGS = INPUT_NAMES + ("chunk_size", "rotary_dim_divisor")


@st.composite
def defects(draw):
    """(label, base index, mutate(inputs) -> names the message may name, expected exception types)."""
    i = draw(st.integers(0, len(BASES) - 1))
    inputs = base_inputs(i)
    present = [n for n in INPUT_NAMES if inputs[n] is not None]
    family = draw(st.sampled_from(["shape", "rank", "zero_size", "dtype", "device", "not_tensor", "missing",
                                   "unpaired", "layout", "chunk_size", "rotary_dim_divisor"]))
    name = draw(st.sampled_from(present))
    t = inputs[name]
    relaxed = ALL_ARGS if name in SIZE_DEFINING else (name,)

    if family == "shape":
        dim = draw(st.integers(0, t.dim() - 1))
        delta = draw(st.sampled_from([-3, -2, -1, 1, 2, 5]))
        shape = list(t.shape)
        shape[dim] = max(1, shape[dim] + delta)
        if shape == list(t.shape):
            shape[dim] += 1
        value = torch.zeros(shape, dtype=t.dtype)
        return f"shape:{name}{shape}", i, {name: value}, relaxed, (ValueError,)
    if family == "rank":
        if draw(st.booleans()) and t.dim() > 1:
            value = t.select(draw(st.integers(0, t.dim() - 1)), 0)
        else:
            value = t.unsqueeze(draw(st.integers(0, t.dim())))
        return f"rank:{name}{list(value.shape)}", i, {name: value}, relaxed, (ValueError,)
    if family == "zero_size":
        dim = draw(st.integers(0, t.dim() - 1))
        value = t.narrow(dim, 0, 0)
        return f"zero_size:{name}[dim {dim}]", i, {name: value}, relaxed, (ValueError,)
    if family == "dtype":
        dtype = draw(st.sampled_from([d for d in DTYPES if d != t.dtype]))
        value = t.to(dtype)
        # q's dtype is the lp dtype the others are checked against: the oracle (no policy) may name dout instead
        return f"dtype:{name}->{dtype}", i, {name: value}, (ALL_ARGS if name == "q" else (name,)), (TypeError,)
    if family == "device":
        return f"device:{name}->meta", i, {name: t.to("meta")}, (name, "q"), (ValueError,)
    if family == "not_tensor":
        value = draw(st.sampled_from(NOT_TENSORS))
        return f"not_tensor:{name}={type(value).__name__}", i, {name: value}, (name,), (TypeError,)
    if family == "missing":
        required = [n for n in present if n not in OPTIONAL_INPUTS]
        name = draw(st.sampled_from(required))
        return f"missing:{name}", i, {name: None}, (name,), (TypeError,)
    if family == "unpaired":
        if inputs["z"] is not None:
            name = draw(st.sampled_from(["z", "mimo_z"]))
            return f"unpaired:no_{name}", i, {name: None}, ("z", "mimo_z"), (ValueError,)
        spec = BASES[i]
        z = torch.zeros(spec.batch, spec.seqlen, spec.heads, spec.value_dim, dtype=inputs["q"].dtype)
        return "unpaired:z_without_mimo_z", i, {"z": z}, ("z", "mimo_z"), (ValueError,)
    if family == "layout":
        kind = draw(st.sampled_from(["sparse", "nested", "mkldnn"]))
        if kind == "sparse":
            value = t.to_sparse()
        elif kind == "nested":
            value = torch.nested.nested_tensor([t])
        else:
            value = t.float().to_mkldnn() if t.dim() <= 4 else t.to_sparse()
            kind = "mkldnn" if t.dim() <= 4 else "sparse"
        return f"layout:{name}->{kind}", i, {name: value}, (name,), (TypeError,)
    if family == "chunk_size":
        value = draw(st.sampled_from(BAD_SCALARS + (BASES[i].chunk_size + 1,)))
        # an int that is valid but disagrees with segsum is reported on segsum
        names = ("chunk_size", "segsum")
        types = (TypeError, ValueError)
        return f"chunk_size={value!r}", i, {"chunk_size": value}, names, types
    value = draw(st.sampled_from(BAD_DIVISORS + (6 - BASES[i].rotary_dim_divisor,)))
    return (f"rotary_dim_divisor={value!r}", i, {"rotary_dim_divisor": value},
            ("rotary_dim_divisor", "angles", "q"), (TypeError, ValueError))


def _bad_inputs(profile_name: str, examples: int):
    counter = f"bad_inputs[{profile_name}]"

    @pytest.mark.filterwarnings("ignore::UserWarning")  # torch's nested-tensor prototype warning
    @profile(profile_name, examples)
    @given(defect=defects())
    def check(defect):
        label, i, changes, names, types = defect
        note(label)
        inputs = base_inputs(i)
        inputs.update(changes)
        policy = policy_for(BASES[i])
        family = label.split(":")[0].split("=")[0]
        messages = {}
        for impl in IMPLEMENTATIONS:
            COUNTS[counter] += 1
            COUNTS[f"{counter} {family}"] += 1
            with pytest.raises((TypeError, ValueError)) as info:
                call(impl, inputs, policy)
            exc = info.value
            assert isinstance(exc, types), f"{impl}: {label}: expected {types}, got {type(exc).__name__}: {exc}"
            assert names_argument(str(exc), names), f"{impl}: {label}: message does not name {names}: {exc}"
            messages[impl] = (type(exc), str(exc))
        if "kernels" in messages:
            assert messages["kernels"] == messages["reference"], f"{label}: kernels and reference differ"

    return check


test_bad_inputs_raise_clear_errors = _bad_inputs("fast", 120)
test_bad_inputs_raise_clear_errors_slow = pytest.mark.slow(_bad_inputs("slow", 4000))


# every family on every base at least once, deterministically (the fuzz above samples them)
_ENUMERATED = [
    ("chunk_size_nan", {"chunk_size": float("nan")}, TypeError, "chunk_size"),
    ("chunk_size_inf", {"chunk_size": float("inf")}, TypeError, "chunk_size"),
    ("chunk_size_tensor", {"chunk_size": torch.tensor(4)}, TypeError, "chunk_size"),
    ("chunk_size_numpy", {"chunk_size": np.int64(4)}, TypeError, "chunk_size"),
    ("chunk_size_negative", {"chunk_size": -4}, ValueError, "chunk_size"),
    ("divisor_nan", {"rotary_dim_divisor": float("nan")}, TypeError, "rotary_dim_divisor"),
    ("divisor_8", {"rotary_dim_divisor": 8}, ValueError, "rotary_dim_divisor"),
    ("q_sparse", {"q": lambda x: x["q"].to_sparse()}, TypeError, "q"),
    ("segsum_sparse", {"segsum": lambda x: x["segsum"].to_sparse()}, TypeError, "segsum"),
    ("d_sparse", {"d": lambda x: x["d"].to_sparse()}, TypeError, "d"),
    ("q_bias_mkldnn", {"q_bias": lambda x: x["q_bias"].to_mkldnn()}, TypeError, "q_bias"),
    ("dt_nested", {"dt": lambda x: torch.nested.nested_tensor([x["dt"][0]])}, TypeError, "dt"),
    ("v_numpy", {"v": lambda x: x["v"].float().numpy()}, TypeError, "v"),
    ("segsum_zero_chunks", {"segsum": lambda x: x["segsum"][:, :, :0]}, ValueError, "segsum"),
    ("seqlen_zero", {"q": lambda x: x["q"][:, :0]}, ValueError, "empty dimension S"),
    ("angles_on_meta", {"angles": lambda x: x["angles"].to("meta")}, ValueError, "angles"),
    ("all_lp_fp16_under_bf16_policy", {n: (lambda x, n=n: x[n].half()) for n in ("dout", "q", "k", "v", "z", "trap")},
     TypeError, "lp_dtype"),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("label, changes, error, text", _ENUMERATED, ids=[e[0] for e in _ENUMERATED])
def test_enumerated_bad_inputs(impl, label, changes, error, text):
    inputs = base_inputs(0)
    for n, value in changes.items():
        inputs[n] = value(inputs) if callable(value) else value
    if impl == "oracle" and label.startswith("all_lp"):
        pytest.skip("the oracle has no policy: consistent fp16 inputs are valid for it")
    COUNTS["bad_inputs[enumerated]"] += 1
    with pytest.raises(error, match=re.escape(text)):
        call(impl, inputs, "upstream_sm90")


# ---------------------------------------------------------------------------------------------------- layouts
def _as_layout(t: torch.Tensor, kind: str, seed: int) -> torch.Tensor:
    """A tensor with t's values (or, for the overlapping kinds, values derived from t) in an unusual layout."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "strided":  # every other element of a wider buffer
        buf = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        buf[..., ::2] = t
        return buf[..., ::2]
    if kind == "transposed" and t.dim() >= 2:  # column-major storage of the same values
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "offset":  # contiguous, but at a storage offset
        buf = torch.zeros(t.numel() + 7, dtype=t.dtype)
        buf[7:] = t.reshape(-1)
        return buf[7:].view(t.shape)
    if kind == "expanded":  # stride 0 along one dimension: every slice is the first one
        dims = [d for d in range(t.dim()) if t.shape[d] > 1]
        if not dims:
            return t
        d = dims[int(torch.randint(len(dims), (1,), generator=gen))]
        return t.narrow(d, 0, 1).expand(t.shape)
    if kind == "overlapping":  # as_strided with dim 0 stepping like the last dim: elements alias each other
        if t.dim() < 2:
            return t.narrow(0, 0, 1).expand(t.shape)
        strides = list(torch.empty(t.shape).stride())
        strides[0] = strides[-1]
        need = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, strides))
        base = t.reshape(-1).repeat(-(-need // t.numel()))[:need].clone()
        return base.as_strided(tuple(t.shape), tuple(strides))
    return t


LAYOUTS = ("strided", "transposed", "offset", "expanded", "overlapping")


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_same_bits(a, b, label):
    for name in OUTPUT_NAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), (label, name)
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, (label, name)
            assert torch.equal(_bits(x), _bits(y)), f"{label}: {name} differs from the contiguous run"


def _layout_inputs(inputs, chosen, seed):
    views = dict(inputs)
    for n, kind in chosen.items():
        views[n] = _as_layout(inputs[n], kind, seed)
    copies = {n: (v.contiguous().clone() if isinstance(v, torch.Tensor) else v) for n, v in views.items()}
    return views, copies


@st.composite
def layout_choices(draw, names):
    chosen = draw(st.dictionaries(st.sampled_from(names), st.sampled_from(LAYOUTS), min_size=1))
    return chosen


@st.composite
def layout_specs(draw):
    rank = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 2))
    return CaseSpec(batch=draw(st.integers(1, 2)), seqlen=draw(st.integers(1, 24)), groups=groups,
                    heads=groups * draw(st.integers(1, 2)), state_dim=4 * draw(st.integers(1, 8)),
                    value_dim=draw(st.integers(1, 24)), rank=rank, chunk_size=draw(st.integers(1, 12)),
                    reduce_o=draw(st.booleans()), has_z=draw(st.booleans()), has_d=draw(st.booleans()),
                    formula=draw(st.sampled_from(["seed", "realistic"])), seed=draw(st.integers(0, 10 ** 6)))


def _layouts_reference(profile_name: str, examples: int):
    counter = f"layouts_reference_oracle[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data(), spec=layout_specs(), seed=st.integers(0, 10 ** 6))
    def check(data, spec, seed):
        inputs = make_inputs(spec)
        present = [n for n in INPUT_NAMES if inputs[n] is not None]
        chosen = data.draw(layout_choices(present), label="layouts")
        note(f"{spec.case_id} {chosen}")
        COUNTS[counter] += 1
        views, copies = _layout_inputs(inputs, chosen, seed)
        snapshot = {n: v.clone() for n, v in views.items() if isinstance(v, torch.Tensor)}
        policy = "upstream_sm90"
        _assert_same_bits(call("reference", views, policy), call("reference", copies, policy), f"reference {chosen}")
        # the oracle's float64 einsums still follow the operands' strides (finding F8): equal to FP64 rounding only
        got, want = call("oracle", views, policy), call("oracle", copies, policy)
        for name in OUTPUT_NAMES:
            if getattr(want, name) is not None:
                assert mn.metrics.rel_rms(getattr(got, name), getattr(want, name)) <= 1e-13, name
                if not torch.equal(_bits(getattr(got, name)), _bits(getattr(want, name))):
                    COUNTS[f"{counter}: oracle last-bit differences (F8)"] += 1
                    break
        for n, v in snapshot.items():
            assert torch.equal(_bits(views[n]), _bits(v)), f"input {n} was written to"

    return check


test_unusual_layouts_reference_and_oracle = _layouts_reference("fast", 40)
test_unusual_layouts_reference_and_oracle_slow = pytest.mark.slow(_layouts_reference("slow", 400))


def test_reference_bits_do_not_depend_on_input_strides():
    # regression (finding F7, found by the slow layout property): a transposed view of dout changed dmimo_z by one
    # float32 ulp, because torch reduced over t in the order of the operands' strides; the reference now makes its
    # inputs contiguous first
    spec = CaseSpec(seqlen=5, state_dim=4, value_dim=4, rank=1, chunk_size=1, reduce_o=False, has_z=True, seed=0)
    inputs = make_inputs(spec)
    views, copies = _layout_inputs(inputs, {"dout": "transposed"}, seed=0)
    COUNTS["layouts_reference_oracle[regression]"] += 1
    _assert_same_bits(call("reference", views, "upstream_sm90"), call("reference", copies, "upstream_sm90"),
                      "reference, transposed dout")


def test_oracle_bits_do_not_depend_on_input_strides():
    """Finding F8 (fixed): the oracle makes its inputs contiguous, so its bits depend on the values only."""
    spec = CaseSpec(seqlen=4, state_dim=8, value_dim=4, rank=1, chunk_size=1, reduce_o=False, seed=0)
    inputs = make_inputs(spec)
    views, copies = _layout_inputs(inputs, {"dout": "strided", "q": "strided", "v": "transposed"}, seed=0)
    _assert_same_bits(call("oracle", views, "upstream_sm90"), call("oracle", copies, "upstream_sm90"),
                      "oracle, transposed v")


KERNEL_LAYOUT_SPEC = CaseSpec(seqlen=9, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True)


@pytest.mark.skipif(KERNELS is None, reason="triton is not installed")
@pytest.mark.parametrize("kinds", [("strided", "transposed", "offset"), ("expanded", "overlapping")],
                         ids=["non_contiguous", "overlapping"])
def test_unusual_layouts_kernels(kinds):
    # every input in an unusual layout at once (kinds assigned in turn); the kernels must return the bits of the
    # run on contiguous copies of the same values, and agree with the reference on them
    inputs = make_inputs(KERNEL_LAYOUT_SPEC)
    present = [n for n in INPUT_NAMES if inputs[n] is not None]
    chosen = {n: kinds[j % len(kinds)] for j, n in enumerate(present)}
    views, copies = _layout_inputs(inputs, chosen, seed=11)
    assert sum(not views[n].is_contiguous() for n in present) >= len(present) // 2
    snapshot = {n: v.clone() for n, v in views.items() if isinstance(v, torch.Tensor)}
    COUNTS["layouts_kernels[fast]"] += 1
    got = call("kernels", views, "upstream_sm90")
    want = call("kernels", copies, "upstream_sm90")
    _assert_same_bits(got, want, f"kernels {kinds}")
    ref = call("reference", copies, "upstream_sm90")
    for name in OUTPUT_NAMES:
        if getattr(ref, name) is not None:
            assert mn.metrics.rel_rms(getattr(got, name), getattr(ref, name)) <= mn.tolerances.get(
                "same_policy_rel_rms"), name
    for n, v in snapshot.items():
        assert torch.equal(_bits(views[n]), _bits(v)), f"input {n} was written to"


# ---------------------------------------------------------------------------------------------------- autograd, meta
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_inputs_requiring_grad_are_accepted(impl):
    # regression: the reference raised "add(): functions with out=... arguments don't support automatic
    # differentiation" for dt, v or mimo_v requiring grad (finding F2); it now runs under torch.no_grad
    inputs = base_inputs(0)
    want = call(impl, inputs, "upstream_sm90")
    graded = {n: (v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point()
                  else v) for n, v in inputs.items()}
    got = call(impl, graded, "upstream_sm90")
    for name in OUTPUT_NAMES:
        a, b = getattr(got, name), getattr(want, name)
        if b is not None:
            assert torch.equal(_bits(a.detach()), _bits(b)), name
            if impl != "oracle":  # the oracle is plain differentiable torch code; the others are not
                assert not a.requires_grad, name


@pytest.mark.parametrize("impl", ["reference", "oracle"])
def test_meta_tensors_give_shape_only_outputs(impl):
    inputs = base_inputs(0)
    meta = {n: (v.to("meta") if isinstance(v, torch.Tensor) else v) for n, v in inputs.items()}
    want = call(impl, inputs, "upstream_sm90")
    got = call(impl, meta, "upstream_sm90")
    for name in OUTPUT_NAMES:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.device.type == "meta" and a.shape == b.shape and a.dtype == b.dtype, name


@pytest.mark.skipif(KERNELS is None, reason="triton is not installed")
def test_kernels_refuse_meta_tensors_naming_the_device():
    inputs = base_inputs(0)
    meta = {n: (v.to("meta") if isinstance(v, torch.Tensor) else v) for n, v in inputs.items()}
    with pytest.raises(ValueError, match="meta"):
        call("kernels", meta, "upstream_sm90")


def test_float_sizes_are_refused_even_when_integral():
    # 4.0 and nan are floats: refused with TypeError naming the argument (no silent int() conversion)
    for value in (4.0, math.nan):
        inputs = base_inputs(0)
        inputs["chunk_size"] = value
        with pytest.raises(TypeError, match="chunk_size must be an int"):
            call("reference", inputs, "upstream_sm90")
