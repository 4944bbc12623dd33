"""The thresholds of the accuracy gates (:mod:`mimo_numerics.testing`), read from ``mimo_numerics.tolerances``.

:class:`GateSettings` holds the four numbers one gate applies (same-policy tolerance, noise factor, the noise-floor
gate's ``alpha`` and ``floor``); :class:`SettingsByOutput` gives each (output, lp format) of one run its own, the
caller's values first and the most specific tolerance entry for the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from . import operator as _operator
from . import tolerances as _tolerances
from .gate_cases import OperatorLike

__all__ = ["GateSettings", "SettingsByOutput"]


@dataclass(frozen=True)
class GateSettings:
    """The thresholds one gate applies.

    Attributes:
        tol_same (float): lower bound of the same-policy tolerance (rel RMS against ``reference[P]``).
        noise_factor (float): the same-policy tolerance is ``max(tol_same, noise_factor · noise)``; 0 turns the
            per-case noise floor off.
        alpha (float): noise-floor gate factor on ``rel_rms(reference[P], oracle)``.
        floor (float): noise-floor gate additive term (rel RMS).
        entries (tuple): ``(setting, tolerances entry)`` pairs for the values read from ``mimo_numerics.tolerances``
            (a value given by the caller has none); not compared.
    """

    tol_same: float
    noise_factor: float
    alpha: float
    floor: float
    entries: Tuple[Tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def from_table(cls, tol_same=None, noise_factor=None, alpha=None, floor=None, op: OperatorLike = None,
                   output: Optional[str] = None, fmt: Optional[str] = None) -> "GateSettings":
        """Settings with every ``None`` taken from ``tolerances.gate_settings(op, output, fmt)`` (the most specific
        entry for the operator, output and lp format; ``op=None``: the default operator)."""
        table = _tolerances.gate_settings(_operator.get(op).name, output, fmt)
        given = {"tol_same": tol_same, "noise_factor": noise_factor, "alpha": alpha, "floor": floor}
        values = {k: (table[k][0] if v is None else v) for k, v in given.items()}
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if values["alpha"] < 1.0:
            raise ValueError(f"alpha must be >= 1 (a kernel may be as accurate as its policy), got {values['alpha']}")
        entries = tuple((k, table[k][1]) for k, v in given.items() if v is None)
        return cls(**{k: float(v) for k, v in values.items()}, entries=entries)

    def formulas(self) -> Tuple[str, str]:
        """The two gate formulas with these numbers: ``(same-policy, noise floor)``."""
        return (f"same-policy: rel_rms(fn, ref[P]) <= max({self.tol_same:.1e}, {self.noise_factor:g}·noise)",
                f"noise floor: rel_rms(fn, fp64) <= {self.alpha:g}·rel_rms(ref[P], fp64) + {self.floor:.1e}")

    def describe(self) -> str:
        """The two gate formulas with these numbers, on one line."""
        return "; ".join(self.formulas())

    def to_dict(self) -> dict:
        """The four values and the tolerance entries they came from."""
        return {"tol_same": self.tol_same, "noise_factor": self.noise_factor, "alpha": self.alpha,
                "floor": self.floor, "entries": dict(self.entries)}


class SettingsByOutput:
    """The settings of each (output, lp format) of one gate run: the caller's values, the rest from the table."""

    def __init__(self, op, overrides: Mapping[str, Optional[float]]):
        self._op, self._overrides, self._cache = op, dict(overrides), {}

    def __call__(self, output: Optional[str] = None, fmt: Optional[str] = None) -> GateSettings:
        key = (output, fmt)
        if key not in self._cache:
            self._cache[key] = GateSettings.from_table(**self._overrides, op=self._op, output=output, fmt=fmt)
        return self._cache[key]
