"""The tensor inputs of the kernels: each one's dimension letters and dtype class, written once.

The forward, stage 1 and stage 2 take overlapping sets of these tensors, with the same shape and dtype wherever a
name recurs; each operator's spec takes the entries of its own inputs (``inputs_of``), and the generic validation
(``mimo_numerics.validation.check_inputs``) checks them.

Letters: B, S, R, G, N from ``q`` ``[B, S, R, G, N]``, H and P from ``v`` ``[B, S, H, P]``; ``nc`` = ceil(S / C),
``C`` the chunk size, ``N/d`` the rotary angles per head (column j of N pairs with N/2 + j for j < N/d); ``(R)``
is present only without ``mimo_o`` (the unreduced ``dout`` ``[B, S, R, H, P]``).
"""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

#: Dimension letters of every kernel input (inputs of one shape listed together).
KERNEL_INPUT_SHAPES: Dict[str, Tuple[str, ...]] = {
    "dout": ("B", "S", "(R)", "H", "P"),
    **dict.fromkeys(("q", "k"), ("B", "S", "R", "G", "N")),
    **dict.fromkeys(("v", "z"), ("B", "S", "H", "P")),
    **dict.fromkeys(("q_bias", "k_bias"), ("H", "R", "N")),
    **dict.fromkeys(("mimo_v", "mimo_o", "mimo_z"), ("H", "R", "P")),
    "states": ("B", "H", "nc", "N", "P"),
    "d": ("H",),
    "angles": ("B", "S", "H", "N/d"),
    **dict.fromkeys(("da_cs", "da_cs_rev", "dt", "trap"), ("B", "H", "S")),
    "qk_dot": ("B", "H", "S", "R", "R"),
    "segsum": ("B", "H", "nc", "C", "C"),
}
#: The inputs in the low-precision dtype (upstream's ``dtype``, the policy's ``lp_dtype``); every other one is
#: float32.
KERNEL_LP_INPUTS: Tuple[str, ...] = ("dout", "q", "k", "v", "states", "z", "trap", "qk_dot")


def inputs_of(names: Iterable[str]) -> Tuple[Dict[str, Tuple[str, ...]], Tuple[str, ...]]:
    """``(input_shapes, lp_inputs)`` of an operator whose tensor inputs are ``names`` (in API order)."""
    names = tuple(names)
    unknown = [n for n in names if n not in KERNEL_INPUT_SHAPES]
    if unknown:
        raise KeyError(f"no shape is declared for kernel inputs {unknown}")
    return {n: KERNEL_INPUT_SHAPES[n] for n in names}, tuple(n for n in names if n in KERNEL_LP_INPUTS)
