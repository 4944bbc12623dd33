"""The FP64 truth at realistic lengths (issue 22): the chain of every FP64 oracle against the independent FP64 model
at S = 2048, and its memory linear in S (the oracles once held ``[B, H, S, S]`` tensors and an ``[S, S, S]`` mask).

Timings and peaks at S = 2048 and 8192 are benchmark figures (``benchmarks/bench_fp64_chain.py``), not tests."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo.autograd import mamba3_mimo
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES, mamba3_mimo_fp64

ROOT = Path(__file__).resolve().parents[3]
LONG = OpCaseSpec(batch=1, seqlen=2048, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16)


def _leaves(inputs):
    return {n: None if inputs[n] is None else inputs[n].detach().to(torch.float64).requires_grad_(True)
            for n in INPUT_NAMES}


def test_fp64_chain_matches_the_fp64_model_at_a_realistic_length():
    inputs = make_op_inputs(LONG)
    dout = inputs["dout"].to(torch.float64)
    chain, model = _leaves(inputs), _leaves(inputs)
    out = mamba3_mimo(*chain.values(), LONG.chunk_size, LONG.rotary_dim_divisor, policy="fp64")
    out.backward(dout)
    want = mamba3_mimo_fp64(*model.values(), chunk_size=LONG.chunk_size, rotary_dim_divisor=LONG.rotary_dim_divisor)
    want.backward(dout)
    limit = tolerances.get("whole_op_fp64_long_vs_model_rel_rms")
    errors = {"Out": rel_rms(out, want)}
    errors.update({f"d{n}": rel_rms(leaf.grad, model[n].grad) for n, leaf in chain.items() if leaf is not None})
    assert len(errors) == 15
    assert all(e <= limit for e in errors.values()), {k: f"{v:.2e}" for k, v in errors.items() if not v <= limit}


def _peak_rss(seqlen: int) -> int:
    """Peak resident set (bytes) of a fresh process running the fp64 chain forward + backward at B=1, H=1."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fp64_chain.py"), "--worker", "chain",
                           "--seqlen", str(seqlen), "--heads", "1", "--device", "cpu", "--save", "/dev/null"],
                          capture_output=True, text=True, cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])["peak_bytes"]


def test_fp64_chain_memory_grows_linearly_in_the_sequence_length():
    # measured (2026-12-02, CPU): 352 MB at S = 64 (torch itself), +231 MB at S = 2048, +866 MB at S = 8192: a
    # growth ratio of 3.7 for 4x the length; a token-pair tensor would give 16, the old [S, S, S] mask cannot run
    base, short, long = _peak_rss(64), _peak_rss(2048), _peak_rss(8192)
    ratio = (long - base) / (short - base)
    assert ratio < 8, f"peak memory above torch's own grew {ratio:.1f}x from S = 2048 to S = 8192 (linear: ~4x)"
