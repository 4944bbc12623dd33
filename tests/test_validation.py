"""Bad inputs raise ValueError/TypeError naming the argument, in the reference and the oracle alike."""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

SPEC = CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=2, chunk_size=4, reduce_o=True, has_z=True, has_d=True,
                heads=2, groups=1)


def _inputs():
    return make_inputs(SPEC)


def _set(name, value):
    def mutate(inputs):
        inputs[name] = value(inputs) if callable(value) else value
    return mutate


BAD_INPUTS = [
    # (id, mutation, error type, text the message must contain)
    ("q_wrong_rank", _set("q", lambda i: i["q"][0]), ValueError, "q"),
    ("v_wrong_rank", _set("v", lambda i: i["v"][..., 0]), ValueError, "v"),
    ("k_wrong_shape", _set("k", lambda i: i["k"][:, :4]), ValueError, "k"),
    ("q_float32", _set("q", lambda i: i["q"].float()), TypeError, "q"),
    ("k_float16_mixed", _set("k", lambda i: i["k"].half()), TypeError, "k"),
    ("trap_float32", _set("trap", lambda i: i["trap"].float()), TypeError, "trap"),
    ("q_bias_bf16", _set("q_bias", lambda i: i["q_bias"].bfloat16()), TypeError, "q_bias"),
    ("mimo_v_wrong_shape", _set("mimo_v", lambda i: i["mimo_v"][:, :1]), ValueError, "mimo_v"),
    ("angles_wrong_width", _set("angles", lambda i: torch.zeros(1, 8, 2, 8)), ValueError, "angles"),
    ("segsum_wrong_chunks", _set("segsum", lambda i: i["segsum"][:, :, :1]), ValueError, "segsum"),
    ("dt_wrong_length", _set("dt", lambda i: i["dt"][..., :5]), ValueError, "dt"),
    ("d_wrong_shape", _set("d", lambda i: torch.zeros(3)), ValueError, "d"),
    ("dout_full_layout_with_mimo_o", _set("dout", lambda i: torch.zeros(1, 8, 2, 2, 16, dtype=torch.bfloat16)),
     ValueError, "dout"),
    ("z_without_mimo_z", _set("mimo_z", None), ValueError, "mimo_z"),
    ("mimo_z_without_z", _set("z", None), ValueError, "z"),
    ("q_missing", _set("q", None), TypeError, "q"),
    ("v_not_a_tensor", _set("v", [[1.0]]), TypeError, "v"),
    ("chunk_size_zero", _set("chunk_size", 0), ValueError, "chunk_size"),
    ("chunk_size_float", _set("chunk_size", 4.0), TypeError, "chunk_size"),
    ("chunk_size_bool", _set("chunk_size", True), TypeError, "chunk_size"),
    ("rotary_divisor_3", _set("rotary_dim_divisor", 3), ValueError, "rotary_dim_divisor"),
    ("heads_not_multiple_of_groups", lambda i: i.update(
        q=torch.zeros(1, 8, 2, 3, 16, dtype=torch.bfloat16), k=torch.zeros(1, 8, 2, 3, 16, dtype=torch.bfloat16)),
     ValueError, "H % G"),
    ("n_not_divisible_by_rotary", lambda i: i.update(
        q=torch.zeros(1, 8, 2, 1, 18, dtype=torch.bfloat16), rotary_dim_divisor=4), ValueError, "rotary_dim_divisor"),
    ("empty_batch", lambda i: i.update(q=i["q"][:0]), ValueError, "empty dimension B"),
    ("empty_heads", lambda i: i.update(v=i["v"][:, :, :0]), ValueError, "empty dimension H"),
    ("device_mismatch", _set("dt", lambda i: i["dt"].to("meta")), ValueError, "dt"),
]


def _call(fn, inputs, **kw):
    args = [inputs[n] for n in mn.INPUT_NAMES]
    return fn(*args, chunk_size=inputs["chunk_size"], rotary_dim_divisor=inputs["rotary_dim_divisor"], **kw)


@pytest.mark.parametrize("mutate, error, text", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_reference_rejects_bad_input_naming_the_argument(mutate, error, text):
    inputs = _inputs()
    mutate(inputs)
    with pytest.raises(error, match=text.replace("%", "%")):
        _call(stage1_reference.mamba_mimo_bwd_fwd, inputs, policy="seed_bf16")


@pytest.mark.parametrize("mutate, error, text", [b[1:] for b in BAD_INPUTS[::4]], ids=[b[0] for b in BAD_INPUTS[::4]])
def test_oracle_rejects_bad_input_naming_the_argument(mutate, error, text):
    inputs = _inputs()
    mutate(inputs)
    with pytest.raises(error, match=text):
        _call(stage1_oracle.mamba_mimo_bwd_fwd_oracle, inputs)


def test_reference_rejects_inputs_of_another_lp_dtype_than_the_policy():
    with pytest.raises(TypeError, match="lp_dtype"):
        _call(stage1_reference.mamba_mimo_bwd_fwd, _inputs(), policy="upstream_sm90_fp16")


def test_reference_rejects_unknown_policy_names():
    with pytest.raises(ValueError, match="unknown preset"):
        _call(stage1_reference.mamba_mimo_bwd_fwd, _inputs(), policy="nope")


def test_reference_accepts_non_contiguous_views():
    inputs = _inputs()
    expected = _call(stage1_reference.mamba_mimo_bwd_fwd, inputs, policy="seed_bf16")
    inputs["v"] = torch.stack([inputs["v"], -inputs["v"]], dim=-1)[..., 0]  # every other element of a buffer
    assert not inputs["v"].is_contiguous()
    got = _call(stage1_reference.mamba_mimo_bwd_fwd, inputs, policy="seed_bf16")
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_segsum_of_another_chunk_size_names_chunk_size_and_its_default():
    """C=8 data called without chunk_size: the message says chunk_size defaulted to 16 and what to pass."""
    inputs = make_inputs(CaseSpec(seqlen=32, state_dim=16, value_dim=16, rank=2, chunk_size=8))
    args = [inputs[n] for n in mn.INPUT_NAMES]
    for fn in (stage1_reference.mamba_mimo_bwd_fwd, stage1_oracle.mamba_mimo_bwd_fwd_oracle):
        with pytest.raises(ValueError, match=r"segsum has chunk size 8 .* but chunk_size=16 \(the default when "
                                             r"chunk_size is not passed\): pass chunk_size=8"):
            fn(*args)
    with pytest.raises(ValueError, match=r"segsum has chunk size 8 .* but chunk_size=4: pass chunk_size=8"):
        stage1_reference.mamba_mimo_bwd_fwd(*args, chunk_size=4)


# ---------------------------------------------------------------------------------------------------------------
# Messages a new user hit (issue 21): a size read from one tensor names that tensor too; a swapped DT/ADT pair.

def test_a_size_that_disagrees_names_the_tensor_it_was_read_from():
    """v with the wrong P makes dout (the first input read after it) disagree: the message names dout and v."""
    inputs = _inputs()
    inputs["v"] = inputs["v"][..., :8].contiguous()
    with pytest.raises(ValueError) as info:
        _call(stage1_reference.mamba_mimo_bwd_fwd, inputs, policy="seed_bf16")
    message = str(info.value)
    assert message.startswith("dout must have shape [1, 8, 2, 8], got [1, 8, 2, 16]")
    assert "P = 8 is read from v [1, 8, 2, 8]" in message


def _op_inputs(**fields):
    from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case

    x = make_op_inputs(small_case(**{"seqlen": 8, "value_dim": 8, "chunk_size": 4, **fields}))
    return {n: x[n] for n in OP_INPUT_NAMES}, x


def test_the_whole_op_names_both_tensors_of_a_wrong_v_shape():
    """The newcomer's case: a wrong V reported as 'MIMO_V must have shape [2, 2, 8], got [2, 2, 16]' alone."""
    from mimo_numerics.ops.mamba3_mimo.validation import OPTIONAL_INPUTS  # noqa: F401  (the module under test)

    tensors, x = _op_inputs(value_dim=16)
    tensors["V"] = tensors["V"][..., :8].contiguous()
    with pytest.raises(ValueError) as info:
        mn.mamba3_mimo(*tensors.values(), chunk_size=4, rotary_dim_divisor=4)
    message = str(info.value)
    assert message.startswith("MIMO_V must have shape [2, 2, 8], got [2, 2, 16]")
    assert "P = 8 is read from V [1, 8, 2, 8]" in message


def test_a_swapped_dt_adt_pair_is_refused_by_sign():
    tensors, _ = _op_inputs()
    tensors["ADT"], tensors["DT"] = tensors["DT"], tensors["ADT"]
    for fn in (mn.mamba3_mimo, _fp64_model()):
        with pytest.raises(ValueError, match=r"DT has negative entries and ADT positive ones: were DT and ADT "
                                             r"swapped\?"):
            fn(*tensors.values(), chunk_size=4, rotary_dim_divisor=4)


def test_a_negative_dt_alone_warns_and_a_positive_adt_alone_is_legal():
    tensors, _ = _op_inputs()
    negative = dict(tensors, DT=-tensors["DT"])
    with pytest.warns(UserWarning, match="DT has negative entries"):
        mn.mamba3_mimo(*negative.values(), chunk_size=4, rotary_dim_divisor=4)
    positive_adt, _ = _op_inputs(positive_adt=True)  # upstream's clamp acts: a legal input
    assert (positive_adt["ADT"] > 0).any()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mn.mamba3_mimo(*positive_adt.values(), chunk_size=4, rotary_dim_divisor=4)


def _fp64_model():
    from mimo_numerics.ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64

    return mamba3_mimo_fp64
