"""Result bundles: the inputs and outputs of runs of one operator, stored so another machine can check them.

A bundle is a directory::

    <bundle>/
        manifest.json                      the operator, what every file is, and its sha256
        <case>.inputs.safetensors          the input tensors of one case (``op.input_names``; absent optional ones
                                           are left out)
        <case>.outputs.safetensors         its outputs (``op.output_names``; absent when the run was skipped)

Every case of a bundle belongs to one operator (:mod:`mimo_numerics.operator`; ``BundleCase.operator``, default the
registry's default operator), recorded once in the manifest. Tensor names, the output layouts implied by the inputs
and the input checks come from that operator: its names, its output :class:`~mimo_numerics.operator.Stage` shapes,
and the ``validate_inputs`` of its reference module (:func:`validate_case_inputs`).

``manifest.json`` (``schema_version`` 3) holds its own digest ``manifest_sha256``, the operator and, per case: its
name, its spec (a case-spec dict: ``CaseSpec``, or another spec class of the package by ``"module:Class"``, or a
free-form dict, e.g. for stored golden cases), the rounding policy as JSON (``null`` for the upstream kernel and other
runs that have no policy), the backend, the torch device and its name, package versions (torch/triton/tilelang/
CANN... when present; always ``tilelang`` for a case of the upstream kernel), the creation time, the scalar inputs
(``chunk_size``, ``rotary_dim_divisor``), the dtype and shape of every tensor, content digests of the inputs and of
the outputs (independent of the file layout; ``compare`` uses the inputs digest to refuse bundles whose inputs
differ) and the sha256 and size of every tensor file. Its keys, its digest and the older schema versions (1 and 2,
read as bundles of the package's first operator, backward stage 1) are described in
:mod:`mimo_numerics.bundle_manifest`; :func:`upgrade_bundle` rewrites them as the current version.

Tensor files are safetensors files (https://huggingface.co/docs/safetensors), written and parsed by the
``safetensors`` package (``safetensors.torch.save`` / ``load``), whose parser refuses a malformed file: a header
length past the end, a header that is not UTF-8 JSON of tensor entries, an unknown dtype, a shape that disagrees with
its byte range, byte ranges that leave gaps, overlap or do not cover the data section exactly (truncated files,
trailing bytes). The library orders the tensors in a file by dtype alignment, then name, and each file carries one
metadata key (:data:`FILE_METADATA_KEY`; the library writes several in hash-map order), so a file's bytes depend only
on its tensors, case name and kind. A file is read whole, once: the bytes that are hashed are the bytes that are
parsed, and the loaded tensors own their memory (a memory map would follow later in-place rewrites of the file).
Files written by the hand-written codec of earlier versions are valid safetensors and load unchanged
(``tests/data/bundle_legacy_codec``).

Writing is atomic: everything goes to a hidden temporary directory next to the target, is fsynced, and is renamed
into place last, so an interrupted write never leaves a bundle that verifies (the temporary directory has no
manifest until the end, and is never at the target path).

Loading (``load_bundle(path, verify=True)``) refuses, with a :class:`BundleError` that names the offending file:
a missing manifest, an unknown or newer schema version (and version 1, which cannot be fully verified: upgrade it),
an unknown operator, a manifest whose content does not match its ``manifest_sha256``, a missing or unknown key in the
manifest or a case entry, a missing or extra file, a file whose sha256 or size does not match, a malformed (e.g.
truncated) tensor file, a tensor whose name, dtype or shape disagrees with the manifest or with its case (the inputs
are checked by the operator's ``validate_inputs``, the outputs against the shapes the inputs imply), and inputs or
outputs whose digest disagrees with the manifest. ``verify=False`` skips the digests and hashes, not the structure
and key checks.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import safetensors.torch
import torch

# BundleError, OldSchemaError, manifest_digest and the schema constants are part of this module's API too
from . import envinfo, golden_data
from . import operator as _operator
from .bundle_manifest import (LEGACY_OPERATOR, MANIFEST, SCHEMA, SCHEMA_VERSION,  # noqa: F401
                              BundleError, OldSchemaError, manifest_digest, manifest_operator, read_manifest, seal)
from .policy import RoundingPolicy
from .validation import Dims

INPUTS_SUFFIX = ".inputs.safetensors"
OUTPUTS_SUFFIX = ".outputs.safetensors"

#: The backend name of the real upstream kernel; its cases always record ``versions["tilelang"]``.
UPSTREAM_BACKEND = "upstream"
#: The one safetensors metadata key of a bundle's tensor files; its value is ``{"case": name, "kind": "inputs"}`` as
#: JSON. (Files of the hand-written codec before it have ``{"format": "pt", "case": ..., "kind": ...}``.)
FILE_METADATA_KEY = "mimo_numerics.bundle"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]{0,199}$")

#: The dtypes a tensor file may hold (safetensors F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL), by manifest name.
_DTYPE_NAMES = {dtype: str(dtype).replace("torch.", "") for dtype in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}
_DTYPE_FROM_NAME = {name: dtype for dtype, name in _DTYPE_NAMES.items()}

PathLike = Union[str, os.PathLike]
OperatorLike = Union[str, _operator.Operator, None]


# ---------------------------------------------------------------------------------------------------------- operator
def operator_module(op: OperatorLike, what: str) -> types.ModuleType:
    """The module behind loader ``what`` of operator ``op`` (``"reference"``, ``"golden"``, ``"upstream"``,
    ``"kernels"``, ...): the module part of its ``"module:attribute"`` path.

    Raises:
        ValueError: the operator has no such loader (naming the operator, as ``Operator.load``).
    """
    op = _operator.get(op)
    path = getattr(op, what)
    if path is None:
        op.load(what)  # raises the ValueError naming the operator
    return importlib.import_module(path.partition(":")[0])


def validate_case_inputs(inputs: Mapping[str, Any], op: OperatorLike = None) -> Dims:
    """Check an inputs dict (tensors by ``op.input_names``, plus ``op.scalar_inputs``) as operator ``op``'s own API
    does (``Operator.check_inputs``); returns the ``Dims``.

    Raises:
        KeyError: an input name is missing. TypeError, ValueError: the operator's validation errors.
    """
    return _operator.get(op).check_inputs(inputs)


def outputs_type(op: OperatorLike = None) -> type:
    """The NamedTuple class of operator ``op``'s outputs."""
    return _operator.get(op).load("outputs_type")


def outputs_of(value, op: OperatorLike = None):
    """``value`` as operator ``op``'s outputs NamedTuple (``Operator.as_outputs``)."""
    return _operator.get(op).as_outputs(value)


# ---------------------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True, eq=False)
class BundleCase:
    """One case of a bundle: its inputs, its outputs and where they came from.

    Attributes:
        name (str): unique within the bundle, ``[A-Za-z0-9][A-Za-z0-9_.+=-]*`` (it names the tensor files);
            the spec's ``case_id`` for drawn cases.
        inputs (dict): the operator's tensors by ``op.input_names`` (``None`` for absent optional ones) plus its
            scalar inputs ``chunk_size`` and ``rotary_dim_divisor`` (ints): the format of ``op.draw``.
        outputs (NamedTuple | None): the operator's outputs (:func:`outputs_type`); None when the run was skipped or
            not done.
        spec (case spec | dict | None): how the inputs were made: a ``CaseSpec``, ``OpCaseSpec``, ``StoredCase``
            (stored as a dict of its sizes and name), or any JSON-serialisable dict.
        policy (RoundingPolicy | None): the policy of the run; None for the upstream kernel or when not applicable.
        backend (str): ``"reference"``, ``"triton"``, ``"upstream"``, ... (free text).
        device (str): the torch device the run used (``"cpu"``, ``"cuda:0"``, ``"npu:0"``).
        device_name (str | None): e.g. ``"NVIDIA H200 (sm_90)"`` (``envinfo.device_name``).
        versions (dict): package versions (``envinfo.versions()``). An ``"upstream"`` case saved with ``created``
            None and no ``tilelang`` key gets this process's TileLang version (``"unknown"`` if none is found).
        created (str | None): ISO-8601 UTC time; ``save_bundle`` fills it in when None.
        skipped (str | None): why there are no outputs (e.g. a shape the upstream kernel refuses).
        meta (dict): free-form JSON metadata (timings, provenance...).
        operator (str | Operator | None): the operator the case ran (stored as its name; None: the registry's
            default operator).
    """

    name: str
    inputs: Mapping[str, Any]
    outputs: Optional[tuple] = None
    spec: Any = None
    policy: Optional[RoundingPolicy] = None
    backend: str = "unknown"
    device: str = "cpu"
    device_name: Optional[str] = None
    versions: Mapping[str, str] = field(default_factory=dict)
    created: Optional[str] = None
    skipped: Optional[str] = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    operator: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "operator", _operator.get(self.operator).name)

    def replace(self, **changes) -> "BundleCase":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def op(self) -> _operator.Operator:
        """The :class:`~mimo_numerics.operator.Operator` of the case."""
        return _operator.get(self.operator)

    @property
    def spec_dict(self) -> Optional[dict]:
        """The spec as a plain dict (``to_dict()`` of a spec object), or None."""
        return _spec_to_json(self.spec)[1]

    @property
    def args(self) -> tuple:
        """The input tensors in the operator's API order."""
        return self.op.args(self.inputs)

    @property
    def kwargs(self) -> dict:
        """The scalar inputs, ``{"chunk_size": ..., "rotary_dim_divisor": ...}``."""
        return self.op.kwargs(self.inputs)

    @property
    def dims(self) -> Dims:
        """The validated sizes of the inputs."""
        return validate_case_inputs(self.inputs, self.op)

    @property
    def inputs_digest(self) -> str:
        """sha256 over the names, dtypes, shapes and bytes of the inputs and the scalars (layout-independent)."""
        return inputs_digest(self.inputs, self.op)

    @property
    def outputs_digest(self) -> Optional[str]:
        """sha256 over the names, dtypes, shapes and bytes of the outputs (layout-independent); None without them."""
        return None if self.outputs is None else outputs_digest(self.outputs, self.op)

    @property
    def has_outputs(self) -> bool:
        return self.outputs is not None


@dataclass(frozen=True, eq=False)
class Bundle:
    """A loaded bundle: its cases in stored order, the operator they ran and the bundle-level metadata."""

    path: Optional[Path]
    cases: Tuple[BundleCase, ...]
    created: Optional[str] = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    operator: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "operator", _operator.get(self.operator).name)

    @property
    def op(self) -> _operator.Operator:
        """The :class:`~mimo_numerics.operator.Operator` of every case."""
        return _operator.get(self.operator)

    def names(self) -> Tuple[str, ...]:
        return tuple(c.name for c in self.cases)

    def case(self, name: str) -> BundleCase:
        """The case called ``name`` (``KeyError`` listing the names otherwise)."""
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"no case {name!r} in bundle {self.path}; cases: {list(self.names())}")

    def __iter__(self) -> Iterator[BundleCase]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, key: Union[int, str]) -> BundleCase:
        return self.cases[key] if isinstance(key, int) else self.case(key)


# ---------------------------------------------------------------------------------------------------------- helpers
def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds (``2026-01-31T12:00:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def _check_little_endian() -> None:
    if sys.byteorder != "little":  # pragma: no cover
        raise RuntimeError("bundles store little-endian bytes; this big-endian host is not supported")


def _hash_tensors(h, names: Sequence[str], tensors: Mapping[str, Any]) -> None:
    """Feed each tensor's name, dtype, shape and bytes into ``h`` (``name:none;`` for an absent one)."""
    for name in names:
        value = tensors.get(name)
        if value is None:
            h.update(f"{name}:none;".encode())
            continue
        h.update(f"{name}:{_DTYPE_NAMES.get(value.dtype, str(value.dtype))}:{list(value.shape)};".encode())
        h.update(_tensor_bytes(value))


def inputs_digest(inputs: Mapping[str, Any], op: OperatorLike = None) -> str:
    """A sha256 of operator ``op``'s input tensors (name, dtype, shape, bytes; ``None`` for absent ones) and its
    scalar inputs."""
    op = _operator.get(op)
    h = hashlib.sha256()
    _hash_tensors(h, op.input_names, inputs)
    for name in op.scalar_inputs:
        h.update(f"{name}={int(inputs[name])};".encode())
    return h.hexdigest()


def outputs_digest(outputs: Union[tuple, Mapping[str, Optional[torch.Tensor]]], op: OperatorLike = None) -> str:
    """A sha256 of operator ``op``'s outputs (name, dtype, shape, bytes; ``None`` for absent ones), like
    :func:`inputs_digest`: it pins which tensor is which output, so same-shape outputs swapped in a consistently
    rewritten file are caught."""
    h = hashlib.sha256()
    _hash_tensors(h, _operator.get(op).output_names, outputs._asdict() if hasattr(outputs, "_asdict") else
                  dict(outputs))
    return h.hexdigest()


def bit_identical(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """True when both are None, or both tensors have the same dtype, shape and bytes (NaN payloads, -0 included)."""
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and _tensor_bytes(a) == _tensor_bytes(b)


#: The fields of a case spec that the inputs fix (checked against them on save and load), with their ``Dims``
#: counterparts; the spec classes of the package (``CaseSpec``, ``StoredCase``, ``OpCaseSpec``) all have them.
_SPEC_SIZES = {"batch": "B", "seqlen": "S", "heads": "H", "groups": "G", "state_dim": "N", "value_dim": "P",
               "rank": "R", "chunk_size": "C", "rotary_dim_divisor": "rotary_dim_divisor", "reduce_o": "reduce_o",
               "has_z": "has_z", "has_d": "has_d", "dtype": "dtype"}
#: The key that marks the dict a ``StoredCase`` spec is stored as (its tensors are the case's inputs already).
STORED_CASE_KEY = "stored_case"
_PACKAGE = __name__.rpartition(".")[0]


def _is_stored_case(spec) -> bool:
    from .cases import StoredCase

    return isinstance(spec, StoredCase)


def _spec_to_json(spec) -> Tuple[Optional[str], Optional[dict]]:
    """``(spec_type, JSON dict)``: ``"CaseSpec"``; ``"dict"`` for a dict or a ``StoredCase`` (its name and sizes);
    ``"<module>:<Class>"`` for another spec class of this package (``to_dict``/``from_dict``)."""
    if spec is None:
        return None, None
    if _is_stored_case(spec):
        return "dict", {STORED_CASE_KEY: spec.case_id, **{k: getattr(spec, k) for k in _SPEC_SIZES}}
    if hasattr(spec, "to_dict") and type(spec).__name__ == "CaseSpec":
        return "CaseSpec", spec.to_dict()
    if isinstance(spec, Mapping):
        return "dict", json.loads(json.dumps(dict(spec)))
    kind = type(spec)
    if kind.__module__.startswith(_PACKAGE + ".") and hasattr(spec, "to_dict") and hasattr(kind, "from_dict"):
        return f"{kind.__module__}:{kind.__qualname__}", json.loads(json.dumps(spec.to_dict()))
    raise TypeError(f"spec must be a case spec of mimo_numerics (CaseSpec, OpCaseSpec, StoredCase), a dict or None, "
                    f"got {kind.__name__}")


def _spec_from_json(kind: Optional[str], data, where: Path):
    if kind is None:
        return None
    if kind == "dict":
        return data
    if kind == "CaseSpec":
        from .cases import CaseSpec

        cls = CaseSpec
    else:
        module, _, name = kind.partition(":")
        cls = None
        if module.startswith(_PACKAGE + ".") and name:
            try:
                cls = getattr(importlib.import_module(module), name, None)
            except ImportError:
                cls = None
        if cls is None or not hasattr(cls, "from_dict"):
            raise BundleError(where, f"unknown spec_type {kind!r} (expected 'CaseSpec', 'dict', null or "
                                     f"'<module>:<Class>' of a spec class of {_PACKAGE})")
    try:
        return cls.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise BundleError(where, f"case spec does not load as a {cls.__name__}: {exc}") from None


def _sha256_file_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------------------- safetensors
def _owning_cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU, contiguous and alone in its storage (the library refuses tensors that share memory)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def encode_safetensors(tensors: Mapping[str, torch.Tensor], metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """The safetensors bytes of ``tensors`` with string ``metadata`` (``safetensors.torch.save``).

    The file orders the tensors by dtype alignment, then name, whatever the order of ``tensors``. With more than one
    metadata key the library writes the keys in hash-map order, so the bytes then differ from call to call (bundles
    write one key, :data:`FILE_METADATA_KEY`).

    Raises:
        TypeError: a tensor whose dtype bundles do not store (see ``_DTYPE_NAMES``).
    """
    _check_little_endian()
    prepared: Dict[str, torch.Tensor] = {}
    storages = set()
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise TypeError(f"tensor {name!r} has dtype {tensor.dtype}, which bundles cannot store; expected one of "
                            f"{sorted(_DTYPE_NAMES.values())}")
        t = _owning_cpu_copy(tensor)
        if t.numel() and t.data_ptr() in storages:  # the same tensor under two names
            t = t.clone()
        storages.add(t.data_ptr())
        prepared[name] = t
    text_metadata = {str(k): str(v) for k, v in metadata.items()} if metadata else None
    return safetensors.torch.save(prepared, metadata=text_metadata)


def decode_safetensors(data: bytes, where: PathLike = "<bytes>") -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Parse safetensors bytes into ``({name: tensor}, metadata)`` with ``safetensors.torch.load``.

    Tensors come back by name (sorted), on the CPU, in memory of their own.

    Raises:
        BundleError: naming ``where``, when the library refuses the bytes (truncated, trailing bytes, bad header...)
            or a tensor has a dtype bundles do not store.
    """
    _check_little_endian()
    try:
        tensors = safetensors.torch.load(bytes(data))
        # the library has checked the header; only its free-form metadata is left to read
        header_len = int.from_bytes(data[:8], "little")
        metadata = json.loads(bytes(data[8:8 + header_len]).decode("utf-8")).get("__metadata__") or {}
    except Exception as exc:  # SafetensorError; KeyError for a dtype code this torch lacks
        reason = str(exc) if isinstance(exc, safetensors.SafetensorError) else f"{type(exc).__name__}: {exc}"
        raise BundleError(where, f"truncated or corrupt tensor file ({len(data)} bytes): the safetensors parser "
                                 f"refused it: {reason}") from None
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise BundleError(where, f"corrupt tensor file: tensor {name!r} has dtype {tensor.dtype}, which bundles "
                                     "do not store")
    return dict(sorted(tensors.items())), {str(k): str(v) for k, v in metadata.items()}


# ---------------------------------------------------------------------------------------------------------- checks
def _check_name(name) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith("."):
        raise ValueError(f"case name {name!r} is not usable as a file name; use letters, digits and _ . + = - "
                         "(at most 200 characters, not starting with a symbol)")
    return name


def _axis_size(letter: str, dims: Dims) -> Optional[int]:
    """The size of one dimension letter of an output's ``Stage.shape`` for ``dims``; None for an axis that is absent
    here (a letter in parentheses: the rank axis of an unreduced output, absent when ``reduce_o``)."""
    if letter.startswith("("):
        return None if dims.reduce_o else _axis_size(letter.strip("()"), dims)
    sizes = {"B": dims.batch, "S": dims.seqlen, "H": dims.heads, "G": dims.groups, "N": dims.state_dim,
             "P": dims.value_dim, "R": dims.rank, "C": dims.chunk_size, "nc": dims.nchunks,
             "L": dims.chunk_size * dims.rank, "N/d": dims.state_dim // dims.rotary_dim_divisor}
    if letter not in sizes:
        raise ValueError(f"unknown dimension letter {letter!r} in an output shape; known: {sorted(sizes)}")
    return sizes[letter]


def output_layout(dims: Dims, policy: Optional[RoundingPolicy] = None,
                  op: OperatorLike = None) -> Dict[str, Optional[Tuple[tuple, tuple]]]:
    """Per output of ``op``: ``(shape, allowed dtypes)`` implied by the inputs' ``dims`` (and the policy), or None
    where its branch is off (``Stage.needs``).

    Shapes come from the outputs' dimension letters. Outputs of ``op.lp_outputs`` are in the lp dtype, the others
    float32 (or the policy's math dtype); every output is in the math dtype when the policy does not round outputs.
    """
    op = _operator.get(op)
    lp, fp32 = (dims.lp_dtype,), (torch.float32,)
    if policy is not None and not policy.round_outputs:
        lp = fp32 = (policy.math_torch_dtype,)
    elif policy is not None:
        fp32 = (torch.float32, policy.math_torch_dtype)
    layout: Dict[str, Optional[Tuple[tuple, tuple]]] = {}
    for stage in op.outputs:
        if not all(getattr(dims, flag) for flag in stage.needs):
            layout[stage.name] = None
            continue
        shape = tuple(size for size in (_axis_size(letter, dims) for letter in stage.shape) if size is not None)
        layout[stage.name] = (shape, lp if stage.name in op.lp_outputs else fp32)
    return layout


#: The earlier private name (``tests/test_reliability_properties.py`` checks the references against it).
_output_layout = output_layout


def _spec_sizes(spec) -> Optional[Dict[str, Any]]:
    """The sizes a spec fixes (:data:`_SPEC_SIZES`, dtype as its name), or None for a spec that fixes none."""
    if isinstance(spec, Mapping):
        if STORED_CASE_KEY not in spec:
            return None
        values = {k: spec.get(k) for k in _SPEC_SIZES}
    elif spec is not None and all(hasattr(spec, k) for k in _SPEC_SIZES):
        values = {k: getattr(spec, k) for k in _SPEC_SIZES}
    else:
        return None
    return {_SPEC_SIZES[k]: v for k, v in values.items()}


def _check_spec_matches(spec, dims: Dims, where: PathLike) -> None:
    expected = _spec_sizes(spec)
    if expected is None:
        return
    got = {"B": dims.batch, "S": dims.seqlen, "H": dims.heads, "G": dims.groups, "N": dims.state_dim,
           "P": dims.value_dim, "R": dims.rank, "C": dims.chunk_size, "rotary_dim_divisor": dims.rotary_dim_divisor,
           "reduce_o": dims.reduce_o, "has_z": dims.has_z, "has_d": dims.has_d,
           "dtype": _DTYPE_NAMES.get(dims.lp_dtype, str(dims.lp_dtype))}
    bad = [f"{k}={got[k]} (spec says {expected[k]})" for k in expected if expected[k] != got[k]]
    if bad:
        raise BundleError(where, "the input tensors disagree with the case spec: " + ", ".join(bad))


def _validate_case(case: BundleCase, where: PathLike, out_where: Optional[PathLike] = None) -> Dims:
    """Check the inputs (the operator's validation), the spec and the output shapes/dtypes of ``case``."""
    op = case.op
    expected = tuple(op.input_names) + tuple(op.scalar_inputs)
    missing = [n for n in expected if n not in case.inputs]
    if missing:
        raise BundleError(where, f"inputs of case {case.name!r} lack {missing} (inputs of {op.name})")
    unexpected = sorted(set(case.inputs) - set(expected))
    if unexpected:
        raise BundleError(where, f"inputs of case {case.name!r} have {unexpected}, which are not inputs of {op.name} "
                                 f"(it takes {list(expected)})")
    try:
        dims = validate_case_inputs(case.inputs, op)
    except (TypeError, ValueError) as exc:
        raise BundleError(where, f"inputs of case {case.name!r} are inconsistent: {exc}") from None
    _check_spec_matches(case.spec, dims, where)
    if case.outputs is None:
        return dims
    out_where = out_where if out_where is not None else where
    kind = outputs_type(op)
    if not isinstance(case.outputs, kind):
        raise BundleError(out_where, f"outputs of case {case.name!r} must be a {kind.__name__} (the outputs of "
                                     f"{op.name}), got {type(case.outputs).__name__}")
    layout = output_layout(dims, case.policy, op)
    for name in op.output_names:
        value, expect = getattr(case.outputs, name), layout[name]
        if expect is None:
            if value is not None:
                raise BundleError(out_where, f"output {name} of case {case.name!r} is present, but its branch is "
                                             "off for these inputs")
            continue
        shape, dtypes = expect
        if value is None:
            raise BundleError(out_where, f"output {name} of case {case.name!r} is missing")
        if tuple(value.shape) != shape:
            raise BundleError(out_where, f"output {name} of case {case.name!r} has shape {list(value.shape)}, but "
                                         f"the case implies {list(shape)}")
        if value.dtype not in dtypes:
            raise BundleError(out_where, f"output {name} of case {case.name!r} has dtype {value.dtype}, but the "
                                         f"case implies {' or '.join(str(d) for d in dtypes)}")
    return dims


def _tensor_table(tensors: Mapping[str, Optional[torch.Tensor]], names: Sequence[str]) -> Dict[str, Any]:
    return {n: (None if tensors.get(n) is None else {"dtype": _DTYPE_NAMES[tensors[n].dtype],
                                                    "shape": list(tensors[n].shape)}) for n in names}


# ---------------------------------------------------------------------------------------------------------- writing
def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _file_metadata(case_name: str, kind: str) -> Dict[str, str]:
    """The safetensors metadata of a bundle's tensor file: one key, so that the file's bytes are reproducible (the
    library writes several metadata keys in hash-map order, which changes from one call to the next)."""
    return {FILE_METADATA_KEY: json.dumps({"case": case_name, "kind": kind}, sort_keys=True, separators=(",", ":"))}


def _case_versions(case: BundleCase) -> Dict[str, str]:
    """``case.versions``, plus ``tilelang`` for an upstream case made in this process (``created`` None) that lacks
    it: the version of this process (:func:`envinfo.tilelang_version`), or ``"unknown"`` when it cannot be found.
    Cases read from a bundle (``created`` set) keep what they recorded: their run was elsewhere."""
    versions = dict(case.versions)
    if case.backend == UPSTREAM_BACKEND and case.created is None and "tilelang" not in versions:
        versions["tilelang"] = envinfo.tilelang_version() or "unknown"
    return versions


def _case_entry(case: BundleCase, directory: Path) -> dict:
    op = case.op
    spec_type, spec = _spec_to_json(case.spec)
    entry: Dict[str, Any] = {
        "name": case.name,
        "spec_type": spec_type,
        "spec": spec,
        "policy": None if case.policy is None else case.policy.to_dict(),
        "backend": str(case.backend),
        "device": str(case.device),
        "device_name": case.device_name,
        "versions": _case_versions(case),
        "created": case.created or utc_now(),
        "skipped": case.skipped,
        "meta": json.loads(json.dumps(dict(case.meta))),
        "scalars": {n: int(case.inputs[n]) for n in op.scalar_inputs},
        "inputs_digest": case.inputs_digest,
        "outputs_digest": case.outputs_digest,
        "tensors": {"inputs": _tensor_table(case.inputs, op.input_names),
                    "outputs": None if case.outputs is None else _tensor_table(case.outputs._asdict(),
                                                                                 op.output_names)},
        "files": {},
    }
    groups = [("inputs", INPUTS_SUFFIX, {n: case.inputs[n] for n in op.input_names if case.inputs[n] is not None})]
    if case.outputs is not None:
        groups.append(("outputs", OUTPUTS_SUFFIX, {n: t for n, t in case.outputs._asdict().items() if t is not None}))
    for kind, suffix, tensors in groups:
        file_name = case.name + suffix
        data = encode_safetensors(tensors, _file_metadata(case.name, kind))
        _write_synced(directory / file_name, data)
        entry["files"][kind] = {"path": file_name, "sha256": _sha256_file_bytes(data), "size": len(data)}
    return entry


def _bundle_operator(cases: Sequence[BundleCase], op: OperatorLike) -> str:
    """The one operator of ``cases`` (and ``op`` when given); ``ValueError`` naming the mix otherwise."""
    names = sorted({case.operator for case in cases})
    wanted = None if op is None else _operator.get(op).name
    if len(names) > 1:
        raise ValueError(f"a bundle holds the cases of one operator; these cases are of {names}: write one bundle "
                         "per operator")
    if wanted is not None and names and names[0] != wanted:
        raise ValueError(f"the cases are of operator {names[0]}, not {wanted} (op=): set BundleCase.operator")
    return wanted or (names[0] if names else _operator.get(None).name)


def save_bundle(path: PathLike, cases: Iterable[BundleCase], *, meta: Optional[Mapping[str, Any]] = None,
                overwrite: bool = False, op: OperatorLike = None) -> Path:
    """Write ``cases`` as a bundle at ``path``, atomically.

    Every case is validated first (inputs, spec, output shapes and dtypes), so an inconsistent bundle is never
    written. Files go to a hidden temporary directory in the same parent (``.<name>.tmp-*``), are fsynced, and the
    directory is renamed to ``path`` at the end.

    Args:
        path: the bundle directory to create. Its parent is created if needed.
        cases: ``BundleCase`` objects with unique names, all of one operator.
        meta (dict, optional): free-form JSON metadata for the whole bundle (e.g. the command that made it).
        overwrite (bool): replace an existing bundle at ``path`` (default: ``FileExistsError``).
        op (str | Operator, optional): the bundle's operator; None: the cases' (the registry's default operator for
            an empty bundle). Cases of another operator are refused.

    Returns:
        Path: ``path``.
    """
    path = Path(path)
    cases = list(cases)
    for case in cases:
        if not isinstance(case, BundleCase):
            raise TypeError(f"cases must be BundleCase objects, got {type(case).__name__}")
    operator = _bundle_operator(cases, op)
    seen = set()
    for case in cases:
        _check_name(case.name)
        if case.name in seen:
            raise ValueError(f"duplicate case name {case.name!r}: names must be unique within a bundle")
        seen.add(case.name)
        _validate_case(case, f"case {case.name}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; choose another --out or pass overwrite=True (--overwrite)")
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    old: Optional[Path] = None
    try:
        os.chmod(tmp, 0o755)
        entries = [_case_entry(case, tmp) for case in cases]
        manifest = seal({
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "operator": operator,
            "created": utc_now(),
            "meta": json.loads(json.dumps(dict(meta or {}))),
            "cases": entries,
        })
        _write_synced(tmp / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
        _fsync_dir(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            try:
                os.rename(old, path)  # put the previous bundle back
                old = None
            except OSError:
                pass  # it stays, complete, in the hidden .old directory
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


# ---------------------------------------------------------------------------------------------------------- reading
def _expected_files(manifest: dict, manifest_path: Path) -> Dict[str, Tuple[int, str]]:
    files: Dict[str, Tuple[int, str]] = {}
    names = set()
    for index, entry in enumerate(manifest["cases"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
            raise BundleError(manifest_path, f"case entry #{index} is malformed")
        name = entry.get("name")
        try:
            _check_name(name)
        except ValueError as exc:
            raise BundleError(manifest_path, f"case entry #{index}: {exc}") from None
        if name in names:
            raise BundleError(manifest_path, f"duplicate case name {name!r}")
        names.add(name)
        for kind, info in entry["files"].items():
            file_name = info.get("path") if isinstance(info, dict) else None
            if (not isinstance(file_name, str) or "/" in file_name or "\\" in file_name
                    or file_name in ("", ".", "..", MANIFEST) or file_name in files):
                raise BundleError(manifest_path, f"case {name!r}: bad or duplicate file path {file_name!r}")
            files[file_name] = (index, kind)
    return files


def _check_file_set(path: Path, expected: Mapping[str, Any]) -> None:
    present = set()
    for item in sorted(os.listdir(path)):
        if item == MANIFEST:
            continue
        if not (path / item).is_file() or (path / item).is_symlink():
            raise BundleError(path / item, "extra entry in the bundle: not a regular file listed in manifest.json")
        present.add(item)
    for name in sorted(expected):
        if name not in present:
            raise BundleError(path / name, "missing: listed in manifest.json but not in the bundle")
    extra = sorted(present - set(expected))
    if extra:
        raise BundleError(path / extra[0], "extra file: not listed in manifest.json")


def _check_table(table, tensors: Mapping[str, torch.Tensor], names: Sequence[str], where: Path, case: str) -> None:
    if not isinstance(table, dict):
        raise BundleError(where, f"manifest tensor table of case {case!r} is malformed")
    unknown = sorted(set(tensors) - set(names))
    if unknown:
        raise BundleError(where, f"unexpected tensor(s) {unknown} for case {case!r}")
    for n in names:
        info = table.get(n)
        if info is None:
            if n in tensors:
                raise BundleError(where, f"tensor {n!r} is in the file but manifest.json says case {case!r} has "
                                         "none")
            continue
        if n not in tensors:
            raise BundleError(where, f"tensor {n!r} of case {case!r} is missing from the file")
        t = tensors[n]
        if _DTYPE_NAMES[t.dtype] != info.get("dtype") or list(t.shape) != info.get("shape"):
            raise BundleError(where, f"tensor {n!r} of case {case!r} is {_DTYPE_NAMES[t.dtype]} {list(t.shape)} "
                                     f"in the file but {info.get('dtype')} {info.get('shape')} in manifest.json")


def _load_file(path: Path, info: dict, verify: bool) -> Dict[str, torch.Tensor]:
    data = path.read_bytes()
    if verify:
        if "size" in info and len(data) != info["size"]:
            raise BundleError(path, f"size {len(data)} bytes does not match manifest.json ({info['size']}): the "
                                    "file is truncated or was modified")
        digest = _sha256_file_bytes(data)
        if digest != info.get("sha256"):
            raise BundleError(path, f"sha256 mismatch: file has {digest[:16]}..., manifest.json says "
                                    f"{str(info.get('sha256'))[:16]}...: the file is corrupt or was modified")
    return decode_safetensors(data, path)[0]


def load_bundle(path: PathLike, verify: bool = True) -> Bundle:
    """Read a bundle written by :func:`save_bundle`.

    Args:
        path: the bundle directory.
        verify (bool): check the manifest's own digest, the sha256 and size of every file and the inputs and outputs
            digests (default). Structure, keys, file set, tensor names, dtypes and shapes are always checked.
            A schema_version 1 bundle (no manifest digest) is refused with ``verify=True``: upgrade it with
            :func:`upgrade_bundle`.

    Returns:
        Bundle: cases in stored order, tensors on the CPU; ``Bundle.operator`` the operator they ran (for bundles
        written before schema version 3, :data:`bundle_manifest.LEGACY_OPERATOR`).

    Raises:
        BundleError: naming the offending file (see the module docstring for what is checked).
    """
    return _load(Path(path), verify, allow_legacy=False)


def _load(path: Path, verify: bool, allow_legacy: bool) -> Bundle:
    manifest = read_manifest(path, verify, allow_legacy)
    manifest_path = path / MANIFEST
    expected = _expected_files(manifest, manifest_path)
    _check_file_set(path, expected)
    op = manifest_operator(manifest)
    cases = [_load_case(path, entry, verify, "outputs_digest" in entry, op) for entry in manifest["cases"]]
    return Bundle(path=path, cases=tuple(cases), created=manifest["created"], meta=manifest["meta"],
                  schema_version=manifest["schema_version"], operator=op)


def _load_case(path: Path, entry: dict, verify: bool, has_outputs_digest: bool, operator: str) -> BundleCase:
    """One case of operator ``operator`` of a manifest whose keys :func:`bundle_manifest.read_manifest` has checked."""
    op = _operator.get(operator)
    manifest_path = path / MANIFEST
    name, files, tables = entry["name"], entry["files"], entry["tensors"]
    try:
        policy = None if entry["policy"] is None else RoundingPolicy.from_dict(entry["policy"])
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise BundleError(manifest_path, f"policy of case {name!r} does not load: {exc}") from None
    spec = _spec_from_json(entry["spec_type"], entry["spec"], manifest_path)
    in_path = path / files["inputs"]["path"]
    tensors = _load_file(in_path, files["inputs"], verify)
    _check_table(tables["inputs"], tensors, op.input_names, in_path, name)
    inputs: Dict[str, Any] = {n: tensors.get(n) for n in op.input_names}
    inputs.update({n: entry["scalars"][n] for n in op.scalar_inputs})
    outputs = out_path = None
    if "outputs" in files:
        out_path = path / files["outputs"]["path"]
        out_tensors = _load_file(out_path, files["outputs"], verify)
        if tables["outputs"] is None:
            raise BundleError(manifest_path, f"case {name!r} has an outputs file but no outputs table")
        _check_table(tables["outputs"], out_tensors, op.output_names, out_path, name)
        outputs = outputs_type(op)(**{n: out_tensors.get(n) for n in op.output_names})
    elif tables["outputs"] is not None:
        raise BundleError(manifest_path, f"case {name!r} has an outputs table but no outputs file")
    case = BundleCase(name=name, inputs=inputs, outputs=outputs, spec=spec, policy=policy, backend=entry["backend"],
                      device=entry["device"], device_name=entry["device_name"], versions=entry["versions"],
                      created=entry["created"], skipped=entry["skipped"], meta=entry["meta"], operator=op.name)
    _validate_case(case, in_path, out_path)
    if verify and case.inputs_digest != entry["inputs_digest"]:
        raise BundleError(in_path, f"inputs digest of case {name!r} does not match manifest.json")
    if verify and has_outputs_digest and case.outputs_digest != entry["outputs_digest"]:
        raise BundleError(out_path or manifest_path, f"outputs digest of case {name!r} does not match manifest.json "
                                                     "(outputs swapped, edited or missing)")
    return case


def verify_bundle(path: PathLike) -> Bundle:
    """``load_bundle(path, verify=True)``: raises ``BundleError`` unless every check passes."""
    return load_bundle(path, verify=True)


def upgrade_bundle(path: PathLike, out: PathLike, *, overwrite: bool = False) -> Path:
    """Rewrite a bundle of an older schema version (1 or 2) as the current one, after verifying what it can.

    The old bundle is read with every check of its version (file sha256 and sizes, inputs digests, structure and
    keys; for version 2 also its manifest and outputs digests); its cases are then written unchanged to ``out`` by
    :func:`save_bundle`, which adds what the old version lacks (the operator, which is the one bundles before version
    3 held, and for version 1 the manifest digest and the outputs digests). The bundle-level ``meta`` is kept, with
    ``upgraded_from`` recording the old schema version and creation time. ``out`` may be ``path`` itself with
    ``overwrite=True`` (the replacement is atomic).

    Returns:
        Path: ``out``.
    """
    old = _load(Path(path), verify=True, allow_legacy=True)
    meta = dict(old.meta)
    meta["upgraded_from"] = {"schema_version": old.schema_version, "created": old.created}
    return save_bundle(out, old.cases, meta=meta, overwrite=overwrite, op=old.operator)


# ---------------------------------------------------------------------------------------------------------- golden data
#: Provenance of ``tests/data/upstream_h200_seed_cases.pt`` (``tests/data/README.md``; ``mimo_numerics.golden_data``).
GOLDEN_DEVICE_NAME = golden_data.DEVICE_NAME
GOLDEN_VERSIONS = dict(golden_data.SEED_VERSIONS)
#: Provenance of the whole-op golden files ``tests/data/upstream_h200_full_op_cases.pt`` and
#: ``upstream_h200_full_op_extra_cases.pt`` (``tests/data/README.md``; the extra file records the same versions per
#: case): the golden data of operators whose golden loader has no seed-layout file.
GOLDEN_WHOLE_OP_VERSIONS = dict(golden_data.WHOLE_OP_VERSIONS)


def _golden_spec(kind: str, kw: dict, inputs: Mapping[str, Any], op):
    """A CaseSpec when the seed formula reproduces the stored inputs bit for bit, else a free-form dict."""
    free = {"formula": kind, "kw": kw}
    if kind != "seed":
        return free
    from . import cases

    try:
        spec = cases.spec_from_seed_kwargs(kw)
        made = op.draw(spec)
    except (TypeError, ValueError):
        return free
    if all(bit_identical(made[n], inputs.get(n)) for n in op.input_names) and all(
            made[n] == inputs[n] for n in op.scalar_inputs):
        return spec
    return free


def golden_outputs(name: str, op: OperatorLike = None) -> Dict[str, Optional[torch.Tensor]]:
    """Upstream's recorded outputs of golden case ``name`` of operator ``op``, by output name (the
    ``upstream_outputs`` of its golden module; ``KeyError`` for an unknown name, ``ValueError`` where the operator has
    no golden data)."""
    op = _operator.get(op)
    found = _operator.get(op).load("golden_outputs")(name)
    if found is None:
        raise ValueError(f"golden case {name!r} has no upstream outputs of {op.name} (upstream refused it)")
    return {n: found.get(n) for n in op.output_names}


def _cases_from_seed_file(golden: Union[PathLike, Mapping[str, Any]], match_specs: bool, op) -> List[BundleCase]:
    """The cases of a golden file of the seed-case layout (``name -> {"kind", "kw", "inputs", "upstream"}``)."""
    source_sha = None
    source = "in-memory golden dict"
    if not isinstance(golden, Mapping):
        golden_path = Path(golden)
        source, source_sha = golden_path.name, hashlib.sha256(golden_path.read_bytes()).hexdigest()
        golden = torch.load(golden_path, weights_only=True)
    kind_of_outputs = outputs_type(op)
    out = []
    for name, item in golden.items():
        inputs = dict(item["inputs"])
        kw = dict(item.get("kw") or {})
        kind = str(item.get("kind", "unknown"))
        spec = _golden_spec(kind, kw, inputs, op) if match_specs else {"formula": kind, "kw": kw}
        meta = {"golden_name": name, "golden_kind": kind, "golden_kw": kw, "source": source}
        if source_sha:
            meta["source_sha256"] = source_sha
        out.append(BundleCase(name=name, inputs=inputs, outputs=kind_of_outputs(**item["upstream"]), spec=spec,
                              policy=None, backend=UPSTREAM_BACKEND, device="cuda", device_name=GOLDEN_DEVICE_NAME,
                              versions=dict(GOLDEN_VERSIONS), meta=meta, operator=op.name))
    return out


def _cases_from_stored(op) -> List[BundleCase]:
    """The operator's golden cases (``op.load("golden")()``, ``StoredCase`` objects) with their upstream outputs."""
    kind_of_outputs = outputs_type(op)
    out = []
    for stored in op.load("golden")():
        name = stored.case_id
        outputs = kind_of_outputs(**golden_outputs(name, op))
        out.append(BundleCase(name=name, inputs=op.draw(stored), outputs=outputs, spec=stored, policy=None,
                              backend=UPSTREAM_BACKEND, device="cuda", device_name=GOLDEN_DEVICE_NAME,
                              versions=dict(GOLDEN_WHOLE_OP_VERSIONS),
                              meta={"golden_name": name, "source": op.golden}, operator=op.name))
    return out


def cases_from_golden(golden: Union[PathLike, Mapping[str, Any], None] = None, *, match_specs: bool = True,
                      op: OperatorLike = None) -> List[BundleCase]:
    """The golden upstream cases of operator ``op`` as ``BundleCase`` objects (backend ``"upstream"``, no policy).

    Args:
        golden: a golden file of the seed-case layout (``name -> {"kind", "kw", "inputs", "upstream"}``, like
            ``upstream_h200_seed_cases.pt``) as a path or its loaded dict; or None: the operator's own golden data,
            i.e. its golden module's ``default_path()`` file where it has one (stage 1's seed cases), else its
            stored cases (``op.load("golden")()``, the whole-op H200 data for the forward and stage 2) with the
            outputs of its ``upstream_outputs``.
        match_specs (bool): seed-layout files: give a case a ``CaseSpec`` when the seed formula reproduces its
            stored inputs bit for bit (otherwise, or when False, the spec is ``{"formula": kind, "kw": kw}``). Stored
            cases keep their ``StoredCase`` spec (saved as a dict of its name and sizes).
        op (str | Operator, optional): the operator (default: the registry's default operator).

    Returns:
        list: one case per golden entry, in file order; the golden name is the case name and the outputs are the
        stored upstream outputs as the kernel wrote them (stage 1: ``dmimo_o``/``dmimo_z`` per batch).
    """
    op = _operator.get(op)
    if golden is None:
        default_path = getattr(operator_module(op, "golden"), "default_path", None)
        if default_path is None:
            return _cases_from_stored(op)
        golden = default_path()
    return _cases_from_seed_file(golden, match_specs, op)


def golden_to_bundle(golden: Optional[PathLike], out: PathLike, *, overwrite: bool = False,
                     op: OperatorLike = None) -> Path:
    """Convert golden data into a bundle at ``out`` (lossless; ``golden`` and ``op`` as in :func:`cases_from_golden`)."""
    op = _operator.get(op)
    source = str(golden) if golden is not None else f"golden data of {op.name}"
    return save_bundle(out, cases_from_golden(golden, op=op), overwrite=overwrite, op=op,
                       meta={"converted_from": source, "note": "golden upstream outputs (H200), see "
                                                               "tests/data/README.md"})
