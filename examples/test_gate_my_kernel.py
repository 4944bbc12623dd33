"""Gate a kernel against a rounding policy in CI, with the mimo_numerics pytest plugin.

Here the kernel is this project's own Triton ``mamba_mimo_bwd_fwd``; on the CPU it runs in Triton's interpreter,
so the tests use the small ``smoke`` grid (a few seconds). Replace ``kernels.mamba_mimo_bwd_fwd`` by your kernel:

    pytest examples/test_gate_my_kernel.py                                  # upstream_sm90, smoke grid, CPU
    pytest examples/test_gate_my_kernel.py --mimo-device cuda --mimo-grid gate
    pytest examples/test_gate_my_kernel.py --mimo-policy my_policy.json

Each test is parametrized over the grid (test id = case id). A failing gate raises AssertionError with a
per-output table (docs/gating.md explains its columns).
"""

import functools

import pytest

kernels = pytest.importorskip(
    "mimo_numerics.kernels", reason="mimo_numerics.kernels (the project's Triton kernels) is not importable")
if not kernels.triton_available():
    pytest.skip("the Triton kernels need Triton: pip install 'mimo_numerics[triton]'", allow_module_level=True)


@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_gate_my_kernel(mimo_gate, mimo_policy):
    # The recipe: a callable with the reference's signature that runs *your* kernel configured as the policy says.
    # Cases whose dtype is not the policy's lp_dtype are skipped (here: the float16 smoke case).
    mimo_gate(functools.partial(kernels.mamba_mimo_bwd_fwd, policy=mimo_policy))


@pytest.mark.mimo_policy("upstream_sm90")
@pytest.mark.mimo_grid("smoke")
def test_gate_my_kernel_every_dtype(mimo_gate):
    # A kernel that takes the policy itself: the gate passes it (pass_policy) and runs float16 cases under the
    # policy with lp_dtype=float16 (dtype_mismatch="adapt"), here upstream_sm90_fp16.
    mimo_gate(kernels.mamba_mimo_bwd_fwd, pass_policy=True, dtype_mismatch="adapt")
