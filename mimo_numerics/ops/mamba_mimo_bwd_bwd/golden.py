"""Stage 2's golden cases: the whole-op H200 data with upstream's recorded preprocessing and stage-1 outputs
(``bwd_fwd.states``, ``bwd_fwd.qk_dot``) as inputs and ``bwd_bwd`` as outputs."""

from __future__ import annotations

from ..mamba3_mimo import golden as _golden
from .spec import INPUT_NAMES


def _stage1_outputs(case: dict) -> dict:
    return {"states": case["bwd_fwd"]["states"], "qk_dot": case["bwd_fwd"]["qk_dot"]}


def stored_cases(paths=None):
    """The cases as ``StoredCase`` objects."""
    return _golden.stored_cases("bwd_bwd", INPUT_NAMES, extra=_stage1_outputs, paths=paths)


def upstream_outputs(name: str, paths=None):
    """Upstream's raw stage-2 outputs of case ``name`` (the ``*_unchanged`` flags left out)."""
    out = _golden.upstream_outputs(name, "bwd_bwd", paths)
    return None if out is None else {k: v for k, v in out.items() if not k.endswith("_unchanged")}


def golden_inputs(case: dict) -> dict:
    """Stage-2 arguments by name from a golden whole-op ``case``: raw inputs, the ``pre`` tensors, stage 1's
    recorded ``states`` and ``qk_dot``, ``dout``, ``chunk_size`` and ``rotary_dim_divisor``."""
    inp, pre, bwd_fwd = case["inputs"], case["pre"], case["bwd_fwd"]
    return {
        "dout": inp["dout"], "q": inp["Q"], "k": inp["K"], "v": inp["V"], "q_bias": inp["Q_bias"],
        "k_bias": inp["K_bias"], "mimo_v": inp["MIMO_V"], "mimo_o": inp["MIMO_Out"], "states": bwd_fwd["states"],
        "z": inp["Z"], "mimo_z": inp["MIMO_Z"], "angles": pre["angles_cumsum"], "da_cs": pre["da_cs"],
        "da_cs_rev": pre["da_cs_rev"], "dt": inp["DT"], "trap": inp["Trap"], "d": inp["D"],
        "qk_dot": bwd_fwd["qk_dot"], "segsum": pre["segsum"],
        "chunk_size": inp["chunk_size"], "rotary_dim_divisor": inp["rotary_dim_divisor"],
    }
