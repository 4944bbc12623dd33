"""Sweeps: the tqdm progress bar (label, total, ``progress=False``), the pluggable executor, and sweeps of the
forward and stage 2 (operator names across worker processes, golden cases against the H200 outputs)."""

import io
import json
import pickle

import pytest
from tqdm import tqdm

from mimo_numerics import operator, sweep, tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.policy import PolicyUndefined


def _double(x):
    return 2 * x


def test_progress_bar_is_a_tqdm_with_label_and_total():
    stream = io.StringIO()
    with sweep.progress_bar(4, "cases", stream=stream) as bar:
        assert isinstance(bar, tqdm) and bar.total == 4 and bar.desc == "cases"
        bar.update(3)
        bar.update()
    text = stream.getvalue()
    assert "cases: " in text and "4/4" in text and "100%" in text


def test_disabled_progress_bar_writes_nothing():
    stream = io.StringIO()
    with sweep.progress_bar(4, "cases", enabled=False, stream=stream) as bar:
        bar.update(4)
    assert stream.getvalue() == ""


def test_parallel_map_shows_its_progress_on_stderr(capsys):
    assert sweep.parallel_map(_double, range(5), workers=1, desc="doubling") == [0, 2, 4, 6, 8]
    err = capsys.readouterr().err
    assert "doubling: " in err and "5/5" in err
    assert sweep.parallel_map(_double, range(5), workers=1, progress=False) == [0, 2, 4, 6, 8]
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------------------- executors
def test_the_executor_is_one_pluggable_function(monkeypatch):
    seen = {}

    def reversed_order(fn, items, *, workers, bar, desc, threads_per_worker):
        seen.update(workers=workers, desc=desc, threads=threads_per_worker)
        out = {i: fn(item) for i, item in reversed(list(enumerate(items)))}
        bar.update(len(items))
        return [out[i] for i in range(len(items))]

    monkeypatch.setitem(sweep.EXECUTORS, "reversed", reversed_order)
    assert sweep.parallel_map(_double, range(4), workers=3, progress=False, executor="reversed") == [0, 2, 4, 6]
    assert seen == {"workers": 3, "desc": "sweep", "threads": 1}
    with pytest.raises(ValueError, match=r"unknown executor 'dask'; executors: \['process', 'ray', 'reversed'\]"):
        sweep.parallel_map(_double, [1], executor="dask")


# ---------------------------------------------------------------------------------------------------------- operators
SMALL = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True)


@pytest.mark.parametrize("op_name, output, ratio", [
    ("mamba_mimo_fwd", "o", "fwd_golden_fp32_over_sm90_ratio_min"),
    ("mamba_mimo_bwd_bwd", "dq", "stage2_golden_fp32_over_sm90_ratio_min"),
])
def test_sweep_on_the_forward_and_stage2(op_name, output, ratio):
    op = operator.get(op_name)
    golden = op.load("golden")()[1].case_id  # the plain golden case (no Z, no D)
    result = sweep.run_sweep([SMALL, golden], ["upstream_sm90", "fp32"], workers=1, progress=False, op=op_name)
    assert result.operator == op_name and [(r["case"], r["policy"]) for r in result.records] == [
        (SMALL.case_id, "upstream_sm90"), (SMALL.case_id, "fp32"), (golden, "upstream_sm90"), (golden, "fp32")]
    assert all(r["operator"] == op_name for r in result.records)
    assert set(result.records[0]["vs_baseline"]) == {n for n in op.output_names
                                                     if op.stage(n).needs != ("has_d",) or SMALL.has_d}
    assert "vs_device" not in result.records[0]
    device = result.pivot(output, against="vs_device")[golden]
    # the fp32 preset is farther from the H200 than upstream_sm90, by the measured margin
    assert device["fp32"] / device["upstream_sm90"] >= tolerances.get(ratio)
    assert result.to_markdown().startswith(f"{op_name}: {output} rel_rms (vs_baseline)")
    json.dumps(result.to_dict())


def test_sweep_tasks_carry_the_operator_by_name(monkeypatch):
    """Tasks cross to the worker processes pickled, with the operator's name (the process pool itself is tested on
    stage 1 in tests/test_report.py): evaluated after a pickle round trip, they run the forward."""
    tasks = []

    def capture(fn, items, *, workers, bar, desc, threads_per_worker):
        tasks.extend(items)
        return [fn(pickle.loads(pickle.dumps(item))) for item in items]

    monkeypatch.setitem(sweep.EXECUTORS, "capture", capture)
    result = sweep.run_sweep([SMALL, SMALL.replace(seed=5)], ["upstream_sm90"], workers=2, progress=False,
                             op=operator.get("mamba_mimo_fwd"), baseline="oracle", executor="capture")
    assert [task.op for task in tasks] == ["mamba_mimo_fwd"] * 2 and all(isinstance(t.op, str) for t in tasks)
    assert [r["operator"] for r in result.records] == ["mamba_mimo_fwd"] * 2
    assert [list(r["vs_baseline"]) for r in result.records] == [["o"], ["o"]]
    assert [r["case"] for r in result.records] == [SMALL.case_id, SMALL.replace(seed=5).case_id]


def test_sweep_refuses_a_policy_the_operator_lacks_before_running():
    with pytest.raises(PolicyUndefined, match="'seed_bf16' defines no rounding for operator 'mamba_mimo_fwd'"):
        sweep.run_sweep([SMALL], ["upstream_sm90", "seed_bf16"], workers=1, progress=False, op="mamba_mimo_fwd")
    with pytest.raises(KeyError, match="unknown golden case 'nope' of mamba_mimo_bwd_bwd"):
        sweep.run_sweep(["nope"], ["fp32"], workers=1, progress=False, op="mamba_mimo_bwd_bwd")
