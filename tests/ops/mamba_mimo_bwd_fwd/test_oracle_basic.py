"""Basic tests of the FP64 oracle: output layout, a scalar-loop recurrence check, linearity and causality."""

import math

import pytest
import torch

from mimo_numerics import cases
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.oracle import mamba_mimo_bwd_fwd_oracle
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

SMALL_CASES = stage1_cases.grid("smoke") + stage1_cases.grid("gate")
TINY = CaseSpec(seqlen=7, heads=2, groups=1, state_dim=8, value_dim=3, rank=2, chunk_size=3, has_z=True,
                has_d=True, seed=5)


def _run(inputs):
    return mamba_mimo_bwd_fwd_oracle(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))


@pytest.mark.parametrize("spec", SMALL_CASES, ids=cases.case_id)
def test_oracle_output_layout(spec):
    out = _run(stage1_cases.make_inputs(spec))
    B, S, H, N, P, R, nc = (spec.batch, spec.seqlen, spec.heads, spec.state_dim, spec.value_dim, spec.rank,
                            spec.nchunks)
    assert out.states.shape == (B, H, nc, N, P)
    assert out.qk_dot.shape == (B, H, S, R, R)
    assert (out.dmimo_o is None) == (not spec.reduce_o)
    assert (out.dz is None) == (not spec.has_z) and (out.dmimo_z is None) == (not spec.has_z)
    if spec.reduce_o:
        assert out.dmimo_o.shape == (B, H, R, P)
    if spec.has_z:
        assert out.dz.shape == (B, S, H, P) and out.dmimo_z.shape == (B, H, R, P)
    for name, value in out.as_dict().items():
        if value is not None:
            assert value.dtype == torch.float64 and value.device.type == "cpu", name
            assert torch.isfinite(value).all(), name
    assert (out.states[:, :, 0] == 0).all()


def test_oracle_validates_inputs():
    inputs = stage1_cases.make_inputs(TINY)
    inputs["mimo_z"] = None
    with pytest.raises(ValueError, match="mimo_z"):
        _run(inputs)


# ---- scalar-loop reference: per-token quantities, then the chunk recurrence of the state ----

def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _loop_reference(spec, inputs):
    """Plain Python loops over docs/semantics.md in float64 (state by the recurrence of §7)."""
    B, S, H, G, N, P, R, C = (spec.batch, spec.seqlen, spec.heads, spec.groups, spec.state_dim, spec.value_dim,
                              spec.rank, spec.chunk_size)
    nc, width, half = spec.nchunks, N // spec.rotary_dim_divisor, N // 2
    x = {name: (None if value is None else value.double().tolist()) for name, value in inputs.items()
         if name not in ("chunk_size", "rotary_dim_divisor")}
    states = [[[[[0.0] * P for _ in range(N)] for _ in range(nc)] for _ in range(H)] for _ in range(B)]
    dz = [[[[0.0] * P for _ in range(H)] for _ in range(S)] for _ in range(B)]
    dmimo_o = [[[[0.0] * P for _ in range(R)] for _ in range(H)] for _ in range(B)]
    dmimo_z = [[[[0.0] * P for _ in range(R)] for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            dt, trap = x["dt"][b][h], x["trap"][b][h]
            q_rot, k_hat, qk, psi_v, gamma = [], [], [], [], []
            for t in range(S):
                theta = x["angles"][b][t][h]
                rot_t, khat_t = [], []
                qb = [[x["q"][b][t][r][g][n] + x["q_bias"][h][r][n] for n in range(N)] for r in range(R)]
                kb = [[x["k"][b][t][r][g][n] + x["k_bias"][h][r][n] for n in range(N)] for r in range(R)]
                qk.append([[sum(qb[r1][n] * kb[r2][n] for n in range(N)) for r2 in range(R)] for r1 in range(R)])
                gam = dt[t] * _sigmoid(trap[t])
                shifted = dt[t + 1] * _sigmoid(-trap[t + 1]) if t + 1 < S else 0.0
                for r in range(R):
                    qr, kr = list(qb[r]), list(kb[r])
                    for j in range(width):
                        cs, sn = math.cos(theta[j]), math.sin(theta[j])
                        qr[j] = cs * qb[r][j] - sn * qb[r][half + j]
                        qr[half + j] = sn * qb[r][j] + cs * qb[r][half + j]
                        kr[j] = cs * kb[r][j] - sn * kb[r][half + j]
                        kr[half + j] = sn * kb[r][j] + cs * kb[r][half + j]
                    rot_t.append(qr)
                    khat_t.append([kv * (gam + shifted) for kv in kr])
                q_rot.append(rot_t)
                k_hat.append(khat_t)
                gamma.append(gam)
                psi_v.append([[x["v"][b][t][h][p] * x["mimo_v"][h][r][p] for p in range(P)] for r in range(R)])
            # state recurrence
            state = [[0.0] * P for _ in range(N)]
            for c in range(nc):
                states[b][h][c] = [row[:] for row in state]
                decay = math.exp(x["da_cs"][b][h][min((c + 1) * C, S) - 1])
                update = [[0.0] * P for _ in range(N)]
                for t in range(c * C, min((c + 1) * C, S)):
                    scale = math.exp(x["da_cs_rev"][b][h][t])
                    for r in range(R):
                        for n in range(N):
                            for p in range(P):
                                update[n][p] += k_hat[t][r][n] * scale * psi_v[t][r][p]
                state = [[state[n][p] * decay + update[n][p] for p in range(P)] for n in range(N)]
            # outputs and gradients, token by token
            for t in range(S):
                c = t // C
                for r in range(R):
                    for p in range(P):
                        inter = sum(q_rot[t][r][n] * states[b][h][c][n][p] for n in range(N))
                        o = inter * math.exp(x["da_cs"][b][h][t])
                        for tj in range(c * C, t):
                            w = math.exp(x["segsum"][b][h][c][t % C][tj % C])
                            for rj in range(R):
                                score = sum(q_rot[t][r][n] * k_hat[tj][rj][n] for n in range(N))
                                o += score * w * psi_v[tj][rj][p]
                        o += gamma[t] * sum(qk[t][r][ri] * psi_v[t][ri][p] for ri in range(R))
                        if x["d"] is not None:
                            o += x["d"][h] * psi_v[t][r][p]
                        if x["z"] is not None:
                            xz = x["z"][b][t][h][p] * x["mimo_z"][h][r][p]
                            gate = xz * _sigmoid(xz)
                        if x["mimo_o"] is not None:
                            dout = x["dout"][b][t][h][p]
                            dmimo_o[b][h][r][p] += (gate * o if x["z"] is not None else o) * dout
                            d_phi_o = dout * x["mimo_o"][h][r][p] * o
                        else:
                            d_phi_o = x["dout"][b][t][r][h][p] * o
                        if x["z"] is not None:
                            dzz = d_phi_o * _sigmoid(xz) * (1 + xz * _sigmoid(-xz))
                            dz[b][t][h][p] += dzz * x["mimo_z"][h][r][p]
                            dmimo_z[b][h][r][p] += dzz * x["z"][b][t][h][p]
    as_t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return {"states": as_t(states), "dz": as_t(dz), "dmimo_o": as_t(dmimo_o), "dmimo_z": as_t(dmimo_z)}


@pytest.mark.parametrize("spec", [TINY, TINY.replace(reduce_o=False, has_d=False, batch=2, seed=9),
                                  TINY.replace(formula="realistic", rotary_dim_divisor=2, groups=2)],
                         ids=cases.case_id)
def test_oracle_matches_scalar_loop_recurrence(spec):
    inputs = stage1_cases.make_inputs(spec)
    expected = _loop_reference(spec, inputs)
    out = _run(inputs)
    # one states entry (last chunk: sums over two earlier chunks) and one dz entry, then the whole tensors
    b, h = spec.batch - 1, 1
    assert abs(out.states[b, h, 2, 5, 1].item() - expected["states"][b, h, 2, 5, 1].item()) <= 1e-12
    assert abs(out.dz[b, 6, h, 2].item() - expected["dz"][b, 6, h, 2].item()) <= 1e-12
    names = ["states", "dz", "dmimo_z"] + (["dmimo_o"] if spec.reduce_o else [])
    for name in names:
        torch.testing.assert_close(getattr(out, name), expected[name], rtol=1e-12, atol=1e-12, msg=name)


def test_oracle_qk_dot_is_biased_unrotated_dot():
    inputs = stage1_cases.make_inputs(TINY)
    out = _run(inputs)
    q = inputs["q"].double()[0, 4, :, 0] + inputs["q_bias"].double()[1]  # [R, N], token 4, head 1
    k = inputs["k"].double()[0, 4, :, 0] + inputs["k_bias"].double()[1]
    torch.testing.assert_close(out.qk_dot[0, 1, 4], q @ k.T, rtol=1e-14, atol=1e-14)


def test_oracle_linear_in_v():
    inputs = stage1_cases.make_inputs(TINY)
    base = _run(inputs)
    doubled = _run(dict(inputs, v=inputs["v"] * 2))
    for name in ("dmimo_o", "states", "dz", "dmimo_z"):
        torch.testing.assert_close(getattr(doubled, name), 2 * getattr(base, name), rtol=1e-14, atol=0, msg=name)
    assert torch.equal(doubled.qk_dot, base.qk_dot)


def test_oracle_linear_in_dout():
    inputs = stage1_cases.make_inputs(TINY)
    base = _run(inputs)
    doubled = _run(dict(inputs, dout=inputs["dout"] * 2))
    for name in ("dmimo_o", "dz", "dmimo_z"):
        torch.testing.assert_close(getattr(doubled, name), 2 * getattr(base, name), rtol=1e-14, atol=0, msg=name)
    assert torch.equal(doubled.states, base.states)


def test_oracle_causal_in_last_token():
    # v at the last token only reaches the outputs of that token (and no stored state)
    inputs = stage1_cases.make_inputs(TINY)
    base = _run(inputs)
    v = inputs["v"].clone()
    v[:, -1] = -3 * v[:, -1]
    changed = _run(dict(inputs, v=v))
    assert torch.equal(changed.states, base.states)
    assert torch.equal(changed.dz[:, :-1], base.dz[:, :-1])
    assert not torch.equal(changed.dz[:, -1], base.dz[:, -1])
