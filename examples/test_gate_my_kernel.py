"""Gate a kernel against a rounding policy in CI, with the mimo_numerics pytest plugin.

Here the stage-1 kernel is this project's own Triton ``mamba_mimo_bwd_fwd``; on the CPU it runs in Triton's
interpreter, so the tests use the small ``smoke`` grid (a few seconds). Replace ``kernels.mamba_mimo_bwd_fwd`` by
your kernel:

    pytest examples/test_gate_my_kernel.py                                  # upstream_sm90, smoke grid, CPU
    pytest examples/test_gate_my_kernel.py --mimo-device cuda --mimo-grid gate
    pytest examples/test_gate_my_kernel.py --mimo-policy my_policy.json

The forward (``mamba_mimo_fwd``) and stage 2 (``mamba_mimo_bwd_bwd``) have no kernels in this project yet; their
tests below gate a stand-in, the policy reference summing over the state dimension in another order
(``testing.permute_state_dim``: a correct implementation that rounds differently at the FP32 level). Built from
the reference, they are plumbing tests (``test_plumbing_*``): they show the wiring, not an implementation's accuracy
(tests/test_gate_independent.py gates implementations independent of the references). Replace the stand-in by your
forward or stage-2 kernel and keep ``op=``.

Each test is parametrized over the grid (test id = case id). A failing gate raises AssertionError with a
per-output table (docs/gating.md explains its columns).
"""

import functools

import pytest

from mimo_numerics import operator, testing

try:
    from mimo_numerics import kernels
except ImportError:  # the project's Triton kernels are not installed
    kernels = None
needs_triton = pytest.mark.skipif(kernels is None or not kernels.triton_available(),
                                  reason="the Triton kernels need Triton: pip install 'mimo_numerics[triton]'")


@needs_triton
@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_gate_my_kernel(mimo_gate, mimo_policy):
    # The recipe: a callable with the reference's signature that runs *your* kernel configured as the policy says.
    # Cases whose dtype is not the policy's lp_dtype are skipped (here: the float16 smoke case).
    mimo_gate(functools.partial(kernels.mamba_mimo_bwd_fwd, policy=mimo_policy))


@needs_triton
@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_gate_my_kernel_every_dtype(mimo_gate):
    # A kernel that takes the policy itself: the gate passes it (pass_policy) and runs float16 cases under the
    # policy with lp_dtype=float16 (dtype_mismatch="adapt"), here upstream_sm90_fp16.
    mimo_gate(kernels.mamba_mimo_bwd_fwd, pass_policy=True, dtype_mismatch="adapt")


def my_forward_kernel(*tensors, policy, **scalars):
    """Stand-in for your forward kernel (16 tensors, chunk_size=, rotary_dim_divisor=) -> o."""
    reference = functools.partial(operator.get("mamba_mimo_fwd").load("reference"), policy=policy)
    return testing.permute_state_dim(reference, seed=1, op="mamba_mimo_fwd")(*tensors, **scalars)


def my_stage2_kernel(*tensors, policy, **scalars):
    """Stand-in for your stage-2 kernel (19 tensors, chunk_size=, rotary_dim_divisor=) -> the 12 raw outputs."""
    reference = functools.partial(operator.get("mamba_mimo_bwd_bwd").load("reference"), policy=policy)
    return testing.permute_state_dim(reference, seed=1, op="mamba_mimo_bwd_bwd")(*tensors, **scalars)


@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_plumbing_forward_stand_in(mimo_gate, mimo_policy):
    """Plumbing: the gate wired to a forward kernel (here the reference stand-in)."""
    # op= names the operator fn implements; the stage-1 grid's cases serve the forward too
    mimo_gate(functools.partial(my_forward_kernel, policy=mimo_policy), op="mamba_mimo_fwd")


@pytest.mark.mimo_op("mamba_mimo_fwd")
@pytest.mark.mimo_grid("whole_op")
def test_plumbing_forward_stand_in_on_whole_op_cases(mimo_gate):
    """Plumbing: the forward's whole-op grid through the marker (the reference stand-in)."""
    # the marker parametrizes the test over the forward's own grids (whole_op: raw whole-op inputs through
    # upstream's FP32 preprocessing) and makes it mimo_gate's operator
    mimo_gate(my_forward_kernel, pass_policy=True, dtype_mismatch="adapt")


@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_plumbing_stage2_stand_in(mimo_gate, mimo_policy):
    """Plumbing: the gate wired to a stage-2 kernel (here the reference stand-in)."""
    mimo_gate(functools.partial(my_stage2_kernel, policy=mimo_policy), op="mamba_mimo_bwd_bwd")
