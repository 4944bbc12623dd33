"""Loader of the golden outputs of the real upstream kernel on an NVIDIA H200 (``tests/data``).

The file ``tests/data/upstream_h200_seed_cases.pt`` (provenance in ``tests/data/README.md``) maps a case name to
``{"kind", "kw", "inputs", "upstream"}``: ``inputs`` holds the 17 tensors of the API by name plus ``chunk_size`` and
``rotary_dim_divisor``; ``upstream`` the five outputs as the kernel wrote them (``dmimo_o``/``dmimo_z`` per batch,
``[B, H, R, P]``; None where a branch is off).

Usage::

    from mimo_numerics import golden
    cases = golden.load_golden()                 # name -> (inputs, upstream outputs)
    inputs, upstream = cases["seed_branch_ro1_z1_d1"]

The default path is the repository's ``tests/data`` file, found relative to this package (the package is installed
editable); no packaged copy exists, so a non-editable install must pass ``path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import torch

from ... import golden_data
from .outputs import INPUT_NAMES, OUTPUT_NAMES

#: The golden file of the repository, located relative to the package (``mimo_numerics.golden_data``).
DEFAULT_PATH = golden_data.path("seed_cases", must_exist=False)
#: A golden case with every branch on (reduced DOUT, Z and D), S = 32, R = 4: the default of reports and notebooks.
DEFAULT_CASE = "seed_branch_ro1_z1_d1"

PathLike = Union[str, Path]
_CACHE: Dict[str, dict] = {}


def default_path() -> Path:
    """Path of the repository's golden file (it may not exist outside a source checkout)."""
    return DEFAULT_PATH


def _raw(path: Optional[PathLike]) -> dict:
    resolved = Path(path) if path is not None else DEFAULT_PATH
    key = str(resolved.resolve()) if resolved.exists() else str(resolved)
    if key not in _CACHE:
        if not resolved.exists():
            raise FileNotFoundError(
                f"golden file {resolved} does not exist; mimo_numerics finds tests/data/upstream_h200_seed_cases.pt "
                f"relative to the package only in an editable (source) install: pass path= otherwise")
        data = torch.load(resolved, weights_only=True)
        if not isinstance(data, dict):
            raise ValueError(f"golden file {resolved} must hold a dict of cases, got {type(data).__name__}")
        for name, case in data.items():
            for key_name in ("inputs", "upstream"):
                if key_name not in case:
                    raise ValueError(f"golden case {name!r} in {resolved} lacks {key_name!r}")
            missing = [n for n in INPUT_NAMES + ("chunk_size", "rotary_dim_divisor") if n not in case["inputs"]]
            if missing:
                raise ValueError(f"golden case {name!r} lacks inputs {missing}")
        _CACHE[key] = data
    return _CACHE[key]


def load_golden(path: Optional[PathLike] = None) -> Dict[str, Tuple[dict, dict]]:
    """The golden cases as ``name -> (inputs, upstream outputs)``.

    Args:
        path (str | Path, optional): the ``.pt`` file; default :data:`DEFAULT_PATH`.

    Returns:
        dict: case name (file order) -> ``(inputs, outputs)``; ``inputs`` has the 17 tensors by name (None for
        absent optional ones) plus ``chunk_size`` and ``rotary_dim_divisor``; ``outputs`` has the five output names
        (None where a branch is off). The dicts are fresh copies; the tensors are shared with a per-path cache, so
        do not modify them in place.

    Raises:
        FileNotFoundError: when the file does not exist (the message says why the default may be missing).
        ValueError: when the file is not in the documented layout.
    """
    data = _raw(path)
    result = {}
    for name, case in data.items():
        inputs = {n: case["inputs"][n] for n in INPUT_NAMES}
        inputs["chunk_size"] = int(case["inputs"]["chunk_size"])
        inputs["rotary_dim_divisor"] = int(case["inputs"]["rotary_dim_divisor"])
        outputs = {n: case["upstream"].get(n) for n in OUTPUT_NAMES}
        result[name] = (inputs, outputs)
    return result


def golden_names(path: Optional[PathLike] = None) -> Tuple[str, ...]:
    """Names of the golden cases, in file order."""
    return tuple(_raw(path))


def golden_case(name: str, path: Optional[PathLike] = None) -> Tuple[dict, dict]:
    """``(inputs, upstream outputs)`` of one golden case; ``KeyError`` listing the names otherwise."""
    cases = load_golden(path)
    if name not in cases:
        raise KeyError(f"unknown golden case {name!r}; known cases: {list(cases)}")
    return cases[name]


def upstream_outputs(name: str, path: Optional[PathLike] = None) -> dict:
    """Upstream's outputs of golden case ``name`` by output name (the interface the operators' golden modules
    share); ``KeyError`` listing the names for an unknown case."""
    return golden_case(name, path)[1]


def golden_kwargs(name: str, path: Optional[PathLike] = None) -> dict:
    """The seed-formula keyword arguments the case was drawn with (``kw`` in the file)."""
    data = _raw(path)
    if name not in data:
        raise KeyError(f"unknown golden case {name!r}; known cases: {list(data)}")
    return dict(data[name].get("kw", {}))


def stored_cases(path: Optional[PathLike] = None):
    """The golden cases as :class:`mimo_numerics.cases.StoredCase` objects (sizes from their seed-formula kwargs,
    inputs the stored tensors), for gates and sweeps on the very inputs upstream saw."""
    from ...cases import StoredCase, spec_from_seed_kwargs

    out = []
    for name, (inputs, _) in load_golden(path).items():
        fields = spec_from_seed_kwargs(golden_kwargs(name, path)).to_dict()
        out.append(StoredCase(**fields, source=name, inputs=inputs))
    return out
