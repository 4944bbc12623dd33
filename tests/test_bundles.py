"""Result bundles: exact round trips (golden data included), detection of every corruption, atomic writes."""

import dataclasses
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from safetensors import safe_open

from mimo_numerics import bundle_manifest, bundles, cases, cli
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference
from mimo_numerics.bundles import (BundleCase, BundleError, bit_identical, cases_from_golden, decode_safetensors,
                                   encode_safetensors, load_bundle, save_bundle)
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

GOLDEN = Path(__file__).parent / "data" / "upstream_h200_seed_cases.pt"
# two golden cases of different shapes (B=2,S=20,H=4,G=2 and B=1,S=20,H=1,G=1)
PAIR = ("seed_batch_groups", "seed_tail_chunk")


@pytest.fixture(scope="module")
def golden_cases():
    return cases_from_golden(GOLDEN)


@pytest.fixture(scope="module")
def golden_bundle(tmp_path_factory, golden_cases):
    return save_bundle(tmp_path_factory.mktemp("golden") / "bundle", golden_cases)


@pytest.fixture(scope="module")
def pair_bundle(tmp_path_factory, golden_cases):
    # the seed formula's spec of each case (same sizes as the stored inputs), so that spec checks apply
    chosen = [dataclasses.replace(c, spec=cases.spec_from_seed_kwargs(c.meta["golden_kw"]))
              for c in golden_cases if c.name in PAIR]
    return save_bundle(tmp_path_factory.mktemp("pair") / "bundle", chosen)


@pytest.fixture
def pair_copy(pair_bundle, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(pair_bundle, target)
    return target


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path, manifest, reseal=True):
    """Write an edited manifest; ``reseal``: with a fresh ``manifest_sha256``, as a tool that knows the format would,
    so that the checks after the manifest digest are what must refuse the edit."""
    if reseal:
        manifest = bundle_manifest.seal(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _as_version_1(path):
    """Turn a bundle into what schema_version 1 wrote: no manifest_sha256, no outputs_digest, no operator."""
    manifest = _manifest(path)
    del manifest["manifest_sha256"]
    del manifest["operator"]
    manifest["schema_version"] = 1
    for entry in manifest["cases"]:
        del entry["outputs_digest"]
    _write_manifest(path, manifest, reseal=False)


def _rewrite_consistently(bundle_dir, file_name, edit_tensors, edit_table=True):
    """Rewrite one tensor file with ``edit_tensors(dict) -> dict`` and update its hash/size (and tensor table) in the
    manifest, resealed, as a careless tool would: only the semantic checks can catch what it did."""
    path = bundle_dir / file_name
    tensors, meta = decode_safetensors(path.read_bytes(), path)
    tensors = edit_tensors(dict(tensors))
    data = encode_safetensors(tensors, meta)
    path.write_bytes(data)
    manifest = _manifest(bundle_dir)
    for entry in manifest["cases"]:
        for kind, info in entry["files"].items():
            if info["path"] == file_name:
                info["sha256"] = bundles._sha256_file_bytes(data)
                info["size"] = len(data)
                if edit_table:
                    table = entry["tensors"][kind]
                    for name in table:
                        table[name] = (None if name not in tensors else
                                       {"dtype": str(tensors[name].dtype).replace("torch.", ""),
                                        "shape": list(tensors[name].shape)})
    _write_manifest(bundle_dir, manifest)


# ---------------------------------------------------------------------------------------------------------- round trip
def test_golden_converts_losslessly(golden_cases, golden_bundle):
    raw = torch.load(GOLDEN, weights_only=True)
    loaded = load_bundle(golden_bundle)
    assert loaded.names() == tuple(raw)
    for case in loaded:
        item = raw[case.name]
        for name in INPUT_NAMES:
            assert bit_identical(case.inputs[name], item["inputs"][name]), (case.name, name)
        assert case.inputs["chunk_size"] == item["inputs"]["chunk_size"]
        assert case.inputs["rotary_dim_divisor"] == item["inputs"]["rotary_dim_divisor"]
        for name in OUTPUT_NAMES:
            assert bit_identical(getattr(case.outputs, name), item["upstream"][name]), (case.name, name)
        assert case.backend == "upstream" and case.policy is None
        assert case.device_name == bundles.GOLDEN_DEVICE_NAME
        assert case.versions["tilelang"] == "0.1.15"
        assert case.meta["golden_kw"] == item["kw"]
        # the golden inputs were drawn by torch 2.11's randn, which the machine-independent seed formula does not
        # reproduce: the cases carry the seed formula's kwargs, not a CaseSpec
        assert case.spec == {"formula": "seed", "kw": item["kw"]}
        assert case.inputs_digest == bundles.inputs_digest(item["inputs"])


def test_round_trip_keeps_policy_free_spec_skips_and_special_values(tmp_path):
    spec = cases.CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True)
    inputs = stage1_cases.make_inputs(spec)
    policy = reference._presets.get("seed_bf16")
    out = reference.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs), policy=policy)
    # special bit patterns must survive: NaN payload, -0, inf, subnormal
    special = torch.tensor([float("nan"), -0.0, float("inf"), 1e-40], dtype=torch.float32)
    dmimo_o = out.dmimo_o.clone()
    dmimo_o.view(-1)[:4] = special
    out = out._replace(dmimo_o=dmimo_o)
    fp64 = reference._presets.get("fp64")
    out64 = reference.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs), policy=fp64)
    items = [
        BundleCase(name="with_policy", inputs=inputs, outputs=out, spec=spec, policy=policy, backend="reference",
                   meta={"note": "x", "nested": {"a": [1, 2]}}),
        BundleCase(name="fp64_outputs", inputs=inputs, outputs=out64, spec=spec, policy=fp64, backend="reference"),
        BundleCase(name="free_spec_skipped", inputs=inputs, spec={"origin": "hand-made", "n": 3},
                   backend="upstream", skipped="upstream limitation: test"),
    ]
    path = save_bundle(tmp_path / "b", items)
    loaded = load_bundle(path)
    a, b, c = loaded.cases
    assert a.policy == policy and a.spec == spec and a.meta == {"note": "x", "nested": {"a": [1, 2]}}
    for name in OUTPUT_NAMES:
        assert bit_identical(getattr(a.outputs, name), getattr(out, name))
        assert bit_identical(getattr(b.outputs, name), getattr(out64, name))
    assert b.outputs.states.dtype == torch.float64
    assert c.outputs is None and c.skipped == "upstream limitation: test" and c.spec == {"origin": "hand-made", "n": 3}
    assert loaded["with_policy"] is a and len(loaded) == 3 and a.created
    assert sorted(os.listdir(path)) == sorted(["manifest.json", "with_policy.inputs.safetensors",
                                               "with_policy.outputs.safetensors", "fp64_outputs.inputs.safetensors",
                                               "fp64_outputs.outputs.safetensors",
                                               "free_spec_skipped.inputs.safetensors"])


def test_files_load_with_the_safetensors_library(pair_bundle):
    bundle = load_bundle(pair_bundle)
    for name in PAIR:
        case = bundle.case(name)
        outputs = st.load_file(str(pair_bundle / f"{name}.outputs.safetensors"))
        inputs = st.load_file(str(pair_bundle / f"{name}.inputs.safetensors"))
        assert sorted(outputs) == sorted(n for n in OUTPUT_NAMES if getattr(case.outputs, n) is not None)
        assert sorted(inputs) == sorted(n for n in INPUT_NAMES if case.inputs[n] is not None)
        assert all(bit_identical(t, getattr(case.outputs, n)) for n, t in outputs.items())
        assert all(bit_identical(t, case.inputs[n]) for n, t in inputs.items())
        with safe_open(str(pair_bundle / f"{name}.outputs.safetensors"), framework="pt") as f:
            assert json.loads(f.metadata()[bundles.FILE_METADATA_KEY]) == {"case": name, "kind": "outputs"}
            assert len(f.metadata()) == 1  # one key: several are written in hash-map order, not reproducibly


def test_encode_decode_handles_empty_and_odd_sized_tensors():
    tensors = {"a": torch.arange(3, dtype=torch.float16), "b": torch.empty(0, 4), "c": torch.tensor(7, dtype=torch.int64),
               "d": torch.tensor([True, False]), "e": torch.arange(6.0).reshape(2, 3).t(),  # not contiguous
               "f": torch.arange(5, dtype=torch.bfloat16)[1:3]}  # a view into a larger storage
    data = encode_safetensors(tensors, {"k": "v"})
    (header_len,) = struct.unpack("<Q", data[:8])
    assert header_len % 8 == 0
    back, meta = decode_safetensors(data)
    assert meta == {"k": "v"} and sorted(back) == sorted(tensors)
    assert all(bit_identical(back[k], tensors[k]) for k in tensors)
    # the library orders the file itself: the bytes do not depend on the order of the dict
    assert encode_safetensors(dict(reversed(list(tensors.items()))), {"k": "v"}) == data


def test_the_same_tensor_under_two_names_is_stored_twice():
    x = torch.arange(4.0)
    back, _ = decode_safetensors(encode_safetensors({"a": x, "b": x}))
    assert bit_identical(back["a"], x) and bit_identical(back["b"], x)


def test_decoded_tensors_do_not_follow_the_file(pair_copy):
    # files are read whole, not memory-mapped: rewriting a file in place leaves what was loaded unchanged
    case = load_bundle(pair_copy).case(PAIR[0])
    q = case.inputs["q"].clone()
    target = pair_copy / f"{PAIR[0]}.inputs.safetensors"
    target.write_bytes(bytes(b ^ 0xFF for b in target.read_bytes()))
    assert bit_identical(case.inputs["q"], q)


# ---------------------------------------------------------------------------------------------------------- corruption
def test_truncated_file_is_refused(pair_copy):
    target = pair_copy / f"{PAIR[1]}.outputs.safetensors"
    target.write_bytes(target.read_bytes()[:-10])
    with pytest.raises(BundleError, match=rf"{target.name}: size .* truncated"):
        load_bundle(pair_copy)
    with pytest.raises(BundleError, match=rf"{target.name}: truncated or corrupt tensor file"):
        load_bundle(pair_copy, verify=False)


def test_truncated_to_nothing_is_refused(pair_copy):
    target = pair_copy / f"{PAIR[0]}.inputs.safetensors"
    target.write_bytes(b"\x01\x02")
    with pytest.raises(BundleError, match=rf"{target.name}: truncated or corrupt tensor file \(2 bytes\)"):
        load_bundle(pair_copy, verify=False)


def test_flipped_byte_is_refused(pair_copy):
    target = pair_copy / f"{PAIR[0]}.inputs.safetensors"
    data = bytearray(target.read_bytes())
    data[-100] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"{target.name}: sha256 mismatch"):
        load_bundle(pair_copy)


def test_missing_file_is_refused(pair_copy):
    target = pair_copy / f"{PAIR[1]}.inputs.safetensors"
    target.unlink()
    with pytest.raises(BundleError, match=rf"{target.name}: missing"):
        load_bundle(pair_copy)


def test_extra_file_is_refused(pair_copy):
    (pair_copy / "notes.txt").write_text("hello")
    with pytest.raises(BundleError, match=r"notes.txt: extra file"):
        load_bundle(pair_copy)


def test_extra_directory_is_refused(pair_copy):
    (pair_copy / "sub").mkdir()
    with pytest.raises(BundleError, match=r"sub: extra entry"):
        load_bundle(pair_copy)


def test_missing_manifest_is_refused(pair_copy):
    (pair_copy / "manifest.json").unlink()
    with pytest.raises(BundleError, match=r"manifest.json: missing"):
        load_bundle(pair_copy)


def test_manifest_from_the_future_is_refused(pair_copy):
    manifest = _manifest(pair_copy)
    manifest["schema_version"] = bundles.SCHEMA_VERSION + 1
    _write_manifest(pair_copy, manifest)
    with pytest.raises(BundleError, match=rf"manifest.json: schema_version {bundles.SCHEMA_VERSION + 1} is newer .* "
                                          "upgrade mimo_numerics"):
        load_bundle(pair_copy)


@pytest.mark.parametrize("version", [0, "1", None, True])
def test_unknown_schema_version_is_refused(pair_copy, version):
    manifest = _manifest(pair_copy)
    manifest["schema_version"] = version
    _write_manifest(pair_copy, manifest)
    with pytest.raises(BundleError, match=r"manifest.json: unknown schema_version"):
        load_bundle(pair_copy)


def test_not_a_manifest_is_refused(pair_copy):
    (pair_copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"manifest.json: not valid JSON"):
        load_bundle(pair_copy)
    _write_manifest(pair_copy, {"schema": "something.else", "schema_version": 1, "cases": []})
    with pytest.raises(BundleError, match=r"manifest.json: not a bundle manifest"):
        load_bundle(pair_copy)


def test_manifest_digest_refuses_any_edit_and_ignores_formatting(pair_copy):
    manifest = _manifest(pair_copy)
    assert manifest["manifest_sha256"] == bundles.manifest_digest(manifest)
    # reformatting (indentation, key order) keeps the same JSON: still verifies
    (pair_copy / "manifest.json").write_text(json.dumps(dict(reversed(list(manifest.items()))), indent=4))
    load_bundle(pair_copy)
    # any change of content without a fresh digest is refused, naming the manifest
    manifest["cases"][0]["device_name"] = "NVIDIA H100"
    _write_manifest(pair_copy, manifest, reseal=False)
    with pytest.raises(BundleError, match=r"manifest.json: manifest_sha256 mismatch: .* corrupt or was edited"):
        load_bundle(pair_copy)
    assert load_bundle(pair_copy, verify=False).cases[0].device_name == "NVIDIA H100"  # verify=False: no digests
    del manifest["manifest_sha256"]
    _write_manifest(pair_copy, manifest, reseal=False)
    with pytest.raises(BundleError, match=rf"manifest.json: no manifest_sha256 in a schema_version "
                                          rf"{bundles.SCHEMA_VERSION} manifest"):
        load_bundle(pair_copy)
    with pytest.raises(BundleError, match=r"top level has missing key\(s\) \['manifest_sha256'\]"):
        load_bundle(pair_copy, verify=False)


def test_duplicate_json_keys_are_refused(pair_copy):
    text = (pair_copy / "manifest.json").read_text()
    (pair_copy / "manifest.json").write_text(text.replace('"meta":', '"meta": {}, "meta":', 1))
    with pytest.raises(BundleError, match=r"manifest.json: not valid JSON \(duplicate key 'meta'\)"):
        load_bundle(pair_copy, verify=False)


def test_outputs_digest_is_stored_and_checked(pair_copy):
    manifest = _manifest(pair_copy)
    case = load_bundle(pair_copy).case(PAIR[1])
    assert manifest["cases"][1]["outputs_digest"] == case.outputs_digest == bundles.outputs_digest(case.outputs)
    manifest["cases"][1]["outputs_digest"] = bundles.inputs_digest(case.inputs)
    _write_manifest(pair_copy, manifest)
    with pytest.raises(BundleError, match=rf"{PAIR[1]}.outputs.safetensors: outputs digest of case '{PAIR[1]}'"):
        load_bundle(pair_copy)


def test_version_1_bundles_are_refused_by_verify_and_upgraded(pair_copy, tmp_path, capsys):
    original = load_bundle(pair_copy)
    _as_version_1(pair_copy)
    with pytest.raises(bundles.OldSchemaError, match=r"manifest.json: schema_version 1: .*`mimo-numerics upgrade "):
        load_bundle(pair_copy)
    assert load_bundle(pair_copy, verify=False).schema_version == 1
    assert cli.main(["verify", str(pair_copy)]) == 2
    assert f"hint: run: mimo-numerics upgrade {pair_copy} --out NEW_DIR" in capsys.readouterr().err
    assert cli.main(["upgrade", str(pair_copy), "--out", str(tmp_path / "new")]) == 0
    upgraded = load_bundle(tmp_path / "new")
    assert upgraded.schema_version == bundles.SCHEMA_VERSION
    assert upgraded.meta["upgraded_from"] == {"schema_version": 1, "created": original.created}
    for a, b in zip(original, upgraded):
        assert (a.name, a.spec, a.policy, a.backend, a.device_name, a.versions, a.created, a.meta) == (
            b.name, b.spec, b.policy, b.backend, b.device_name, b.versions, b.created, b.meta)
        assert all(bit_identical(a.inputs[n], b.inputs[n]) for n in INPUT_NAMES)
        assert all(bit_identical(getattr(a.outputs, n), getattr(b.outputs, n)) for n in OUTPUT_NAMES)
    for name in os.listdir(pair_copy):  # the tensor files are rewritten byte for byte
        if name != "manifest.json":
            assert (pair_copy / name).read_bytes() == (tmp_path / "new" / name).read_bytes(), name
    # in place, and the upgrade verifies what version 1 can: a flipped tensor byte stops it
    bundles.upgrade_bundle(pair_copy, pair_copy, overwrite=True)
    assert load_bundle(pair_copy).schema_version == bundles.SCHEMA_VERSION
    _as_version_1(pair_copy)
    target = pair_copy / f"{PAIR[0]}.inputs.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"{target.name}: sha256 mismatch"):
        bundles.upgrade_bundle(pair_copy, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_files_swapped_between_cases_are_refused(pair_copy):
    a = pair_copy / f"{PAIR[0]}.inputs.safetensors"
    b = pair_copy / f"{PAIR[1]}.inputs.safetensors"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(BundleError, match=rf"{a.name}: size|{a.name}: sha256 mismatch"):
        load_bundle(pair_copy)
    # without hashes, the shapes give it away
    with pytest.raises(BundleError, match=rf"{a.name}: tensor '.*' of case '{PAIR[0]}' is .* in the file but"):
        load_bundle(pair_copy, verify=False)


def test_swapped_tensors_with_updated_hash_are_refused(pair_copy):
    name = f"{PAIR[0]}.inputs.safetensors"

    def swap(t):
        t["dt"], t["angles"] = t["angles"], t["dt"]
        return t

    _rewrite_consistently(pair_copy, name, swap, edit_table=False)
    with pytest.raises(BundleError, match=rf"{name}: tensor 'angles' of case '{PAIR[0]}' is float32 .* in the file "
                                          r"but float32 .* in manifest.json"):
        load_bundle(pair_copy)


def test_swapped_tensors_with_updated_manifest_are_refused(pair_copy):
    name = f"{PAIR[0]}.inputs.safetensors"

    def swap(t):
        t["dt"], t["angles"] = t["angles"], t["dt"]
        return t

    _rewrite_consistently(pair_copy, name, swap)
    with pytest.raises(BundleError, match=rf"{name}: inputs of case '{PAIR[0]}' are inconsistent: angles must have "
                                          "shape"):
        load_bundle(pair_copy)


def test_same_shape_swap_is_caught_by_the_inputs_digest(pair_copy):
    name = f"{PAIR[0]}.inputs.safetensors"

    def swap(t):
        t["q"], t["k"] = t["k"], t["q"]
        return t

    _rewrite_consistently(pair_copy, name, swap)
    with pytest.raises(BundleError, match=rf"{name}: inputs digest of case '{PAIR[0]}' does not match"):
        load_bundle(pair_copy)


def test_output_dtype_disagreeing_with_the_case_is_refused(pair_copy):
    name = f"{PAIR[1]}.outputs.safetensors"

    def widen(t):
        t["qk_dot"] = t["qk_dot"].float()
        return t

    _rewrite_consistently(pair_copy, name, widen)
    with pytest.raises(BundleError, match=rf"{name}: output qk_dot of case '{PAIR[1]}' has dtype torch.float32, but "
                                          "the case implies torch.bfloat16"):
        load_bundle(pair_copy)


def test_output_shape_disagreeing_with_the_case_is_refused(pair_copy):
    name = f"{PAIR[1]}.outputs.safetensors"

    def cut(t):
        t["states"] = t["states"][:, :, :1].contiguous()
        return t

    _rewrite_consistently(pair_copy, name, cut)
    with pytest.raises(BundleError, match=rf"{name}: output states of case '{PAIR[1]}' has shape .* but the case "
                                          "implies"):
        load_bundle(pair_copy)


def test_inputs_disagreeing_with_the_spec_are_refused(pair_copy):
    manifest = _manifest(pair_copy)
    manifest["cases"][1]["spec"]["seqlen"] = 21
    _write_manifest(pair_copy, manifest)
    with pytest.raises(BundleError, match=r"the input tensors disagree with the case spec: S=20 \(spec says 21\)"):
        load_bundle(pair_copy)


def test_a_missing_tensor_is_refused(pair_copy):
    name = f"{PAIR[1]}.outputs.safetensors"

    def drop(t):
        del t["dz"]
        return t

    _rewrite_consistently(pair_copy, name, drop, edit_table=False)
    with pytest.raises(BundleError, match=rf"{name}: tensor 'dz' of case '{PAIR[1]}' is missing from the file"):
        load_bundle(pair_copy)


# ---------------------------------------------------------------------------------------------------------- writing
def test_interrupted_write_leaves_nothing(tmp_path, golden_cases, monkeypatch):
    calls = {"n": 0}
    real = bundles.encode_safetensors

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real(*args, **kwargs)

    monkeypatch.setattr(bundles, "encode_safetensors", failing)
    target = tmp_path / "b"
    with pytest.raises(KeyboardInterrupt):
        save_bundle(target, golden_cases[:3])
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_interrupted_rename_keeps_the_old_bundle(tmp_path, golden_cases, monkeypatch):
    target = save_bundle(tmp_path / "b", golden_cases[:1])
    real_rename = os.rename
    failed = []

    def failing_rename(src, dst):
        if Path(dst) == target and not failed:  # the new bundle's rename into place fails once
            failed.append(src)
            raise OSError("simulated crash during rename")
        return real_rename(src, dst)

    monkeypatch.setattr(bundles.os, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        save_bundle(target, golden_cases[1:3], overwrite=True)
    monkeypatch.undo()
    assert load_bundle(target).names() == (golden_cases[0].name,)
    assert sorted(os.listdir(tmp_path)) == ["b"]


def test_overwrite(tmp_path, golden_cases):
    target = save_bundle(tmp_path / "b", golden_cases[:1])
    with pytest.raises(FileExistsError, match="already exists"):
        save_bundle(target, golden_cases[1:2])
    save_bundle(target, golden_cases[1:3], overwrite=True)
    assert load_bundle(target).names() == tuple(c.name for c in golden_cases[1:3])
    assert sorted(os.listdir(tmp_path)) == ["b"]


def test_save_refuses_inconsistent_cases(tmp_path, golden_cases):
    case = golden_cases[0]
    with pytest.raises(ValueError, match="duplicate case name"):
        save_bundle(tmp_path / "x", [case, case])
    with pytest.raises(ValueError, match="not usable as a file name"):
        save_bundle(tmp_path / "x", [case.replace(name="../evil")])
    bad = case.outputs._replace(states=case.outputs.states[:, :, :1])
    with pytest.raises(BundleError, match="output states .* has shape"):
        save_bundle(tmp_path / "x", [case.replace(outputs=bad)])
    inputs = dict(case.inputs, k=case.inputs["k"].float())
    with pytest.raises(BundleError, match="inputs of case .* are inconsistent: k must have dtype"):
        save_bundle(tmp_path / "x", [case.replace(inputs=inputs)])
    assert not (tmp_path / "x").exists()


def _raw_file(header, body=bytes(8)):
    """A hand-made safetensors file: ``header`` (a dict, or raw bytes) padded to 8 bytes, then ``body``."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# every malformed file the hand-written codec refused, now refused by the safetensors parser
GARBAGE = {
    "shorter_than_the_header_length": b"\x01\x02",
    "header_length_past_the_end": struct.pack("<Q", 1000) + b"{}",
    "header_not_json": _raw_file(b"{x"),
    "header_not_utf8": _raw_file(b'{"\xff": 1}'),
    "header_not_an_object": _raw_file(b"[1, 2]"),
    "entry_without_offsets": _raw_file({"a": {"dtype": "F32", "shape": [2]}}),
    "unknown_dtype_code": _raw_file({"a": _entry(dtype="Q7")}),
    "shape_not_integers": _raw_file({"a": _entry(shape=("2",))}),
    "negative_shape": _raw_file({"a": _entry(shape=(-2,))}),
    "shape_disagrees_with_the_byte_range": _raw_file({"a": _entry(shape=(3,))}),
    "gap_before_the_data": _raw_file({"a": _entry(shape=(1,), offsets=(4, 8))}),
    "overlapping_ranges": _raw_file({"a": _entry(), "b": _entry(shape=(1,), offsets=(4, 8))}),
    "data_shorter_than_the_header_says": _raw_file({"a": _entry(shape=(4,), offsets=(0, 16))}),
    "trailing_bytes": encode_safetensors({"a": torch.zeros(2)}) + b"junk",
    "metadata_not_text": _raw_file({"__metadata__": {"k": 1}, "a": _entry()}),
    "dtype_bundles_do_not_store": _raw_file({"a": _entry(dtype="C64", shape=(1,))}),
    "unsigned_16_bit": _raw_file({"a": _entry(dtype="U16", shape=(4,))}),
    "float8": _raw_file({"a": _entry(dtype="F8_E8M0", shape=(8,))}),
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_decode_rejects_garbage(name):
    with pytest.raises(BundleError, match=r"^f: (truncated or )?corrupt tensor file") as info:
        decode_safetensors(GARBAGE[name], "f")
    if name == "shorter_than_the_header_length":
        assert "(2 bytes)" in str(info.value)


def test_encode_refuses_dtypes_bundles_do_not_store():
    with pytest.raises(TypeError, match="tensor 'a' has dtype torch.complex64, which bundles cannot store"):
        encode_safetensors({"a": torch.zeros(2, dtype=torch.complex64)})


# ---------------------------------------------------------------------------------------------------------- operators
FWD, STAGE2 = "mamba_mimo_fwd", "mamba_mimo_bwd_bwd"
SMALL_SPECS = (cases.CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True),
               cases.CaseSpec(seqlen=10, state_dim=16, value_dim=8, rank=1, chunk_size=4, reduce_o=False,
                              dtype="float16"))


def _reference_cases(op_name, specs=SMALL_SPECS):
    from mimo_numerics import operator

    op = operator.get(op_name)
    items = []
    for spec in specs:
        x = op.draw(spec)
        policy = reference._presets.get("upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
        items.append(BundleCase(name=spec.case_id, inputs=x, outputs=op.run_reference(x, policy), spec=spec,
                                policy=policy, backend="reference", operator=op_name))
    return items


@pytest.mark.parametrize("op_name", [FWD, STAGE2])
def test_bundles_of_the_forward_and_stage2_round_trip(tmp_path, op_name):
    from mimo_numerics import operator
    from mimo_numerics.ops.mamba3_mimo.cases import small_case

    op = operator.get(op_name)
    specs = SMALL_SPECS + ((small_case(seqlen=12, rank=2, chunk_size=4, seed=3),) if op_name == FWD else ())
    items = _reference_cases(op_name, specs)
    path = save_bundle(tmp_path / "b", items)
    manifest = _manifest(path)
    assert manifest["schema_version"] == bundles.SCHEMA_VERSION and manifest["operator"] == op_name
    loaded = load_bundle(path)
    assert loaded.operator == op_name and loaded.op is op
    for item, case in zip(items, loaded):
        assert case.operator == op_name and case.spec == item.spec and case.policy == item.policy
        assert type(case.outputs) is bundles.outputs_type(op) and case.outputs._fields == op.output_names
        for name in op.input_names:
            assert bit_identical(case.inputs[name], item.inputs[name]), (case.name, name)
        for name in op.output_names:
            assert bit_identical(getattr(case.outputs, name), getattr(item.outputs, name)), (case.name, name)
        assert case.inputs_digest == item.inputs_digest and case.outputs_digest == item.outputs_digest
        stored = st.load_file(str(path / f"{case.name}.inputs.safetensors"))
        assert sorted(stored) == sorted(n for n in op.input_names if item.inputs[n] is not None)
    entry = manifest["cases"][-1]
    if op_name == FWD:  # a whole-op spec is stored by its class
        assert entry["spec_type"] == "mimo_numerics.ops.mamba3_mimo.cases:OpCaseSpec"
    assert sorted(entry["tensors"]["outputs"]) == sorted(op.output_names)


def test_a_bundle_holds_the_cases_of_one_operator(tmp_path):
    stage1 = _reference_cases(bundles.LEGACY_OPERATOR, SMALL_SPECS[:1])
    fwd = _reference_cases(FWD, SMALL_SPECS[1:])
    with pytest.raises(ValueError, match=r"one operator; these cases are of \['mamba_mimo_bwd_fwd', 'mamba_mimo_fwd'\]"):
        save_bundle(tmp_path / "x", stage1 + fwd)
    with pytest.raises(ValueError, match="the cases are of operator mamba_mimo_fwd, not mamba_mimo_bwd_bwd"):
        save_bundle(tmp_path / "x", fwd, op=STAGE2)
    assert not (tmp_path / "x").exists()
    assert load_bundle(save_bundle(tmp_path / "empty", [], op=STAGE2)).operator == STAGE2


def test_inputs_of_another_operator_are_refused(tmp_path):
    x = stage1_cases.make_inputs(SMALL_SPECS[0])  # stage 1's inputs: the forward's plus dout
    with pytest.raises(BundleError, match=r"have \['dout'\], which are not inputs of mamba_mimo_fwd"):
        save_bundle(tmp_path / "x", [BundleCase(name="c", inputs=x, operator=FWD)])
    fwd_inputs = {k: v for k, v in x.items() if k != "dout"}
    with pytest.raises(BundleError, match=r"lack \['dout', 'states', 'qk_dot'\] \(inputs of mamba_mimo_bwd_bwd\)"):
        save_bundle(tmp_path / "x", [BundleCase(name="c", inputs=fwd_inputs, operator=STAGE2)])
    ok = BundleCase(name="c", inputs=fwd_inputs, operator=FWD)
    assert load_bundle(save_bundle(tmp_path / "ok", [ok])).case("c").operator == FWD


def test_output_layouts_follow_the_operator_and_its_branches(tmp_path):
    fwd_full, = _reference_cases(FWD, SMALL_SPECS[1:])  # no mimo_o: o is [B, S, R, H, P]
    o = fwd_full.outputs.o
    assert o.dim() == 5
    with pytest.raises(BundleError, match=r"output o of case .* has shape \[1, 10, 1, 1, 8\], but the case implies "
                                          r"\[1, 10, 1, 8\]"):
        reduced = stage1_cases.make_inputs(SMALL_SPECS[1].replace(reduce_o=True, dtype="bfloat16"))
        reduced.pop("dout")
        save_bundle(tmp_path / "x", [fwd_full.replace(inputs=reduced, spec=None, policy=None)])
    stage2, = _reference_cases(STAGE2, SMALL_SPECS[1:])  # no d: no dD
    assert stage2.outputs.dD is None
    extra = stage2.outputs._replace(dD=torch.zeros(1, 1))
    with pytest.raises(BundleError, match="output dD of case .* is present, but its branch is off"):
        save_bundle(tmp_path / "x", [stage2.replace(outputs=extra)])
    wrong = stage2.outputs._replace(dSSdA=stage2.outputs.dSSdA[..., :2])
    with pytest.raises(BundleError, match=r"output dSSdA of case .* has shape .* but the case implies \[1, 1, 3, 4, 4\]"):
        save_bundle(tmp_path / "x", [stage2.replace(outputs=wrong)])
    with pytest.raises(BundleError, match="must be a MimoBwdBwdOutputs .*, got MimoFwdOutputs"):
        save_bundle(tmp_path / "x", [stage2.replace(outputs=fwd_full.outputs)])


@pytest.mark.parametrize("op_name", [FWD, STAGE2])
def test_golden_cases_of_the_forward_and_stage2_convert_losslessly(tmp_path, op_name):
    from mimo_numerics import operator

    op = operator.get(op_name)
    golden_module = bundles.operator_module(op, "golden")
    stored = op.load("golden")()
    converted = cases_from_golden(op=op_name)
    path = save_bundle(tmp_path / "b", converted)
    loaded = load_bundle(path)
    assert loaded.operator == op_name and loaded.names() == tuple(s.case_id for s in stored)
    for spec, case in zip(stored, loaded):
        upstream = golden_module.upstream_outputs(spec.case_id)
        for name in op.output_names:
            assert bit_identical(getattr(case.outputs, name), upstream.get(name)), (case.name, name)
        for name in op.input_names:
            assert bit_identical(case.inputs[name], spec.inputs[name]), (case.name, name)
        assert case.backend == "upstream" and case.policy is None and case.versions["tilelang"] == "0.1.8"
        assert case.spec[bundles.STORED_CASE_KEY] == spec.case_id and case.spec["seqlen"] == spec.seqlen
    # the stored sizes are checked against the tensors like a CaseSpec's
    manifest = _manifest(path)
    manifest["cases"][0]["spec"]["heads"] += 1
    _write_manifest(path, manifest)
    with pytest.raises(BundleError, match=r"the input tensors disagree with the case spec: H=2 \(spec says 3\)"):
        load_bundle(path)


def test_stage1_golden_default_is_the_seed_file():
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden

    by_default = cases_from_golden()
    by_path = cases_from_golden(GOLDEN)
    assert [c.name for c in by_default] == [c.name for c in by_path] == list(golden.golden_names())
    assert all(a.spec == b.spec and a.meta == b.meta and a.outputs_digest == b.outputs_digest
               for a, b in zip(by_default, by_path))


def test_outputs_of_takes_what_the_operators_return():
    from mimo_numerics import operator

    fwd, stage2 = operator.get(FWD), operator.get(STAGE2)
    x = stage2.draw(SMALL_SPECS[0])
    oracle = stage2.load("oracle")(*stage2.args(x), **stage2.kwargs(x))  # stage 2's oracle function returns a dict
    out = bundles.outputs_of(oracle, STAGE2)
    assert type(out) is bundles.outputs_type(STAGE2) and out.dD is oracle["dD"]
    assert type(stage2.run_oracle(x)) is bundles.outputs_type(STAGE2)  # Operator.run_oracle normalises it
    assert bundles.outputs_of(out, STAGE2) is out and bundles.outputs_of(tuple(out), STAGE2) == out
    xf = fwd.draw(SMALL_SPECS[0])
    o = fwd.load("oracle")(*fwd.args(xf), **fwd.kwargs(xf))  # the forward's returns its one tensor
    assert bundles.outputs_of(o, FWD).o is o
    with pytest.raises(ValueError, match=r"must have exactly the keys \['o'\], got \['dq'\]"):
        bundles.outputs_of({"dq": o}, FWD)
    with pytest.raises(TypeError, match="must be its outputs NamedTuple"):
        bundles.outputs_of((o,), STAGE2)
