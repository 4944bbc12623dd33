"""The whole-op golden data of the real upstream op on an H200, and the kernel inputs built from raw inputs.

Files (``tests/data``, provenance in ``tests/data/README.md``): ``upstream_h200_full_op_cases.pt`` (7 cases, the
shared golden set) and ``upstream_h200_full_op_extra_cases.pt`` (made with ``golden/make_golden_full_op.py``: R = 1,
R = 8, fp16, a forward tail, G = H with N = 32). Each case: ``kw``, ``inputs`` (the 14 raw inputs, ``dout``,
``chunk_size``, ``rotary_dim_divisor``), ``autograd``, ``pre``, ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post`` (a
section is absent where upstream refused, with ``refused`` saying why).

:func:`kernel_inputs` turns raw inputs plus preprocessing into the arguments of the three kernels (by the kernels'
names: ``q, k, v, ..., angles`` = the cumulative angles, ``da_cs, da_cs_rev, segsum``, ``dout``); the forward, stage
1 and stage 2 take subsets (stage 2 also ``states`` and ``qk_dot``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

from ... import golden_data

#: The golden files, found relative to the package (an editable / source install): ``mimo_numerics.golden_data``.
FILES = tuple(golden_data.FILES[key].path for key in golden_data.WHOLE_OP_KEYS)
_CACHE: Dict[str, dict] = {}


def load(paths=None) -> Dict[str, dict]:
    """The golden whole-op cases by name, from ``paths`` (default :data:`FILES`), cached."""
    out: Dict[str, dict] = {}
    for path in (paths or FILES):
        path = Path(path)
        key = str(path.resolve())
        if key not in _CACHE:
            if not path.is_file():
                raise FileNotFoundError(f"golden file {path} does not exist (found relative to the package only in "
                                        "an editable install; pass paths=)")
            _CACHE[key] = torch.load(path, weights_only=True)
        out.update(_CACHE[key])
    return out


#: ``dacs_segsum_kernel``'s autotuned ``num_warps`` in the run that recorded a golden case, where it differs from
#: ``preprocess.SEGSUM_DEFAULT_NUM_WARPS`` (8, the main file's run) and changes ``segsum`` (C = 16): found by
#: reproducing that case's ``segsum`` bit for bit with one pick and not the other. A runtime pick of each process
#: (the autotuner's timing), not a numerics choice; pass it as ``segsum_num_warps`` to model that run.
SEGSUM_NUM_WARPS_OF_RUN: Dict[str, int] = {"x_B1_S64_H2_N64_P64_R4_C16_zdo_fp16": 4,
                                           "l_B1_S2048_H2_N64_P64_R4_C16_zdo": 4,
                                           "l_B1_S8192_H2_N64_P64_R4_C16_zdo": 4}


def kernel_inputs(raw: dict, pre: dict) -> dict:
    """The kernels' arguments by name from raw op inputs (``Q, K, V, ...``, ``dout``) and preprocessing
    (``angles_cumsum``, ``da_cs``, ``da_cs_rev``, ``segsum``)."""
    return {
        "dout": raw.get("dout"), "q": raw["Q"], "k": raw["K"], "v": raw["V"], "q_bias": raw["Q_bias"],
        "k_bias": raw["K_bias"], "mimo_v": raw["MIMO_V"], "mimo_o": raw["MIMO_Out"], "z": raw["Z"],
        "mimo_z": raw["MIMO_Z"], "angles": pre["angles_cumsum"], "da_cs": pre["da_cs"],
        "da_cs_rev": pre["da_cs_rev"], "dt": raw["DT"], "trap": raw["Trap"], "d": raw["D"], "segsum": pre["segsum"],
        "chunk_size": int(raw["chunk_size"]), "rotary_dim_divisor": int(raw["rotary_dim_divisor"]),
    }


def preprocess(raw: dict, math_dtype=torch.float32) -> dict:
    """Upstream's preprocessing of raw inputs in torch (``preprocess.angle_cumsum``, ``preprocess.dacs_segsum``)."""
    from .preprocess import angle_cumsum, dacs_segsum

    C = int(raw["chunk_size"])
    da_cs, da_cs_rev, segsum = dacs_segsum(raw["ADT"], C, math_dtype=math_dtype)
    return {"angles_cumsum": angle_cumsum(raw["Angles"], raw["DT"], C, math_dtype=math_dtype), "da_cs": da_cs,
            "da_cs_rev": da_cs_rev, "segsum": segsum}


def spec_fields(case: dict) -> dict:
    """The ``mimo_numerics.cases.CaseSpec`` fields describing a golden case's sizes and branches."""
    raw = case["inputs"]
    B, S, R, G, N = raw["Q"].shape
    H, P = raw["V"].shape[2], raw["V"].shape[3]
    return dict(batch=B, seqlen=S, heads=H, groups=G, state_dim=N, value_dim=P, rank=R,
                chunk_size=int(raw["chunk_size"]), reduce_o=raw["MIMO_Out"] is not None, has_z=raw["Z"] is not None,
                has_d=raw["D"] is not None, dtype=str(raw["Q"].dtype).replace("torch.", ""),
                rotary_dim_divisor=int(raw["rotary_dim_divisor"]))


def stored_cases(section: str, input_names, extra: Optional[callable] = None, paths=None) -> List:
    """The golden cases with a ``section`` (``"fwd"``, ``"bwd_fwd"``, ``"bwd_bwd"``) as
    :class:`mimo_numerics.cases.StoredCase` objects whose inputs are ``input_names`` of :func:`kernel_inputs`
    (from the recorded ``pre``), plus ``extra(case)`` (e.g. stage 1's recorded outputs for stage 2)."""
    from ...cases import StoredCase

    out = []
    for name, case in load(paths).items():
        if case.get(section) is None:
            continue
        full = kernel_inputs(case["inputs"], case["pre"])
        if extra is not None:
            full.update(extra(case))
        inputs = {n: full[n] for n in input_names}
        inputs.update(chunk_size=full["chunk_size"], rotary_dim_divisor=full["rotary_dim_divisor"])
        out.append(StoredCase(**spec_fields(case), source=name, inputs=inputs))
    return out


def upstream_outputs(name: str, section: str, paths=None) -> Optional[dict]:
    """The recorded upstream outputs of section ``section`` of case ``name`` (None where upstream refused)."""
    return load(paths)[name].get(section)
