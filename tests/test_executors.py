"""Sweeps on Ray: a local Ray instance on the CPU gives the process pool's results bit for bit."""

import pytest

from mimo_numerics import executors
from mimo_numerics.cases import CaseSpec
from mimo_numerics.sweep import SweepTask, evaluate_task

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

CASES = (CaseSpec(seqlen=12, state_dim=16, value_dim=8, rank=2, chunk_size=4, has_z=True, has_d=True),
         CaseSpec(formula="realistic", seqlen=10, heads=2, state_dim=16, value_dim=8, rank=1, chunk_size=4,
                  reduce_o=False, has_z=True))
TASKS = [SweepTask(case, policy) for case in CASES for policy in ("fp32", "upstream_sm90")]


def _without_timing(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def test_ray_results_equal_the_process_pools_bit_for_bit():
    pool = executors.map_items(evaluate_task, TASKS, executor="process", workers=2, progress=False)
    on_ray = executors.map_items(evaluate_task, TASKS, executor="ray", workers=2, progress=False)
    assert _without_timing(on_ray) == _without_timing(pool)  # metrics are floats of the same bits: exact equality
    assert not ray.is_initialized()  # the local instance this call started is shut down


def test_executor_arguments_are_checked():
    with pytest.raises(ValueError, match="executor"):
        executors.map_items(evaluate_task, TASKS, executor="dask")
    with pytest.raises(ValueError, match="executor='ray' only"):
        executors.map_items(evaluate_task, TASKS, executor="process", address="auto")
