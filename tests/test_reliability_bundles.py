"""Randomized corruption of result bundles: what ``load_bundle(verify=True)`` detects.

``tests/test_bundles.py`` covers one instance of each corruption; here they are fuzzed (hypothesis) over every file
and byte of a small bundle (two cases with outputs in bf16 and fp16, one skipped case):

* a flipped byte anywhere in a tensor file, a truncation at any length, appended bytes: ``BundleError`` naming that
  file, with and without ``verify`` where the structure allows it;
* two same-shape input tensors, or two same-shape outputs, swapped by a tool that rewrites the file and the
  manifest consistently (file hash and size updated, manifest resealed): caught by the inputs or outputs digest;
* a flipped byte anywhere in ``manifest.json``: refused (``manifest_sha256``, finding F3 of
  ``reports/reliability.md``), unless it only changed insignificant whitespace (the JSON is the same); hand edits
  (a case name, a key name, a seed digit, a timestamp) are refused by the digest, and unknown keys also when the
  manifest is resealed;
* policies and specs from the future are refused; ``compare`` refuses inputs that differ in a single bit.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import bundle_manifest, bundles  # noqa: E402
from mimo_numerics.bundles import BundleCase, BundleError, bit_identical, load_bundle, save_bundle  # noqa: E402
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES

# ---------------------------------------------------------------------------------------------------- profiles
from reliability_support import counts_writer, profile  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402

COUNTS = collections.Counter()
_write_counts = counts_writer(COUNTS, __file__)


# ---------------------------------------------------------------------------------------------------- the bundle
SPECS = (
    CaseSpec(seqlen=6, state_dim=8, value_dim=4, rank=2, chunk_size=4, has_z=True, has_d=True),
    CaseSpec(seqlen=5, state_dim=8, value_dim=4, rank=1, chunk_size=2, reduce_o=False, dtype="float16"),
)


def _cases():
    items = []
    for i, spec in enumerate(SPECS):
        x = make_inputs(spec)
        policy = mn.presets.get("upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
        out = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
        items.append(BundleCase(name=f"case{i}", inputs=x, outputs=out, spec=spec, policy=policy,
                                backend="reference", device_name="CPU", versions={"torch": torch.__version__},
                                meta={"note": "reliability fuzz"}))
    items.append(BundleCase(name="skipped", inputs=make_inputs(SPECS[0]), spec={"origin": "hand-made"},
                            backend="upstream", skipped="upstream limitation: test"))
    return items


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    return save_bundle(tmp_path_factory.mktemp("reliability") / "bundle", _cases())


@pytest.fixture(scope="module")
def original(bundle_dir):
    return load_bundle(bundle_dir)


class corrupted:
    """Context manager: replace one file's bytes, restore them on exit (the module's bundle is shared)."""

    def __init__(self, path: Path, data: bytes):
        self.path, self.data = path, data

    def __enter__(self):
        self.saved = self.path.read_bytes()
        self.path.write_bytes(self.data)
        return self.path

    def __exit__(self, *exc):
        self.path.write_bytes(self.saved)
        return False


def _tensor_files(bundle_dir):
    return sorted(p.name for p in bundle_dir.iterdir() if p.name != bundles.MANIFEST)


def _data_differences(a, b):
    """What differs between two loaded bundles: 'data' (tensors, size arguments) and the descriptive fields (case
    name, policy, spec, provenance), which the manifest alone holds."""
    data, meta = [], []
    for ca, cb in zip(a.cases, b.cases):
        for n in INPUT_NAMES:
            if not bit_identical(ca.inputs[n], cb.inputs[n]):
                data.append(f"{ca.name}.inputs.{n}")
        for n in mn.operator.get("mamba_mimo_bwd_fwd").scalar_inputs:
            if ca.inputs[n] != cb.inputs[n]:
                data.append(f"{ca.name}.{n}")
        if (ca.outputs is None) != (cb.outputs is None):
            data.append(f"{ca.name}.outputs")
        elif ca.outputs is not None:
            data += [f"{ca.name}.outputs.{n}" for n in OUTPUT_NAMES
                     if not bit_identical(getattr(ca.outputs, n), getattr(cb.outputs, n))]
        for f in ("name", "policy", "spec", "backend", "device", "device_name", "versions", "created", "skipped", "meta"):
            if getattr(ca, f) != getattr(cb, f):
                meta.append(f"{ca.name}.{f}")
    if len(a.cases) != len(b.cases):
        data.append("number of cases")
    if a.created != b.created or a.meta != b.meta:
        meta.append("bundle.created/meta")
    return data, meta


# ---------------------------------------------------------------------------------------------------- tensor files
def _byte_flip(profile_name: str, examples: int):
    counter = f"bundle_tensor_file_byte_flip[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data())
    def check(bundle_dir, data):
        name = data.draw(st.sampled_from(_tensor_files(bundle_dir)), label="file")
        path = bundle_dir / name
        raw = bytearray(path.read_bytes())
        pos = data.draw(st.integers(0, len(raw) - 1), label="position")
        raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
        COUNTS[counter] += 1
        with corrupted(path, bytes(raw)):
            with pytest.raises(BundleError) as info:
                load_bundle(bundle_dir, verify=True)
        assert Path(info.value.path).name == name and name in str(info.value), str(info.value)

    return check


test_tensor_file_byte_flip_is_detected = _byte_flip("fast", 200)
test_tensor_file_byte_flip_is_detected_slow = pytest.mark.slow(_byte_flip("slow", 3000))


def _truncation(profile_name: str, examples: int):
    counter = f"bundle_tensor_file_truncation[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data(), verify=st.booleans())
    def check(bundle_dir, data, verify):
        name = data.draw(st.sampled_from(_tensor_files(bundle_dir)), label="file")
        path = bundle_dir / name
        raw = path.read_bytes()
        length = data.draw(st.integers(0, len(raw) - 1), label="length")
        COUNTS[counter] += 1
        with corrupted(path, raw[:length]):
            with pytest.raises(BundleError) as info:
                load_bundle(bundle_dir, verify=verify)
        assert Path(info.value.path).name == name, str(info.value)

    return check


test_tensor_file_truncation_is_detected = _truncation("fast", 60)
test_tensor_file_truncation_is_detected_slow = pytest.mark.slow(_truncation("slow", 2000))


def _appended(profile_name: str, examples: int):
    counter = f"bundle_appended_bytes[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data(), extra=st.binary(min_size=1, max_size=64), verify=st.booleans())
    def check(bundle_dir, original, data, extra, verify):
        name = data.draw(st.sampled_from(_tensor_files(bundle_dir) + [bundles.MANIFEST]), label="file")
        path = bundle_dir / name
        COUNTS[counter] += 1
        with corrupted(path, path.read_bytes() + extra):
            try:
                loaded = load_bundle(bundle_dir, verify=verify)
            except BundleError as exc:
                assert Path(exc.path).name == name, str(exc)
                return
        # only trailing whitespace after the manifest's JSON can be harmless; then nothing may have changed
        assert name == bundles.MANIFEST and not extra.strip(), f"{name}: {extra!r} appended and accepted"
        assert _data_differences(original, loaded) == ([], [])

    return check


test_appended_bytes_are_detected = _appended("fast", 30)
test_appended_bytes_are_detected_slow = pytest.mark.slow(_appended("slow", 1000))


# ---------------------------------------------------------------------------------------------------- swaps
SAME_SHAPE_GROUPS = (("da_cs", "da_cs_rev", "dt"), ("q", "k"), ("q_bias", "k_bias"), ("mimo_v", "mimo_o", "mimo_z"),
                     ("v", "z", "dout"))


def _rewrite(bundle_dir, file_name, edit):
    """Rewrite one tensor file with ``edit(dict)``, update its sha256 and size in the manifest and reseal the manifest
    (a tool that knows the format but not the semantics); returns the (file bytes, manifest bytes) to install."""
    path = bundle_dir / file_name
    tensors, meta = bundles.decode_safetensors(path.read_bytes(), path)
    data = bundles.encode_safetensors(edit(dict(tensors)), meta)
    manifest = json.loads((bundle_dir / bundles.MANIFEST).read_text())
    for entry in manifest["cases"]:
        for info in entry["files"].values():
            if info["path"] == file_name:
                info["sha256"], info["size"] = bundles._sha256_file_bytes(data), len(data)
    return data, json.dumps(bundle_manifest.seal(manifest)).encode()


@given(data=st.data())
@profile("fast", 12)
def test_swapped_same_shape_inputs_are_caught_by_the_digest(bundle_dir, data):
    case = data.draw(st.sampled_from(["case0", "case1"]), label="case")
    tensors, _ = bundles.decode_safetensors((bundle_dir / f"{case}.inputs.safetensors").read_bytes())
    pairs = [(a, b) for group in SAME_SHAPE_GROUPS for a in group for b in group
             if a < b and a in tensors and b in tensors and tensors[a].shape == tensors[b].shape
             and tensors[a].dtype == tensors[b].dtype]
    a, b = data.draw(st.sampled_from(pairs), label="pair")
    note(f"{case}: swap {a} <-> {b}")
    COUNTS["bundle_swapped_inputs[fast]"] += 1

    def swap(t):
        t[a], t[b] = t[b], t[a]
        return t

    file_bytes, manifest_bytes = _rewrite(bundle_dir, f"{case}.inputs.safetensors", swap)
    with corrupted(bundle_dir / f"{case}.inputs.safetensors", file_bytes), \
            corrupted(bundle_dir / bundles.MANIFEST, manifest_bytes):
        with pytest.raises(BundleError, match=rf"{case}.inputs.safetensors: inputs digest of case '{case}'"):
            load_bundle(bundle_dir)


def test_swapped_outputs_with_updated_hash_are_detected(bundle_dir):
    # F3 (b): same shape and dtype, hash, size and manifest digest updated: only the outputs digest can tell
    def swap(t):
        t["dmimo_o"], t["dmimo_z"] = t["dmimo_z"], t["dmimo_o"]
        return t

    file_bytes, manifest_bytes = _rewrite(bundle_dir, "case0.outputs.safetensors", swap)
    with corrupted(bundle_dir / "case0.outputs.safetensors", file_bytes), \
            corrupted(bundle_dir / bundles.MANIFEST, manifest_bytes):
        with pytest.raises(BundleError, match=r"case0.outputs.safetensors: outputs digest of case 'case0' does not "
                                              "match"):
            load_bundle(bundle_dir)
        load_bundle(bundle_dir, verify=False)  # digests are what verify adds: the structure is consistent


# ---------------------------------------------------------------------------------------------------- manifest
def _manifest_flip(profile_name: str, examples: int):
    counter = f"bundle_manifest_byte_flip[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data())
    def check(bundle_dir, original, data):
        path = bundle_dir / bundles.MANIFEST
        raw = bytearray(path.read_bytes())
        pos = data.draw(st.integers(0, len(raw) - 1), label="position")
        raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
        note(f"byte {pos}: {bytes(raw[max(0, pos - 30):pos + 10])!r}")
        COUNTS[counter] += 1
        with corrupted(path, bytes(raw)):
            try:
                loaded = load_bundle(bundle_dir, verify=True)
            except BundleError as exc:
                assert Path(exc.path).name == bundles.MANIFEST, str(exc)
                COUNTS[f"{counter}: refused"] += 1
                return
        # accepted: only insignificant whitespace may have changed (the digest is over the parsed JSON)
        assert json.loads(bytes(raw)) == json.loads(path.read_bytes()), "a manifest flip changed its JSON and loaded"
        assert _data_differences(original, loaded) == ([], [])
        COUNTS[f"{counter}: accepted, whitespace only (same JSON, nothing returned changed)"] += 1

    return check


test_manifest_byte_flip_is_refused = _manifest_flip("fast", 200)
test_manifest_byte_flip_is_refused_slow = pytest.mark.slow(_manifest_flip("slow", 5000))


def _edit_manifest(bundle_dir, edit, reseal=False):
    """The manifest's bytes after ``edit(dict)``; ``reseal``: with a fresh ``manifest_sha256``, as a tool that knows
    the format (or a future version) would write it, so that only the semantic and key checks can refuse it."""
    manifest = json.loads((bundle_dir / bundles.MANIFEST).read_text())
    edit(manifest)
    if reseal:
        manifest = bundle_manifest.seal(manifest)
    return json.dumps(manifest, indent=1).encode()


def _spec_seed(m):
    m["cases"][0]["spec"]["seed"] += 1


def _spec_type_key(m):
    m["cases"][0]["spec_typf"] = m["cases"][0].pop("spec_type")


def _created(m):
    m["cases"][0]["created"] = "2020-01-01T00:00:00Z"


def _policy_key(m):  # one flipped bit: "policy" -> "qolicy" (found by the slow manifest fuzz)
    m["cases"][0]["qolicy"] = m["cases"][0].pop("policy")


def _case_name(m):  # one flipped bit: "case0" -> "base0" (found by the slow manifest fuzz): compare matches by name
    m["cases"][0]["name"] = "base0"


def _version_1(m):  # a downgrade to the schema without digests (one flipped byte: "2" -> "1")
    m["schema_version"] = 1


def _version_2(m):  # a downgrade to the schema without the operator, keeping its key
    m["schema_version"] = 2


def _operator_changed(m):  # another operator: the digest refuses it; resealed, the tensor tables do
    m["operator"] = "mamba_mimo_fwd"


def _operator_unknown(m):
    m["operator"] = "mamba_mimo_bwd_fwd_v2"


MANIFEST_EDITS = [
    pytest.param(_spec_seed, id="spec_seed_digit"),
    pytest.param(_spec_type_key, id="spec_type_key_renamed"),
    pytest.param(_created, id="created_changed"),
    pytest.param(_policy_key, id="policy_key_renamed"),
    pytest.param(_case_name, id="case_name_changed"),
    pytest.param(_version_1, id="schema_version_downgraded"),
    pytest.param(_version_2, id="schema_version_downgraded_to_2"),
    pytest.param(_operator_changed, id="operator_changed"),
]


@pytest.mark.parametrize("edit", MANIFEST_EDITS)
def test_manifest_edits_are_detected(bundle_dir, edit):
    # F3 (a): every edit of the manifest's content is refused by its digest (or, for the downgrade, by its version)
    COUNTS["bundle_manifest_edits[enumerated]"] += 1
    with corrupted(bundle_dir / bundles.MANIFEST, _edit_manifest(bundle_dir, edit)):
        with pytest.raises(BundleError, match=r"manifest.json: (manifest_sha256 mismatch|schema_version 1: )"):
            load_bundle(bundle_dir)


def _top_level_key(m):
    m["comment"] = "hand-made"


def _file_info_key(m):
    m["cases"][0]["files"]["inputs"]["sha512"] = "0"


def _tensor_table_name(m):
    m["cases"][0]["tensors"]["outputs"]["dmimo_q"] = None


@pytest.mark.parametrize("edit, text", [
    (_spec_type_key, "case entry #0 ('case0') has unknown key(s) ['spec_typf'] and missing key(s) ['spec_type']"),
    (_policy_key, "case entry #0 ('case0') has unknown key(s) ['qolicy'] and missing key(s) ['policy']"),
    (_top_level_key, "the manifest's top level has unknown key(s) ['comment']"),
    (_file_info_key, "\"files\".inputs of case 'case0' has unknown key(s) ['sha512']"),
    (_tensor_table_name, "\"tensors\".outputs of case 'case0' has unknown key(s) ['dmimo_q']"),
    (_version_1, "the manifest's top level has unknown key(s) ['manifest_sha256', 'operator']"),
    (_version_2, "the manifest's top level has unknown key(s) ['operator']"),
], ids=lambda v: getattr(v, "__name__", "")[1:] if callable(v) else "")
@pytest.mark.parametrize("verify", [True, False])
def test_unknown_keys_are_refused_even_in_a_resealed_manifest(bundle_dir, edit, text, verify):
    COUNTS["bundle_manifest_edits[enumerated]"] += 1
    with corrupted(bundle_dir / bundles.MANIFEST, _edit_manifest(bundle_dir, edit, reseal=True)):
        with pytest.raises(BundleError, match="manifest.json") as info:
            if edit is _version_1 and verify:  # verify=True refuses version 1 outright; the upgrade reads it
                bundles.upgrade_bundle(bundle_dir, bundle_dir.parent / "never_written")
            else:
                load_bundle(bundle_dir, verify=verify)
    assert text in str(info.value), str(info.value)
    assert not (bundle_dir.parent / "never_written").exists()


def _policy_from_the_future(m):
    m["cases"][0]["policy"]["schema_version"] = 99


def _policy_unknown_field(m):
    m["cases"][0]["policy"]["gemm_accumulator"] = "fp16"


def _policy_unknown_value(m):
    m["cases"][0]["policy"]["diag_mode"] = "fma3"


def _policy_inconsistent_knobs(m):  # an FP32-level model with float64 math
    m["cases"][0]["policy"]["fp32_fma"] = True
    m["cases"][0]["policy"]["math_dtype"] = "float64"


def _spec_unknown_field(m):
    m["cases"][0]["spec"]["sequence_parallel"] = 2


def _spec_type_unknown(m):
    m["cases"][0]["spec_type"] = "CaseSpecV2"


def _scalars_missing(m):
    del m["cases"][1]["scalars"]["chunk_size"]


def _files_path_escape(m):
    m["cases"][1]["files"]["inputs"]["path"] = "../case1.inputs.safetensors"


@pytest.mark.parametrize("edit, text", [
    (_policy_from_the_future, "policy of case 'case0' does not load: policy schema_version 99"),
    (_policy_unknown_field, "unknown RoundingPolicy field"),
    (_policy_unknown_value, "diag_mode='fma3'"),
    (_policy_inconsistent_knobs, "fp32_fma=True models FP32 arithmetic"),
    (_spec_unknown_field, "sequence_parallel"),
    (_spec_type_unknown, "unknown spec_type"),
    (_scalars_missing, "lacks chunk_size/rotary_dim_divisor"),
    (_files_path_escape, "bad or duplicate file path"),
    (_operator_changed, "\"tensors\".inputs of case 'case0' has unknown key(s) ['dout']; expected exactly ['q', "),
    (_operator_changed, "(the inputs of operator mamba_mimo_fwd, which the manifest names)"),
    (_operator_unknown, "unknown operator 'mamba_mimo_bwd_fwd_v2'"),
], ids=lambda v: getattr(v, "__name__", "")[1:] if callable(v) else "")
def test_manifest_from_the_future_or_broken_is_refused(bundle_dir, edit, text):
    COUNTS["bundle_manifest_edits[enumerated]"] += 1
    with corrupted(bundle_dir / bundles.MANIFEST, _edit_manifest(bundle_dir, edit, reseal=True)):
        with pytest.raises(BundleError, match="manifest.json") as info:
            load_bundle(bundle_dir)
    assert text in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------------- compare
def test_compare_refuses_inputs_differing_in_one_bit(tmp_path, capsys):
    from mimo_numerics import cli

    items = _cases()[:1]
    a = save_bundle(tmp_path / "a", items)
    dt = items[0].inputs["dt"].clone()
    dt.view(torch.int32).view(-1)[0] ^= 1  # the last mantissa bit of one element
    b = save_bundle(tmp_path / "b", [items[0].replace(inputs=dict(items[0].inputs, dt=dt))])
    assert cli.main(["compare", str(a), str(b)]) == 2
    assert "inputs differ" in capsys.readouterr().err
    assert cli.main(["compare", str(a), str(b), "--allow-different-inputs"]) == 0
    assert cli.main(["compare", str(a), str(a), "--threshold", "0"]) == 0
