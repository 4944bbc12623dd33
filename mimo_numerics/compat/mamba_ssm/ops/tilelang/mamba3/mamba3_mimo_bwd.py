"""Upstream's ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd``: ``mamba_mimo_bwd_combined``
(``mimo_numerics.compat``)."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from mimo_numerics import compat
from mimo_numerics.ops.mamba3_mimo import chain

#: Upstream's 14 outputs, in its order, by the package's names: ``(stage or epilogue, key)``.
COMBINED_OUTPUTS = (("epilogue", "dQ"), ("epilogue", "dK"), ("epilogue", "dV"), ("epilogue", "dADT"),
                    ("epilogue", "ddt_core"), ("epilogue", "dTrap"), ("epilogue", "dQ_bias"),
                    ("epilogue", "dK_bias"), ("epilogue", "dMIMO_V"), ("epilogue", "dMIMO_Z"),
                    ("epilogue", "dMIMO_Out"), ("stage2", "dangles"), ("epilogue", "dD"), ("epilogue", "dZ"))


def mamba_mimo_bwd_combined(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, dA_cs, dA_cs_rev, dt,
                            trap, D, segsum, chunk_size, rotary_dim_divisor, dtype, bf_threads: int = 128,
                            bf_num_stages: int = 0, bb_threads: int = 256, bb_num_stages: int = 0, *,
                            policy=None) -> Tuple:
    """Upstream's backward under ``policy`` (default ``compat.default_policy()``): stage 1 -> stage 2 -> the torch
    sums and FP32 helpers after them (``bwd_dtrap_ddt``, ``bwd_dadt_fused``), not the angle backward.

    Args: upstream's, in its order (``angles`` the cumulative angles, as upstream passes them); ``dtype`` a
    ``torch.dtype`` or its name, equal to ``q``'s; the ``bf_*``/``bb_*`` launch knobs are ignored.

    Returns:
        tuple: upstream's 14 gradients ``(dq, dk, dv, ddA, ddt, dtrap, dq_bias, dk_bias, dmimo_v, dmimo_z,
        dmimo_o, dangles, dD, dz)``: ``ddA`` is the op's ``dADT``, ``ddt`` the trapezoid part of ``dDT``
        (``ddt_core``), ``dangles`` stage 2's gradient of the cumulative angles; ``dq_bias``/``dk_bias`` in lp as
        upstream's sums of lp tensors (float64 under the fp64 policy, as every output then).
    """
    del bf_threads, bf_num_stages, bb_threads, bb_num_stages  # launch knobs of upstream's TileLang kernels
    compat.check_dtype(dtype, q.dtype)
    policy = compat.policy_for(policy, q)
    backend = compat.default_backend()
    inputs = {"Q": q, "K": k, "V": v, "Q_bias": q_bias, "K_bias": k_bias, "MIMO_V": mimo_v, "MIMO_Out": mimo_o,
              "Z": z, "MIMO_Z": mimo_z, "DT": dt, "Trap": trap, "D": D, "dout": dout, "chunk_size": chunk_size,
              "rotary_dim_divisor": rotary_dim_divisor,
              # the epilogue also runs the angle backward, whose outputs are not upstream's here: it reads the
              # cumulative angles in place of the raw ones and its dAngles/dDT_angle are dropped
              "Angles": angles}
    pre = {"angles_cumsum": angles, "da_cs": dA_cs, "da_cs_rev": dA_cs_rev, "segsum": segsum}
    stage1 = chain.run_stage1(inputs, pre, policy, backend=backend)
    stage2 = chain.run_stage2(inputs, pre, stage1, policy, backend=backend)
    epilogue = chain.run_epilogue(inputs, pre, stage1, stage2, policy)
    found = {"epilogue": epilogue, "stage2": stage2}
    grads = [found[where][name] for where, name in COMBINED_OUTPUTS]
    lp = q.dtype
    for i in (6, 7):  # upstream sums the lp dq/dk over (B, S) in lp: bf16 bias gradients
        if grads[i].dtype == torch.float32:
            grads[i] = grads[i].to(lp)
    return tuple(grads)
