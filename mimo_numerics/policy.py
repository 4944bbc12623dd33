"""``RoundingPolicy``: one switch per rounding site of every operator of the op, plus the knobs that change numerics.

A policy has

* **knobs** shared by every kernel, because they describe the hardware and software setup (``lp_dtype``,
  ``diag_mode``, ``math_dtype``, ``state_update``, ``silu_form``, ``round_outputs``, ``helper_fma``, the FP32-level
  models ``gemm_model``, ``reduction_order``, ``special_functions``, ``fp32_fma`` and ``tilelang`` (honoured where
  :data:`KNOB_CONSUMERS` says), and the declared FP32-level knobs of :data:`FUTURE_KNOBS`);
* one **section** per operator of the registry (:mod:`mimo_numerics.ops.registry`): the operator's rounding sites
  as :class:`Sites`, an immutable mapping ``site -> bool``, or ``None`` where the policy defines no semantics for that
  operator (``seed_bf16`` is defined by the seed PR for stage 1 only). ``policy.section(op)`` (or ``policy.<op>``)
  returns the section and raises :class:`PolicyUndefined` for an undefined one.

Fields are addressed by name: a knob by its name, a site as ``"<operator>.<site>"``. ``replace`` takes knobs, dotted
sites (``policy.replace(**{"<op>.out": False})``), whole sections (``policy.replace(<op>="none")``) and, for
compatibility with the single-operator package, bare site names of the default operator
(``registry.DEFAULT_OPERATOR``, backward stage 1: ``policy.replace(out=False)``); ``with_sites(op, **switches)``
edits one section. ``diff`` reports dotted names.
The policy is the only way to change the numerics of the references and the kernels: no environment variable does.

JSON (:data:`SCHEMA_VERSION` 2)::

    {"schema_version": 2, "base": "upstream_sm90",                 # optional
     "lp_dtype": "bfloat16", ..., "sites": {"mamba_mimo_bwd_fwd": {"psi_weight": true, ...}, "other_op": null}}

A file with ``"base"`` may leave out any field: it comes from that preset. Without ``"base"`` every knob and every
registered operator's section must be present (the error names what is missing), so a partial file is never
silently completed. Version 1 files (flat stage-1 switches and knobs, written before several operators existed) are
still read: their switches form the stage-1 section, other sections are undefined, and knobs an old file lacks take
the defaults they had then (a ``UserWarning`` names them).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import torch

from .ops import registry

SCHEMA_VERSION = 2

#: Knobs honoured today, with their allowed values (the first is the default).
KNOBS: Dict[str, Tuple[Any, ...]] = {
    "lp_dtype": ("bfloat16", "float16"),
    "diag_mode": ("fma", "mul_then_add"),
    "math_dtype": ("float32", "float64"),
    "state_update": ("accumulate_into", "separate"),
    "silu_form": ("tanh", "sigmoid"),
    "round_outputs": (True, False),
    # FP32 a·b + c in upstream's Triton helpers after stage 2 (bwd_dtrap_ddt, angle_dt's sech² = 1 − tanh²) and in
    # the decode step's rotary kernel (the new angle and the rotation, ops/mamba3_mimo/decode.py): contracted into one
    # FMA rounding, as Triton compiles them, or rounded twice (plain FP32 arithmetic)
    "helper_fma": ("contracted", "separate"),
    # how the references accumulate the GEMMs of the kernels: plain FP32 in any order, or a tensor-core model
    # (mimo_numerics.tensor_core: wgmma/mma.sync per MMA-Sim)
    "gemm_model": ("fp32", "sm90_wgmma", "sm80_mma"),
    # the order of stage 1's FP32 sums over time: torch's (pairwise), or upstream's (dΦ one FMA chain over t, dζ a
    # serial sum per chunk added to the running total)
    "reduction_order": ("pairwise", "sequential_time"),
    # exp, sigmoid, tanh, cos/sin: torch's (accurate), or the H200's fast-math MUFU approximations bit for bit
    # (mimo_numerics.mufu: ex2/rcp/tanh/sin/cos.approx, table models proven on all 2^32 inputs)
    "special_functions": ("accurate", "fast_sm90"),
    # FP32 a·b ± c inside upstream's TileLang kernels (nvcc contracts by default): plain FP32 (each product rounded,
    # then the sum), or as the H200's code computes them, the first product fused into the sum, fma(a, b, ±c): the
    # rotary rotations of q/k and the SiLU gate u/2·tanh(u/2) + u/2 (forward, both backward stages), the inverse
    # rotation and DANGLES of stage 2, stage 1's dζ terms 1 + u·σ(−u) and, with reduction_order="sequential_time",
    # its per-chunk dζ sum as an FMA chain (read from the golden data: with it the forward's o is bit-equal on every
    # golden case)
    "fp32_fma": (False, True),
    # the TileLang that compiled upstream's kernels: 0.1.8 (mamba-ssm 2.3.2.post1's pin) or 0.1.15. Read from the CUDA
    # both generate for stage 1: with reduced DOUT, 0.1.8 keeps the dζ fragment in local memory, so nvcc rounds each
    # product of `dZetaZ *= z` before the chunk's sum (FMUL then FADD), where 0.1.15 contracts them (FFMA). It acts
    # on stage 1's per-chunk dζ sum with fp32_fma and reduction_order="sequential_time"; every other order the
    # references model is the same in both versions
    "tilelang": ("0.1.8", "0.1.15"),
}

#: What honours the other values of the FP32-level knobs of KNOBS (the text of :func:`require_default`'s error);
#: every other consumer refuses them through :func:`require_default` (NotImplementedError naming the knob).
KNOB_CONSUMERS: Dict[str, str] = {
    "gemm_model": "the references of the forward and of both backward stages, and so the whole op's reference chain "
                  "(any device)",
    "reduction_order": "stage 1's reference (its sums over time)",
    "special_functions": "the references of the forward, of both backward stages, of the epilogue and of the angle "
                         "preprocessing, and so the whole op's reference chain, and the decode step (any device)",
    "fp32_fma": "the references of the forward and of both backward stages, and so the whole op's reference chain, "
                "and the decode step (any device)",
    "tilelang": "stage 1's reference (its per-chunk dζ sum with fp32_fma and reduction_order='sequential_time'; "
                "elsewhere both versions are modelled alike)",
}

#: Every FP32-level model of the H200 the whole op's reference chain honours: ``policy.replace(**FP32_LEVEL_SM90)``
#: on an ``upstream_sm90*`` preset (``reduction_order`` stays pairwise: stage 2's reference refuses another).
FP32_LEVEL_SM90: Dict[str, Any] = {"gemm_model": "sm90_wgmma", "special_functions": "fast_sm90", "fp32_fma": True}

#: FP32-level knobs of ``upstream_rounding_sites.md`` §3.2 that are declared but not honoured yet: every value but
#: the first raises ``NotImplementedError`` naming the knob (no silent fallback). None at present (the mechanism
#: stays for the next one).
FUTURE_KNOBS: Dict[str, Tuple[Any, ...]] = {}
ALL_KNOBS: Tuple[str, ...] = tuple(KNOBS) + tuple(FUTURE_KNOBS)
#: The FP32-level knobs (``upstream_rounding_sites.md`` §3.2) and their defaults: the Triton kernels compute each at
#: its default only and refuse any other value.
FP32_LEVEL_DEFAULTS: Dict[str, Any] = {**{name: KNOBS[name][0] for name in KNOB_CONSUMERS},
                                       **{name: allowed[0] for name, allowed in FUTURE_KNOBS.items()}}

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "float64": torch.float64}

SectionLike = Union["Sites", Mapping[str, bool], str, None]


class PolicyUndefined(ValueError):
    """The policy defines no rounding for this operator (its section is ``None``)."""


class Sites(Mapping):
    """The rounding switches of one operator: an immutable, hashable mapping ``site -> bool``, in kernel order,
    with attribute access (``sites.psiv``).

    Args:
        operator (str): a registered operator.
        values: ``{site: bool}`` naming every site of the operator, or ``"all"`` / ``"none"``.

    Raises:
        ValueError: unknown, missing or non-bool sites, naming them.
    """

    __slots__ = ("_operator", "_values", "_index")

    def __init__(self, operator: str, values: Union[Mapping[str, bool], str]):
        table = registry.site_table(operator)
        if isinstance(values, str):
            if values not in ("all", "none"):
                raise ValueError(f"{operator} sites must be a mapping, 'all' or 'none', got {values!r}")
            values = {site: values == "all" for site in table}
        if not isinstance(values, Mapping):
            raise TypeError(f"{operator} sites must be a mapping site -> bool, got {type(values).__name__}")
        unknown = sorted(set(values) - set(table))
        if unknown:
            raise ValueError(f"unknown {operator} site(s) {unknown}; its sites are {list(table)}")
        missing = [site for site in table if site not in values]
        if missing:
            raise ValueError(f"{operator} sites {missing} are missing (every site must be given)")
        for site in table:
            if not isinstance(values[site], bool):
                raise ValueError(f"{operator}.{site} must be a bool (a rounding switch), got {values[site]!r}")
        object.__setattr__(self, "_operator", operator)
        object.__setattr__(self, "_values", tuple((site, values[site]) for site in table))
        object.__setattr__(self, "_index", dict(self._values))  # O(1) lookups; not part of equality or the hash

    @property
    def operator(self) -> str:
        """The operator these sites belong to."""
        return self._operator

    def __getitem__(self, site: str) -> bool:
        try:
            return self._index[site]
        except (KeyError, TypeError):
            raise KeyError(f"{self._operator} has no site {site!r}; its sites are "
                           f"{[n for n, _ in self._values]}") from None

    def __getattr__(self, site: str) -> bool:
        if site.startswith("_"):
            raise AttributeError(site)
        try:
            return self[site]
        except KeyError as exc:
            raise AttributeError(str(exc)) from None

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"Sites are immutable; use .replace({name}=...)")

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sites) and (self._operator, self._values) == (other._operator, other._values)

    def __hash__(self) -> int:
        return hash((self._operator, self._values))

    def __repr__(self) -> str:
        on = [n for n, v in self._values if v]
        off = [n for n, v in self._values if not v]
        if not off:
            return f"Sites({self._operator!r}, 'all')"
        if not on:
            return f"Sites({self._operator!r}, 'none')"
        return f"Sites({self._operator!r}, off={off})"

    def __reduce__(self):
        return (Sites, (self._operator, dict(self._values)))

    def replace(self, **changes: bool) -> "Sites":
        """A copy with some switches changed (unknown names raise ``ValueError`` naming them)."""
        return Sites(self._operator, {**dict(self._values), **changes})

    def on(self) -> Tuple[str, ...]:
        """Names of the switches that are on, in kernel order."""
        return tuple(n for n, v in self._values if v)

    def to_dict(self) -> Dict[str, bool]:
        """``{site: bool}`` in kernel order."""
        return dict(self._values)


class _Sections(Mapping):
    """Operator -> ``Sites`` or None, immutable and hashable, in registry order."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Optional[Sites]]):
        object.__setattr__(self, "_items", tuple((op, items[op]) for op in registry.OPERATORS))

    def __getitem__(self, op):
        for name, value in self._items:
            if name == op:
                return value
        raise KeyError(op)

    def __iter__(self):
        return (name for name, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __eq__(self, other):
        return isinstance(other, _Sections) and self._items == other._items

    def __hash__(self):
        return hash(self._items)

    def __reduce__(self):
        return (_Sections, (dict(self._items),))

    def __repr__(self):
        return "{" + ", ".join(f"{op!r}: {value!r}" for op, value in self._items) + "}"


def _as_section(op: str, value: SectionLike) -> Optional[Sites]:
    if value is None or isinstance(value, Sites) and value.operator == op:
        return value
    if isinstance(value, Sites):
        raise ValueError(f"the section of {op} got the sites of {value.operator}")
    return Sites(op, value)


@dataclass(frozen=True)
class RoundingPolicy:
    """Which quantities of every operator are rounded to low precision, and how.

    Args:
        sites: ``{operator: Sites | {site: bool} | "all" | "none" | None}``; operators left out get ``"all"``
            (every site on). None marks an operator the policy defines no semantics for.
        lp_dtype, diag_mode, math_dtype, state_update, silu_form, round_outputs: the knobs (:data:`KNOBS`); the
            defaults are upstream on Hopper.
        helper_fma, gemm_model, reduction_order, special_functions, fp32_fma, tilelang: knobs too; ``gemm_model``
            (``"fp32"``, ``"sm90_wgmma"``, ``"sm80_mma"``), ``reduction_order`` (``"pairwise"``,
            ``"sequential_time"``), ``special_functions`` (``"accurate"``, ``"fast_sm90"``), ``fp32_fma``
            (False, True) and ``tilelang`` (``"0.1.8"``, ``"0.1.15"``) are honoured where :data:`KNOB_CONSUMERS`
            says and refused elsewhere (:func:`require_default`).

    Instances are frozen and hashable; change them with :meth:`replace` or :meth:`with_sites`. See the module
    docstring for names, sections and JSON.
    """

    sites: Any = None
    lp_dtype: str = "bfloat16"
    diag_mode: str = "fma"
    math_dtype: str = "float32"
    state_update: str = "accumulate_into"
    silu_form: str = "tanh"
    round_outputs: bool = True
    helper_fma: str = "contracted"
    gemm_model: str = "fp32"
    special_functions: str = "accurate"
    fp32_fma: bool = False
    reduction_order: str = "pairwise"
    tilelang: str = "0.1.8"

    def __post_init__(self):
        given = self.sites if self.sites is not None else {}
        if isinstance(given, _Sections):
            sections = given
        else:
            if not isinstance(given, Mapping):
                raise TypeError(f"sites must be a mapping operator -> sites, got {type(given).__name__}")
            unknown = sorted(set(given) - set(registry.OPERATORS))
            if unknown:
                raise ValueError(f"unknown operator(s) {unknown} in sites; operators: {list(registry.OPERATORS)}")
            sections = _Sections({op: _as_section(op, given.get(op, "all")) for op in registry.OPERATORS})
        object.__setattr__(self, "sites", sections)
        for name, allowed in KNOBS.items():
            value = getattr(self, name)
            if not any(value == a and type(value) is type(a) for a in allowed):
                raise ValueError(f"RoundingPolicy.{name}={value!r} is not a known value; expected one of {allowed}")
        for name, allowed in FUTURE_KNOBS.items():
            value = getattr(self, name)
            if not any(value == a and type(value) is type(a) for a in allowed):
                raise ValueError(f"RoundingPolicy.{name}={value!r} is not a known value; expected one of {allowed}")
            if value != allowed[0]:
                raise NotImplementedError(
                    f"RoundingPolicy.{name}={value!r} is declared but not implemented yet; only "
                    f"{name}={allowed[0]!r} is honoured by the references and the kernels")
        for knob in KNOB_CONSUMERS:  # FP32-level models: an FP32 accumulator, FP32 FMAs
            if getattr(self, knob) != KNOBS[knob][0] and self.math_dtype != "float32":
                raise ValueError(f"RoundingPolicy.{knob}={getattr(self, knob)!r} models FP32 arithmetic; "
                                 f"math_dtype={self.math_dtype!r} needs {knob}={KNOBS[knob][0]!r}")

    # ------------------------------------------------------------------ sections and fields
    def __getattr__(self, name: str):
        # only called for names that are not dataclass fields: operator sections by name
        if name in registry.OPERATORS:
            return self.section(name)
        raise AttributeError(f"RoundingPolicy has no field {name!r}; knobs: {list(ALL_KNOBS)}, operator sections: "
                             f"{list(registry.OPERATORS)} (a site is policy.<operator>.<site>)")

    def section(self, operator: str) -> Sites:
        """The :class:`Sites` of ``operator``.

        Raises:
            ValueError: an unknown operator. PolicyUndefined: the policy defines no semantics for it.
        """
        registry.check(operator)
        value = self.sites[operator]
        if value is None:
            raise PolicyUndefined(
                f"policy {self.name!r} defines no rounding for operator {operator!r} (it describes "
                f"{', '.join(self.defined_operators()) or 'no operator'}); pick a preset that covers it "
                "(mimo_numerics.presets.names()) or give the section with policy.replace("
                f"{operator}='all' | 'none' | {{site: bool}})")
        return value

    def defines(self, operator: str) -> bool:
        """Whether the policy has a section for ``operator``."""
        registry.check(operator)
        return self.sites[operator] is not None

    def defined_operators(self) -> Tuple[str, ...]:
        """Operators whose section is defined."""
        return tuple(op for op in registry.OPERATORS if self.sites[op] is not None)

    def get(self, name: str):
        """The value of a knob (``"diag_mode"``) or a site (``"mamba_mimo_bwd_fwd.out"``)."""
        if name in ALL_KNOBS:
            return getattr(self, name)
        op, site = _split_site(name)
        return self.section(op)[site]

    def fields(self, operator: Optional[str] = None) -> Tuple[str, ...]:
        """Field names: the knobs, then ``"<op>.<site>"`` of every defined section (or of ``operator`` only)."""
        ops = (registry.check(operator),) if operator is not None else self.defined_operators()
        return ALL_KNOBS + tuple(f"{op}.{site}" for op in ops for site in self.section(op))

    @property
    def lp_torch_dtype(self) -> torch.dtype:
        """The low-precision torch dtype (``torch.bfloat16`` or ``torch.float16``)."""
        return _TORCH_DTYPES[self.lp_dtype]

    @property
    def math_torch_dtype(self) -> torch.dtype:
        """The dtype the references compute in (``torch.float32`` or ``torch.float64``)."""
        return _TORCH_DTYPES[self.math_dtype]

    @property
    def name(self) -> str:
        """The preset name this policy equals, or ``"custom"``."""
        from . import presets

        return presets.name_of(self) or "custom"

    def label(self, operator: Optional[str] = None) -> str:
        """The preset this policy equals (on ``operator``'s section and the knobs, when given), or ``"custom"``."""
        from . import presets

        return presets.name_of(self, operator=operator) or "custom"

    def switches_on(self, operator: Optional[str] = None) -> Tuple[str, ...]:
        """Names of ``operator``'s switches that are on (default: the default operator's, stage 1, as before)."""
        return self.section(registry.DEFAULT_OPERATOR if operator is None else operator).on()

    # ------------------------------------------------------------------ edits and comparisons
    def replace(self, **changes) -> "RoundingPolicy":
        """A copy with ``changes`` applied: knobs by name, sites as ``"<op>.<site>"`` (pass them with ``**{...}``),
        whole sections by operator name (``Sites``, ``{site: bool}``, ``"all"``, ``"none"`` or None).

        Raises:
            ValueError: an unknown field, naming it.
        """
        knobs = {k: v for k, v in changes.items() if k in ALL_KNOBS}
        sections = dict(self.sites)
        for key, value in changes.items():
            if key in ALL_KNOBS:
                continue
            if key == "sites":
                raise ValueError("replace(sites=...) is not supported; replace sections by operator name")
            if key in registry.OPERATORS:
                sections[key] = _as_section(key, value)
                continue
            op, site = _split_site(key)
            current = sections[op]
            if current is None:
                raise PolicyUndefined(f"cannot set {key}: the policy defines no section for {op}; set the whole "
                                      f"section first (replace({op}='all' | 'none' | {{...}}))")
            sections[op] = current.replace(**{site: value})
        return dataclasses.replace(self, sites=_Sections(sections), **knobs)

    def with_sites(self, operator: str, **switches: bool) -> "RoundingPolicy":
        """A copy with some switches of ``operator``'s section changed."""
        return self.replace(**{operator: self.section(operator).replace(**switches)})

    def diff(self, other: "RoundingPolicy", operator: Optional[str] = None) -> Dict[str, Tuple[Any, Any]]:
        """Fields that differ, as ``{field: (value in self, value in other)}``: knobs first, then sites as
        ``"<op>.<site>"``; a section defined in one policy only appears as ``{op: ("defined", None)}``. With
        ``operator``, only the knobs and that operator's sites, by bare name."""
        if not isinstance(other, RoundingPolicy):
            raise TypeError(f"other must be a RoundingPolicy, got {type(other).__name__}")
        out: Dict[str, Tuple[Any, Any]] = {k: (getattr(self, k), getattr(other, k)) for k in ALL_KNOBS
                                           if getattr(self, k) != getattr(other, k)}
        if operator is not None:
            a, b = self.sites[registry.check(operator)], other.sites[operator]
            if a is None or b is None:
                if (a is None) != (b is None):
                    out[operator] = ("defined" if a is not None else None, "defined" if b is not None else None)
                return out
            out.update({s: (a[s], b[s]) for s in a if a[s] != b[s]})
            return out
        for op in registry.OPERATORS:
            a, b = self.sites[op], other.sites[op]
            if a is None or b is None:
                if (a is None) != (b is None):
                    out[op] = ("defined" if a is not None else None, "defined" if b is not None else None)
                continue
            out.update({f"{op}.{s}": (a[s], b[s]) for s in a if a[s] != b[s]})
        return out

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> Dict[str, Any]:
        """``{"schema_version": 2, knob: value, ..., "sites": {op: {site: bool} | None}}`` with JSON types."""
        out: Dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        out.update({k: getattr(self, k) for k in ALL_KNOBS})
        out["sites"] = {op: (None if s is None else s.to_dict()) for op, s in self.sites.items()}
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: Optional[str] = None) -> "RoundingPolicy":
        """Inverse of :meth:`to_dict`; also reads version-1 dicts (module docstring).

        Args:
            data (dict): the policy. source (str, optional): where it came from (a file name), for messages.

        Raises:
            ValueError: unknown fields or values, missing fields without ``"base"``, an unknown schema version.
        """
        where = f" in {source}" if source else ""
        if not isinstance(data, dict):
            raise TypeError(f"policy data{where} must be a dict, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", None)
        if version == 1:
            return _from_v1(data, where)
        if version != SCHEMA_VERSION:
            raise ValueError(f"policy schema_version {version!r}{where} is not supported (this package reads "
                             f"schema_version 1 and {SCHEMA_VERSION}; give \"schema_version\": {SCHEMA_VERSION})")
        base_name = data.pop("base", None)
        unknown = sorted(set(data) - set(ALL_KNOBS) - {"sites"})
        if unknown:
            raise ValueError(f"unknown RoundingPolicy field(s) {unknown}{where}; fields: {list(ALL_KNOBS)} and "
                             "'sites' (and 'base')")
        sites = data.pop("sites", {})
        if not isinstance(sites, dict):
            raise ValueError(f"'sites'{where} must be an object operator -> {{site: bool}} or null")
        unknown_ops = sorted(set(sites) - set(registry.OPERATORS))
        if unknown_ops:
            raise ValueError(f"unknown operator(s) {unknown_ops} in 'sites'{where}; operators: "
                             f"{list(registry.OPERATORS)}")
        if base_name is not None:
            from . import presets

            base = presets.get(base_name)
            sections = dict(base.sites)
            for op, value in sites.items():
                if isinstance(value, dict) and sections[op] is not None:
                    sections[op] = sections[op].replace(**value)
                else:
                    sections[op] = _as_section(op, value)
            return dataclasses.replace(base, sites=_Sections(sections), **data)
        missing = [k for k in ALL_KNOBS if k not in data and k not in KNOBS_ADDED_TO_V2] + [
            f"sites.{op}" for op in registry.OPERATORS if op not in sites]
        if missing:
            raise ValueError(f"policy{where} lacks {missing}: give every field, or \"base\": \"<preset>\" to take "
                             "the missing ones from a preset")
        added = [k for k in KNOBS_ADDED_TO_V2 if k not in data]
        if added:
            warnings.warn(f"policy{where} lacks {added} (added after the file was written): taking "
                          + ", ".join(f"{k}={KNOBS_ADDED_TO_V2[k]!r}" for k in added))
            data = {**data, **{k: KNOBS_ADDED_TO_V2[k] for k in added}}
        return cls(sites=sites, **data)

    def to_json(self, indent: int = 2) -> str:
        """The policy as a JSON document (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str, source: Optional[str] = None) -> "RoundingPolicy":
        """Inverse of :meth:`to_json`: ``text`` is the JSON text itself, not a file name (a policy file, a preset
        name or a policy: ``mimo_numerics.presets.resolve``); ``source`` (a file name) is named in errors."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"RoundingPolicy.from_json takes the JSON text of a policy (str), got "
                            f"{type(text).__name__}; to load a policy file use mimo_numerics.presets.resolve(path)")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if source:
                raise ValueError(f"policy file {source} is not valid JSON: {exc}") from None
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise ValueError(f"policy JSON is not valid JSON: {exc} (RoundingPolicy.from_json takes the JSON text "
                             f"itself, got {shown!r}; to load a policy file or a preset by name use "
                             "mimo_numerics.presets.resolve(path_or_name))") from None
        return cls.from_dict(data, source=source)


#: Version-1 knobs and their defaults (the values a v1 file meant when it lacked them).
_V1_DEFAULTS = {"lp_dtype": "bfloat16", "diag_mode": "fma", "math_dtype": "float32",
                "state_update": "accumulate_into", "silu_form": "tanh", "round_outputs": True, "gemm_model": "fp32",
                "special_functions": "accurate", "fp32_fma": False, "reduction_order": "pairwise",
                "helper_fma": "contracted", "tilelang": "0.1.8"}
#: Knobs added after schema_version 2 files were first written, and the value a version-2 file without ``"base"``
#: that lacks one takes, with a ``UserWarning`` naming it: the default (mamba-ssm's pin). Before ``tilelang`` existed
#: the package gave 0.1.15's form in the one place the knob acts (stage 1's dζ with fp32_fma and sequential_time).
KNOBS_ADDED_TO_V2 = {"tilelang": "0.1.8"}


def _from_v1(data: Dict[str, Any], where: str) -> RoundingPolicy:
    table = registry.site_table(registry.V1_OPERATOR)
    unknown = sorted(set(data) - set(table) - set(_V1_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown RoundingPolicy field(s) {unknown}{where} (schema_version 1: the stage-1 switches "
                         f"{list(table)} and the knobs {list(_V1_DEFAULTS)})")
    missing = [k for k in list(table) + list(_V1_DEFAULTS) if k not in data]
    if missing:
        warnings.warn(f"schema_version 1 policy{where} lacks {missing}: taking the defaults they had (switches on, "
                      f"knobs {{{', '.join(f'{k}={_V1_DEFAULTS[k]!r}' for k in missing if k in _V1_DEFAULTS)}}})",
                      UserWarning, stacklevel=3)
    switches = {site: data.get(site, True) for site in table}
    knobs = {k: data.get(k, default) for k, default in _V1_DEFAULTS.items()}
    sections = {op: (switches if op == registry.V1_OPERATOR else None) for op in registry.OPERATORS}
    return RoundingPolicy(sites=sections, **knobs)


def _split_site(name: str) -> Tuple[str, str]:
    """``(operator, site)`` of a dotted site name; a bare name is a site of the default operator (stage 1, the
    package's first operator), as ``replace(out=False)`` always meant."""
    if isinstance(name, str) and "." not in name and name in registry.site_table(registry.DEFAULT_OPERATOR):
        return registry.DEFAULT_OPERATOR, name
    if not isinstance(name, str) or "." not in name:
        owners = [op for op in registry.OPERATORS if name in registry.site_table(op)]
        hint = (f"; a site is named with its operator: {[f'{op}.{name}' for op in owners]}" if owners else
                f"; knobs: {list(ALL_KNOBS)}, sites: '<operator>.<site>', operators: {list(registry.OPERATORS)}")
        raise ValueError(f"unknown RoundingPolicy field {name!r}{hint}")
    op, site = name.split(".", 1)
    if op not in registry.OPERATORS:
        raise ValueError(f"unknown operator {op!r} in field {name!r}; operators: {list(registry.OPERATORS)}")
    if site not in registry.site_table(op):
        raise ValueError(f"unknown site {site!r} of {op} in field {name!r}; its sites: "
                         f"{list(registry.site_table(op))}")
    return op, site


def field_names(operator: Optional[str] = None) -> Tuple[str, ...]:
    """Every field name: the knobs, then ``"<op>.<site>"`` for every registered operator (or ``operator`` only)."""
    ops = (registry.check(operator),) if operator is not None else registry.OPERATORS
    return ALL_KNOBS + tuple(f"{op}.{site}" for op in ops for site in registry.site_table(op))


def site_names(operator: str) -> Tuple[str, ...]:
    """The dotted site names ``"<op>.<site>"`` of ``operator``, in kernel order."""
    return tuple(f"{operator}.{site}" for site in registry.site_table(registry.check(operator)))


# ---------------------------------------------------------------------------------------------------- operator views
# Tools that work on one operator (sensitivity, inference, drift) name its fields without the operator prefix: its
# sites by their bare names and the knobs. These three functions translate.

def operator_fields(operator: str) -> Tuple[str, ...]:
    """The bare field names of ``operator``: its sites (kernel order), then the knobs of :data:`KNOBS`."""
    return tuple(registry.site_table(registry.check(operator))) + tuple(KNOBS)


def read_field(policy: RoundingPolicy, operator: str, name: str):
    """A knob of ``policy`` or a site of ``operator``'s section, by bare name."""
    if name in ALL_KNOBS:
        return getattr(policy, name)
    return policy.section(operator)[name]


def write_fields(policy: RoundingPolicy, operator: str, **changes) -> RoundingPolicy:
    """``policy`` with knobs and ``operator``'s sites (bare names) changed; unknown names raise ``ValueError``."""
    table = registry.site_table(registry.check(operator))
    unknown = sorted(set(changes) - set(table) - set(ALL_KNOBS))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} of {operator}; its sites: {list(table)}, knobs: "
                         f"{list(ALL_KNOBS)}")
    knobs = {k: v for k, v in changes.items() if k in ALL_KNOBS}
    switches = {k: v for k, v in changes.items() if k in table}
    out = policy.replace(**knobs) if knobs else policy
    return out.with_sites(operator, **switches) if switches else out


def with_float64_math(policy: RoundingPolicy) -> RoundingPolicy:
    """``policy`` with ``math_dtype="float64"`` and the FP32-level models of :data:`KNOB_CONSUMERS` at their defaults
    (they describe FP32 arithmetic, which float64 math does not have)."""
    return policy.replace(math_dtype="float64", **{knob: KNOBS[knob][0] for knob in KNOB_CONSUMERS})


def require_default(policy: RoundingPolicy, knob: str, where: str) -> None:
    """Refuse a value of an FP32-level knob (:data:`KNOB_CONSUMERS`) other than its default in a consumer that does
    not model it.

    Raises:
        NotImplementedError: ``policy.<knob>`` is not the default; the message names the knob, ``where`` and what
        honours it.
    """
    if knob not in KNOB_CONSUMERS:
        raise ValueError(f"knob must be one of {sorted(KNOB_CONSUMERS)}, got {knob!r}")
    default = KNOBS[knob][0]
    if getattr(policy, knob) != default:
        raise NotImplementedError(
            f"RoundingPolicy.{knob}={getattr(policy, knob)!r} is not honoured by {where}; it is honoured by "
            f"{KNOB_CONSUMERS[knob]} so far: use {knob}={default!r} here")
