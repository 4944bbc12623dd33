"""Every upstream bundle records its TileLang version (tilelang is not installed here: the lookups are mocked)."""

import json
import types

import pytest

from mimo_numerics import bundles, envinfo
from mimo_numerics.bundles import BundleCase, load_bundle, save_bundle
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs

SPEC = CaseSpec(seqlen=4, state_dim=8, value_dim=4, rank=1, chunk_size=2)


def _fake_metadata(installed):
    """A stand-in for ``envinfo.distribution_version`` that knows only the distributions in ``installed``."""
    def lookup(*names):
        return next((installed[n] for n in names if n in installed), None)
    return lookup


@pytest.fixture
def no_tilelang(monkeypatch):
    monkeypatch.setattr(envinfo, "distribution_version", _fake_metadata({}))
    monkeypatch.delitem(envinfo.sys.modules, "tilelang", raising=False)


def test_versions_record_tilelang_from_its_metadata(monkeypatch):
    monkeypatch.setattr(envinfo, "distribution_version", _fake_metadata({"tilelang": "0.1.8"}))
    assert envinfo.tilelang_version() == "0.1.8"
    assert envinfo.versions()["tilelang"] == "0.1.8"


def test_versions_record_an_imported_tilelang_without_metadata(monkeypatch, no_tilelang):
    monkeypatch.setitem(envinfo.sys.modules, "tilelang", types.SimpleNamespace(__version__="0.1.15"))
    assert envinfo.tilelang_version() == "0.1.15"
    assert envinfo.versions()["tilelang"] == "0.1.15"


def test_versions_leave_out_a_tilelang_that_is_not_there(no_tilelang):
    assert envinfo.tilelang_version() is None
    assert "tilelang" not in envinfo.versions()


def _manifest_versions(path):
    return {e["name"]: e["versions"] for e in json.loads((path / "manifest.json").read_text())["cases"]}


def _cases():
    x = make_inputs(SPEC)
    return [BundleCase(name="up", inputs=x, backend="upstream", skipped="not run", versions={"torch": "2.13.0"}),
            BundleCase(name="ref", inputs=x, backend="reference", versions={"torch": "2.13.0"})]


def test_upstream_cases_get_the_tilelang_version_of_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(envinfo, "distribution_version", _fake_metadata({"tilelang": "0.1.8"}))
    path = save_bundle(tmp_path / "b", _cases())
    assert _manifest_versions(path) == {"up": {"torch": "2.13.0", "tilelang": "0.1.8"}, "ref": {"torch": "2.13.0"}}
    assert load_bundle(path)["up"].versions["tilelang"] == "0.1.8"
    # a case that says its version keeps it
    given = _cases()[0].replace(versions={"tilelang": "0.1.15"})
    assert _manifest_versions(save_bundle(tmp_path / "c", [given]))["up"] == {"tilelang": "0.1.15"}


def test_upstream_cases_say_unknown_when_no_tilelang_is_found(tmp_path, no_tilelang):
    path = save_bundle(tmp_path / "b", _cases())
    assert _manifest_versions(path)["up"]["tilelang"] == "unknown"


def test_cases_read_from_a_bundle_keep_their_versions(tmp_path, monkeypatch, no_tilelang):
    # an upgrade (or any rewrite) on another machine must not stamp that machine's TileLang on an old run
    old = _cases()[0].replace(created="2026-01-01T00:00:00Z")
    path = save_bundle(tmp_path / "b", [old])
    monkeypatch.setattr(envinfo, "distribution_version", _fake_metadata({"tilelang": "9.9.9"}))
    rewritten = save_bundle(tmp_path / "c", load_bundle(path).cases)
    assert _manifest_versions(rewritten)["up"] == {"torch": "2.13.0"}
    assert bundles.UPSTREAM_BACKEND == "upstream"
