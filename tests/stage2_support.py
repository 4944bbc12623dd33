"""Shared helpers of the stage-2 oracle and epilogue tests: the golden whole-op file and argument builders.

``GOLDEN_FULL_OP`` is the one place that names the golden file (``shared/golden/README.md``); the integrator repoints
it to ``tests/data``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from unittest import mock

import torch

GOLDEN_FULL_OP = Path(__file__).parent / "data" / "upstream_h200_full_op_cases.pt"
GOLDEN_FULL_OP_SHA256 = "91b5d11984d66cb9a69a3b48369ff6ddd947ec51792681111b74199f60d8c3cf"

#: Stage-2 arguments that come from stage 1 (``bwd_fwd``) and from the preprocessing (``pre``).
_STAGE1_FOR_STAGE2 = ("states", "qk_dot")
_EPILOGUE_STAGE2 = ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA",
                    "ddA_cs_rev", "ddA_cs")


@lru_cache(maxsize=1)
def load_full_op() -> dict:
    """The golden whole-op cases, ``name -> case`` (README beside the file)."""
    return torch.load(GOLDEN_FULL_OP, weights_only=True)


def case_names() -> list:
    return sorted(load_full_op())


def stage2_args(inputs: dict, pre: dict, bwd_fwd: dict) -> tuple:
    """The 19 tensors of ``mamba_mimo_bwd_bwd`` in the kernel's order, from the op's raw inputs (golden names),
    the preprocessing (``angles_cumsum, da_cs, da_cs_rev, segsum``) and stage 1's ``states``, ``qk_dot``."""
    return (inputs["dout"], inputs["Q"], inputs["K"], inputs["V"], inputs["Q_bias"], inputs["K_bias"],
            inputs["MIMO_V"], inputs["MIMO_Out"], bwd_fwd["states"], inputs["Z"], inputs["MIMO_Z"],
            pre["angles_cumsum"], pre["da_cs"], pre["da_cs_rev"], inputs["DT"], inputs["Trap"], inputs["D"],
            bwd_fwd["qk_dot"], pre["segsum"])


def stage2_kwargs(inputs: dict) -> dict:
    return {"chunk_size": inputs["chunk_size"], "rotary_dim_divisor": inputs["rotary_dim_divisor"]}


def epilogue_args(inputs: dict, pre: dict, bwd_fwd: dict, bwd_bwd: dict) -> tuple:
    """The 21 tensors of the epilogue in call order (``mamba3_mimo_epilogue.spec.INPUT_NAMES``)."""
    return (tuple(bwd_bwd[n] for n in _EPILOGUE_STAGE2)
            + (bwd_fwd["dmimo_o"], bwd_fwd["dz"], bwd_fwd["dmimo_z"], inputs["Trap"], inputs["DT"],
               inputs["Angles"], pre["da_cs"], pre["da_cs_rev"], pre["segsum"]))


def epilogue_kwargs(inputs: dict) -> dict:
    return {"groups": inputs["Q"].shape[3], "chunk_size": inputs["chunk_size"]}


def stage1_args(inputs: dict, pre: dict) -> tuple:
    """The 17 tensors of ``mamba_mimo_bwd_fwd`` in the API order (``mimo_numerics.INPUT_NAMES``)."""
    return (inputs["dout"], inputs["Q"], inputs["K"], inputs["V"], inputs["Q_bias"], inputs["K_bias"],
            inputs["MIMO_V"], inputs["MIMO_Out"], inputs["Z"], inputs["MIMO_Z"], pre["angles_cumsum"],
            pre["da_cs"], pre["da_cs_rev"], inputs["DT"], inputs["Trap"], inputs["D"], pre["segsum"])


def stage1_oracle_fp64(*tensors, chunk_size: int, rotary_dim_divisor: int):
    """``mimo_numerics.oracle.mamba_mimo_bwd_fwd_oracle`` on float64 preprocessing outputs.

    The stage-1 oracle checks the kernel's dtypes (``angles``, ``da_cs``, ``da_cs_rev``, ``segsum`` float32) but
    converts every tensor to float64 before computing. The FP64 chain hands it float64 tensors: this checks float32
    copies of them (shapes, pairings, everything else as usual) and runs the oracle's arithmetic on the float64
    tensors themselves.
    """
    from mimo_numerics import oracle as stage1

    checker = stage1.validate_inputs

    def check_float32_copies(*args, **kwargs):
        args = tuple(a.to(torch.float32) if isinstance(a, torch.Tensor) and a.dtype == torch.float64 else a
                     for a in args)
        return checker(*args, **kwargs)

    with mock.patch.object(stage1, "validate_inputs", check_float32_copies):
        return stage1.mamba_mimo_bwd_fwd_oracle(*tensors, chunk_size=chunk_size,
                                                rotary_dim_divisor=rotary_dim_divisor)
