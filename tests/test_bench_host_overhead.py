"""``benchmarks/bench_host_overhead.py``: a CPU smoke run writes its table with the launches it skipped, and bad
arguments are refused before any worker starts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mimo_numerics import kernels

pytestmark = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_host_overhead.py"


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(PATH.parent))  # as when run as a script: benchmarks/ on sys.path
    spec = importlib.util.spec_from_file_location("bench_host_overhead", PATH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_host_overhead_smoke_run_writes_the_table(tmp_path, monkeypatch):
    bench = _bench(monkeypatch)
    assert bench.main(["--shapes", "smoke", "--warmup", "1", "--repeats", "2", "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "host_overhead_cpu.json").read_text())
    plain, bound = meta["results"]["smoke"]["current"], meta["results"]["smoke"]["current +bind"]
    assert "error" not in plain and "error" not in bound, (plain, bound)
    # every forward + backward launches kernels (all skipped) and spends host time in each step
    assert plain["launches"] > 10 and plain["launches"] == bound["launches"]
    assert len(plain["wall_ms"]) == 2 and all(t > 0 for t in plain["wall_ms"])
    assert all(all(t > 0 for t in plain["steps_ms"][s]) for s in bench.STEPS)
    assert plain["bind_ms"] is None and all(t > 0 for t in bound["bind_ms"])
    table = (tmp_path / "host_overhead_cpu.md").read_text()
    assert "| current |" in table and "| current +bind |" in table and "launches skipped" in table


def test_host_overhead_refuses_bad_arguments(tmp_path, monkeypatch):
    bench = _bench(monkeypatch)
    with pytest.raises(SystemExit, match="unknown shape"):
        bench.main(["--shapes", "smoke,huge", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--baseline: rev must name a commit"):
        bench.main(["--shapes", "smoke", "--baseline", "no-such-commit", "--out", str(tmp_path)])
