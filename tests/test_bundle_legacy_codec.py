"""Bundles written by the hand-written safetensors codec (before the ``safetensors`` package) still load, unchanged.

``tests/data/bundle_legacy_codec`` was written at commit 97b53fc by that codec (its README has the script). Its files
are valid safetensors byte for byte: the library parses them as they are, so no legacy reader is needed. The bytes a
new write produces differ (the library orders tensors by dtype alignment and writes other metadata), which is why the
manifest's per-file sha256 is checked against the file as written, and the layout-free inputs/outputs digests carry
across codecs.
"""

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from safetensors import safe_open

from mimo_numerics import bundles
from mimo_numerics.bundles import BundleError, bit_identical, decode_safetensors, load_bundle, save_bundle
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES

LEGACY = Path(__file__).parent / "data" / "bundle_legacy_codec"
BUNDLE = LEGACY / "bundle"
CASES = ("legacy_bf16", "legacy_fp16_fp64", "legacy_skipped")


def _manifest():
    return json.loads((BUNDLE / "manifest.json").read_text())


def test_legacy_bundle_verifies_with_the_digests_the_old_code_wrote():
    # verify=True recomputes every file's sha256 and the inputs/outputs digests (name, dtype, shape and bytes of every
    # tensor) and compares them with those the old code stored: the tensors are the ones it wrote, bit for bit
    bundle = load_bundle(BUNDLE)
    assert bundle.names() == CASES
    entries = {e["name"]: e for e in _manifest()["cases"]}
    for case in bundle:
        assert case.inputs_digest == entries[case.name]["inputs_digest"]
        assert case.outputs_digest == entries[case.name]["outputs_digest"]
    dtypes = {c.name: {n: t.dtype for n, t in c.outputs._asdict().items() if t is not None}
              for c in bundle if c.outputs is not None}
    assert dtypes["legacy_bf16"] == {"dmimo_o": torch.float32, "states": torch.bfloat16, "dz": torch.bfloat16,
                                     "dmimo_z": torch.float32, "qk_dot": torch.bfloat16}
    assert dtypes["legacy_fp16_fp64"] == {"states": torch.float64, "qk_dot": torch.float64}
    assert bundle["legacy_skipped"].outputs is None and bundle["legacy_skipped"].skipped


def test_legacy_inputs_have_the_layout_of_their_spec():
    # written by the generator of 97b53fc (torch.randn draws): the machine-independent generator of today draws
    # other values, so the inputs are compared by name, shape and dtype, and by their stored digests (verify=True)
    bundle = load_bundle(BUNDLE, verify=True)
    for case in bundle:
        # the skipped case has a free-form spec; the script gave it the inputs of the bf16 case's spec
        spec = case.spec if isinstance(case.spec, CaseSpec) else bundle["legacy_bf16"].spec
        made = make_inputs(spec)
        for n in INPUT_NAMES:
            a, b = case.inputs[n], made[n]
            assert (a is None) == (b is None), (case.name, n)
            if a is not None:
                assert a.shape == b.shape and a.dtype == b.dtype, (case.name, n)


@pytest.mark.parametrize("file_name", sorted(p.name for p in BUNDLE.glob("*.safetensors")))
def test_legacy_files_are_valid_safetensors_byte_for_byte(file_name):
    path = BUNDLE / file_name
    library = st.load_file(str(path))
    ours, metadata = decode_safetensors(path.read_bytes(), path)
    assert sorted(library) == sorted(ours)
    assert all(bit_identical(library[n], ours[n]) for n in ours)
    case, kind = file_name.split(".")[:2]
    assert metadata == {"format": "pt", "case": case, "kind": kind}  # what the old codec wrote
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata


def _all_dtypes():
    """The tensors of ``all_dtypes.safetensors``, rebuilt with the formulas of the script that wrote it."""
    g = torch.arange(-6, 6)
    return {
        "f64": g.double() / 3, "f32": g.float() / 3, "f16": (g.float() / 3).half(), "bf16": (g.float() / 3).bfloat16(),
        "i64": g * 1_000_000_007, "i32": g.int() * 65537, "i16": g.short() * 251, "i8": g.to(torch.int8) * 9,
        "u8": (g + 6).to(torch.uint8) * 21, "bool": g % 3 == 0, "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5), "f32_2d": (g.float() / 7).reshape(3, 4),
    }


def test_legacy_file_of_every_dtype_loads_identically():
    data = (LEGACY / "all_dtypes.safetensors").read_bytes()
    tensors, metadata = decode_safetensors(data)
    expected = _all_dtypes()
    assert metadata == {"k": "v", "codec": "legacy"}
    assert sorted(tensors) == sorted(expected)
    for name, tensor in expected.items():
        assert bit_identical(tensors[name], tensor), name
    library = st.load(data)
    assert all(bit_identical(library[n], expected[n]) for n in expected)
    # and the new writer keeps them identical through a round trip
    back, _ = decode_safetensors(bundles.encode_safetensors(tensors))
    assert all(bit_identical(back[n], expected[n]) for n in expected)


def test_legacy_bundle_rewritten_by_the_new_codec_keeps_its_digests(tmp_path):
    legacy = load_bundle(BUNDLE)
    new = load_bundle(save_bundle(tmp_path / "new", legacy.cases, meta=legacy.meta))
    for a, b in zip(legacy, new):
        assert a.inputs_digest == b.inputs_digest and a.outputs_digest == b.outputs_digest
        assert all(bit_identical(a.inputs[n], b.inputs[n]) for n in INPUT_NAMES)
        if a.outputs is not None:
            assert all(bit_identical(getattr(a.outputs, n), getattr(b.outputs, n)) for n in OUTPUT_NAMES)


def test_legacy_bundle_tampering_is_still_refused(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(BUNDLE, copy)
    target = copy / "legacy_fp16_fp64.outputs.safetensors"
    data = bytearray(target.read_bytes())
    data[-3] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"{target.name}: sha256 mismatch"):
        load_bundle(copy)
    target.write_bytes(bytes(data[:-8]))
    with pytest.raises(BundleError, match=rf"{target.name}: truncated or corrupt tensor file"):
        load_bundle(copy, verify=False)


def test_schema_2_bundle_reads_as_stage_1_and_upgrades_to_the_current_schema(tmp_path):
    # written before bundles named their operator: read, verified, as a bundle of the package's first operator
    from mimo_numerics.ops import registry

    assert _manifest()["schema_version"] == 2 and "operator" not in _manifest()
    legacy = load_bundle(BUNDLE)
    assert legacy.schema_version == 2 and legacy.operator == registry.V1_OPERATOR == bundles.LEGACY_OPERATOR
    assert all(case.operator == registry.V1_OPERATOR for case in legacy)
    out = bundles.upgrade_bundle(BUNDLE, tmp_path / "v3")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == bundles.SCHEMA_VERSION and manifest["operator"] == registry.V1_OPERATOR
    upgraded = load_bundle(out)
    assert upgraded.meta["upgraded_from"] == {"schema_version": 2, "created": legacy.created}
    for a, b in zip(legacy, upgraded):
        assert (a.name, a.spec, a.policy, a.meta) == (b.name, b.spec, b.policy, b.meta)
        assert a.inputs_digest == b.inputs_digest and a.outputs_digest == b.outputs_digest
