"""The shapes the benchmarks and the bit-identity check share (``benchmarks/README.md`` lists who uses them).

``HEADLINE``: the seed PR's headline shape (a) of stage 1, B=1, S=8192, H=16, G=1, N=P=64, R=4, C=16 with D, Z and
reduced DOUT, realistic formula, seed 0: timed by ``benchmarks/bench_reference.py`` and
``benchmarks/profile_reference.py``, checked bit for bit by ``scripts/check_reference_bits.py``.
"""

from __future__ import annotations

from typing import Any, Dict

#: The fields of the headline ``CaseSpec`` (plain values, so that a benchmark worker of another commit can build it).
HEADLINE_FIELDS: Dict[str, Any] = dict(batch=1, seqlen=8192, heads=16, groups=1, state_dim=64, value_dim=64, rank=4,
                                       chunk_size=16, reduce_o=True, has_z=True, has_d=True, formula="realistic",
                                       seed=0)


#: The kernel benchmark's shapes (``benchmarks/bench_kernels.py --shapes``): sizes; the rest as in :func:`kernel_shape`.
KERNEL_SHAPES: Dict[str, Dict[str, int]] = {
    "a": dict(batch=1, seqlen=8192, heads=16, state_dim=64),
    "b": dict(batch=4, seqlen=2048, heads=16, state_dim=64),
    "c": dict(batch=1, seqlen=8192, heads=16, state_dim=128),
    "d": dict(batch=8, seqlen=4096, heads=32, state_dim=64),
    "t": dict(batch=1, seqlen=2048, heads=32, state_dim=128),  # upstream's tuned shape (its own benchmark's)
    "s": dict(batch=1, seqlen=24, heads=2, state_dim=16),  # --smoke (CPU dry run)
}


def kernel_shape(shape: str):
    """Kernel benchmark shape ``shape`` (a key of :data:`KERNEL_SHAPES`) as a ``CaseSpec``: P=64, R=4, C=16, G=1,
    D, Z and reduced DOUT, realistic formula, seed 0."""
    from .cases import CaseSpec

    if shape not in KERNEL_SHAPES:
        raise ValueError(f"shape must be one of {sorted(KERNEL_SHAPES)}, got {shape!r}")
    return CaseSpec(formula="realistic", groups=1, value_dim=64, rank=4, chunk_size=16, reduce_o=True, has_z=True,
                    has_d=True, seed=0, **KERNEL_SHAPES[shape])


def headline():
    """The headline shape as a ``mimo_numerics.cases.CaseSpec``."""
    from .cases import CaseSpec

    return CaseSpec(**HEADLINE_FIELDS)


def __getattr__(name):  # ``from mimo_numerics.benchmark_cases import HEADLINE`` without importing torch at import
    if name == "HEADLINE":
        return headline()
    raise AttributeError(name)
