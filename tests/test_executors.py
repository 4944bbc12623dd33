"""Sweeps on Ray: a local Ray instance on the CPU gives the process pool's results bit for bit."""

import pytest

from mimo_numerics import sweep
from mimo_numerics.cases import CaseSpec

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

CASES = (CaseSpec(seqlen=12, state_dim=16, value_dim=8, rank=2, chunk_size=4, has_z=True, has_d=True),
         CaseSpec(formula="realistic", seqlen=10, heads=2, state_dim=16, value_dim=8, rank=1, chunk_size=4,
                  reduce_o=False, has_z=True))


def _without_timing(result):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in result.records]


@pytest.mark.parametrize("op", ["mamba_mimo_bwd_fwd", "mamba_mimo_fwd"])
def test_ray_results_equal_the_process_pools_bit_for_bit(op):
    pool = sweep.run_sweep(CASES, ["fp32", "upstream_sm90"], workers=2, progress=False, op=op)
    on_ray = sweep.run_sweep(CASES, ["fp32", "upstream_sm90"], workers=2, progress=False, op=op, executor="ray")
    assert _without_timing(on_ray) == _without_timing(pool)  # metrics are floats of the same bits: exact equality
    assert len(pool.records) == 4
    assert not ray.is_initialized()  # the local instance this call started is shut down


def test_executor_arguments_are_checked():
    with pytest.raises(ValueError, match="executor"):
        sweep.parallel_map(abs, [1, 2], executor="dask")
    with pytest.raises(ValueError, match="executor='ray' only"):
        sweep.parallel_map(abs, [1, 2], executor="process", address="auto")
