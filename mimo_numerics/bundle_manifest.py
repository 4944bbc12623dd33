"""The ``manifest.json`` of a result bundle: its keys, its own digest, and the checks made before any tensor is read.

Schema version 3 (since bundles hold the cases of any operator)::

    {"schema": "mimo_numerics.bundle", "schema_version": 3, "manifest_sha256": "<64 hex digits>",
     "operator": "<registry name>", "created": "...", "meta": {...}, "cases": [<case entry>, ...]}

``operator`` names the operator every case of the bundle ran (``mimo_numerics.ops.registry``); the tensor tables of
the case entries have exactly that operator's input names (``op.input_names``) and output names
(``op.output_names``), and ``scalars`` its scalar inputs (``op.scalar_inputs``). An operator this package does not
know is refused, naming it.

``manifest_sha256`` is the sha256 of the canonical JSON of the parsed manifest without that key (keys sorted,
separators ``,`` and ``:``, ASCII only; :func:`manifest_digest`). It protects what only the manifest holds (the
operator, case names, specs, policies, provenance, the files' sha256 and sizes); whitespace and key order in the file
do not matter. Every case entry has exactly the keys of :data:`CASE_KEYS`, including ``outputs_digest`` (the
layout-free digest of the outputs, null without outputs, like ``inputs_digest`` for the inputs); the top level, the
``files``, ``tensors`` and ``scalars`` tables have fixed keys too. A missing or unknown key is refused, with or without
``verify``; the digest is checked with ``verify`` (the default).

Older versions, written when the package knew one operator, are read as bundles of that operator
(:data:`LEGACY_OPERATOR`, backward stage 1):

* version 2 has no ``operator`` key; it verifies fully (digest, hashes) and ``upgrade`` rewrites it as version 3;
* version 1 (before finding F3 of ``reports/reliability.md``) has neither ``manifest_sha256`` nor ``outputs_digest``.
  Loading it with ``verify=True`` is refused with a message saying how to upgrade it (``mimo-numerics upgrade OLD
  --out NEW``, which checks every file hash and inputs digest of the old bundle and writes it again as the current
  version); ``verify=False`` still reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence, Union

from . import operator as _operator
from .ops import registry

#: Value of the manifest's ``"schema"`` key.
SCHEMA = "mimo_numerics.bundle"
#: The manifest schema version this package writes.
SCHEMA_VERSION = 3
#: The oldest schema version this package can read (only unverified, or to upgrade it).
OLDEST_SCHEMA_VERSION = 1
#: The oldest schema version that can be fully verified (manifest digest and outputs digests).
OLDEST_VERIFIABLE_VERSION = 2
#: The operator of bundles written before schema version 3 (no ``operator`` key): the package's only operator then,
#: the one version-1 policy files describe too.
LEGACY_OPERATOR = registry.V1_OPERATOR
MANIFEST = "manifest.json"
DIGEST_KEY = "manifest_sha256"
OPERATOR_KEY = "operator"

#: Top-level keys of the manifest, per schema version.
TOP_KEYS = {1: ("schema", "schema_version", "created", "meta", "cases"),
            2: ("schema", "schema_version", DIGEST_KEY, "created", "meta", "cases"),
            3: ("schema", "schema_version", DIGEST_KEY, OPERATOR_KEY, "created", "meta", "cases")}
_CASE_KEYS_V1 = ("name", "spec_type", "spec", "policy", "backend", "device", "device_name", "versions", "created",
                 "skipped", "meta", "scalars", "inputs_digest", "tensors", "files")
#: Keys of a case entry, per schema version.
CASE_KEYS = {1: _CASE_KEYS_V1, 2: _CASE_KEYS_V1 + ("outputs_digest",), 3: _CASE_KEYS_V1 + ("outputs_digest",)}
FILE_KEYS = ("path", "sha256", "size")
TENSOR_KEYS = ("dtype", "shape")

PathLike = Union[str, os.PathLike]


class BundleError(ValueError):
    """A bundle that cannot be written or does not verify. ``path`` is the offending file (or the bundle)."""

    def __init__(self, path: PathLike, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class OldSchemaError(BundleError):
    """A bundle of an older schema version, refused by ``verify=True`` because it cannot be fully verified."""


# ---------------------------------------------------------------------------------------------------------- digest
def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of ``value``: keys sorted, no whitespace, ASCII (non-ASCII escaped)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``manifest`` without its ``manifest_sha256`` key."""
    return hashlib.sha256(canonical_json({k: v for k, v in manifest.items() if k != DIGEST_KEY})).hexdigest()


def seal(manifest: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of ``manifest`` with a fresh ``manifest_sha256``, placed right after ``schema_version``."""
    digest = manifest_digest(manifest)
    sealed: Dict[str, Any] = {}
    for key, value in manifest.items():
        if key != DIGEST_KEY:
            sealed[key] = value
        if key == "schema_version":
            sealed[DIGEST_KEY] = digest
    if DIGEST_KEY not in sealed:
        sealed[DIGEST_KEY] = digest
    return sealed


# ---------------------------------------------------------------------------------------------------------- reading
def _refuse_duplicate_keys(pairs):
    """``json.loads`` hook: an object with a repeated key is an error (the last value would win silently)."""
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _check_keys(obj, expected: Sequence[str], what: str, where: Path, why: str = "") -> None:
    """Refuse a non-object, or an object whose keys are not exactly ``expected`` (``why``: appended to the
    message, saying where the expected keys come from)."""
    if not isinstance(obj, dict):
        raise BundleError(where, f"{what} must be a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in expected]
    missing = [k for k in expected if k not in obj]
    if unknown or missing:
        parts = ([f"unknown key(s) {unknown}"] if unknown else []) + ([f"missing key(s) {missing}"] if missing else [])
        raise BundleError(where, f"{what} has {' and '.join(parts)}; expected exactly {list(expected)}{why}")


def _check_case_entry(entry, index: int, version: int, op, where: Path) -> None:
    """The keys of one case entry and of its ``files``, ``tensors`` and ``scalars`` tables (the names of operator
    ``op``), and the types of its descriptive fields (names, file paths, policy and spec are checked where they are
    used)."""
    label = f"case entry #{index}" + (f" ({entry.get('name')!r})" if isinstance(entry, dict) else "")
    _check_keys(entry, CASE_KEYS[version], label, where)
    name, files = entry["name"], entry["files"]
    if not isinstance(files, dict) or "inputs" not in files or any(k not in ("inputs", "outputs") for k in files):
        raise BundleError(where, f"\"files\" of case {name!r} must be an object with the key \"inputs\" and "
                                 f"optionally \"outputs\", got {list(files) if isinstance(files, dict) else files!r}")
    for kind, info in files.items():
        _check_keys(info, FILE_KEYS, f"\"files\".{kind} of case {name!r}", where)
    tables = {"inputs": op.input_names, "outputs": op.output_names}
    _check_keys(entry["tensors"], tuple(tables), f"\"tensors\" of case {name!r}", where)
    for kind, names in tables.items():
        table = entry["tensors"][kind]
        if table is None and kind == "outputs":
            continue
        _check_keys(table, names, f"\"tensors\".{kind} of case {name!r}", where,
                    f" (the {kind} of operator {op.name}, which the manifest names)")
        for tensor, info in table.items():
            if info is not None:
                _check_keys(info, TENSOR_KEYS, f"\"tensors\".{kind}.{tensor} of case {name!r}", where)
    scalars, wanted = entry["scalars"], op.scalar_inputs
    if not (isinstance(scalars, dict) and sorted(scalars) == sorted(wanted)
            and all(type(scalars[k]) is int for k in wanted)):
        expected = ", ".join(f'"{k}": int' for k in wanted)
        raise BundleError(where, f"case {name!r} lacks {'/'.join(wanted)}: \"scalars\" must be {{{expected}}}, "
                                 f"got {scalars!r}")
    for key in ("backend", "device"):
        if not isinstance(entry[key], str):
            raise BundleError(where, f"{key!r} of case {name!r} must be a string, got {entry[key]!r}")
    for key in ("device_name", "created", "skipped", "spec_type"):
        if entry[key] is not None and not isinstance(entry[key], str):
            raise BundleError(where, f"{key!r} of case {name!r} must be a string or null, got {entry[key]!r}")
    for key in ("versions", "meta"):
        if not isinstance(entry[key], dict):
            raise BundleError(where, f"{key!r} of case {name!r} must be a JSON object, got {entry[key]!r}")


def _legacy_message(version: int) -> str:
    return (f"schema_version {version}: written before bundles protected manifest.json and their outputs (no "
            f"{DIGEST_KEY}, no outputs digests), so verify=True cannot vouch for it; upgrade it once with "
            f"`mimo-numerics upgrade BUNDLE --out NEW_BUNDLE` (bundles.upgrade_bundle: verifies every file's sha256 "
            f"and the inputs digests, then writes schema_version {SCHEMA_VERSION}), or read it unverified with "
            f"load_bundle(path, verify=False)")


def manifest_operator(manifest: Mapping[str, Any]) -> str:
    """The operator name of a checked manifest (:data:`LEGACY_OPERATOR` before schema version 3)."""
    return manifest[OPERATOR_KEY] if manifest["schema_version"] >= 3 else LEGACY_OPERATOR


def _check_operator(manifest: Mapping[str, Any], where: Path):
    """The :class:`~mimo_numerics.operator.Operator` a manifest names (refused when unknown or not a string)."""
    if manifest["schema_version"] < 3:
        return _operator.get(LEGACY_OPERATOR)
    name = manifest[OPERATOR_KEY]
    if not isinstance(name, str) or name not in registry.OPERATORS:
        raise BundleError(where, f"unknown operator {name!r}: this mimo_numerics knows {list(registry.OPERATORS)} "
                                 "(a bundle of a newer version? upgrade mimo_numerics)")
    return _operator.get(name)


def read_manifest(path: Path, verify: bool = True, allow_legacy: bool = False) -> dict:
    """Parse and check ``<path>/manifest.json``; returns the manifest dict.

    Checks, in order: the bundle is a directory with a manifest; the manifest is JSON without duplicate keys, of
    this schema, of a version this package reads (version 1 needs ``verify=False`` or ``allow_legacy``); with
    ``verify``, ``manifest_sha256`` matches the content; then every key of the top level, the operator (a registered
    one; :func:`manifest_operator`) and the case entries (tables of that operator's names).

    Raises:
        BundleError: naming ``manifest.json`` (or the bundle directory) and what is wrong.
    """
    if not path.is_dir():
        raise BundleError(path, "not a bundle: no such directory" if not path.exists() else
                          "not a bundle: not a directory")
    where = path / MANIFEST
    if not where.is_file():
        raise BundleError(where, "missing: this directory is not a bundle (or its write was interrupted)")
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(where, f"not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise BundleError(where, f"not a bundle manifest (expected \"schema\": \"{SCHEMA}\")")
    version = manifest.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < OLDEST_SCHEMA_VERSION:
        raise BundleError(where, f"unknown schema_version {version!r} (this mimo_numerics reads schema_version "
                                 f"{OLDEST_VERIFIABLE_VERSION} to {SCHEMA_VERSION}, and {OLDEST_SCHEMA_VERSION} to "
                                 "upgrade it)")
    if version > SCHEMA_VERSION:
        raise BundleError(where, f"schema_version {version} is newer than this mimo_numerics reads "
                                 f"({SCHEMA_VERSION}); upgrade mimo_numerics to read this bundle")
    if version < OLDEST_VERIFIABLE_VERSION and verify and not allow_legacy:
        raise OldSchemaError(where, _legacy_message(version))
    if verify and version >= OLDEST_VERIFIABLE_VERSION:
        if DIGEST_KEY not in manifest:
            raise BundleError(where, f"no {DIGEST_KEY} in a schema_version {version} manifest: manifest.json is "
                                     "corrupt or was edited")
        stored, actual = manifest[DIGEST_KEY], manifest_digest(manifest)
        if stored != actual:
            raise BundleError(where, f"{DIGEST_KEY} mismatch: the content hashes to {actual[:16]}..., the file says "
                                     f"{str(stored)[:16]}...: manifest.json is corrupt or was edited")
    _check_keys(manifest, TOP_KEYS[version], "the manifest's top level", where)
    if not isinstance(manifest["cases"], list):
        raise BundleError(where, "manifest has no \"cases\" list")
    if not isinstance(manifest["meta"], dict):
        raise BundleError(where, f"\"meta\" must be a JSON object, got {manifest['meta']!r}")
    op = _check_operator(manifest, where)
    for index, entry in enumerate(manifest["cases"]):
        _check_case_entry(entry, index, version, op, where)
    return manifest
