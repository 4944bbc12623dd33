"""Figures of the whole op against the golden H200 data, shared by ``tests/ops/mamba3_mimo/test_mamba3_mimo_autograd.py`` and
``scripts/measure_whole_op_golden.py`` (which writes ``reports/mamba3_mimo_golden.md``).

A golden case is one entry of ``upstream_h200_full_op_cases.pt`` (``tests/data/README.md``): ``inputs`` and
upstream's ``pre``, ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post``, ``autograd``. Every error is
``rel_rms(ours, upstream)`` (upstream is the expected value); "bit-equal" is the fraction of elements identical.

* ``run_op`` (:func:`mimo_numerics.ops.mamba3_mimo.runs.run_op`): ``mamba3_mimo`` (the autograd function) from the
  raw inputs alone: ``Out`` and the 14 ``.grad``.
* :func:`cascade_figures`: where the distance to upstream comes from, step by step: each step run once on
  upstream's recorded inputs of that step and once on the package's own, so the cost of a flipped rounding upstream
  of it (e.g. a bf16 ``states`` element) shows as the difference.
* :func:`spread`: two upstream runs of one case against each other (run-to-run spread of upstream itself).
* :func:`stage_errors`: the reference chain from the raw inputs against every recorded stage of a case (also the
  sampled records of the long cases), for ``scripts/measure_fp32_level_whole_op.py`` and its tests.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from ..metrics import bit_equal_fraction, rel_rms
from ..ops.mamba3_mimo import chain
from ..ops.mamba3_mimo.cases import OP_GRAD_NAMES
from ..ops.mamba3_mimo.runs import OUTPUT_KEYS, run_op

#: The outputs issue 18 gates at rel RMS <= 2e-3 against upstream (acceptance item 1).
GATED_OUTPUTS = ("Out", "dQ", "dK", "dV", "dZ", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out")
STAGE1_OUTPUTS = ("dmimo_o", "states", "dz", "dmimo_z", "qk_dot")
STAGE2_OUTPUTS = ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA",
                  "ddA_cs_rev", "ddA_cs")


def errors(got: Dict[str, Optional[torch.Tensor]], want: Dict[str, Optional[torch.Tensor]],
           names=OUTPUT_KEYS) -> Dict[str, float]:
    """``rel_rms(got[n], want[n])`` for every name both have (absent branches left out)."""
    return {n: rel_rms(got[n], want[n]) for n in names if want.get(n) is not None and got.get(n) is not None}


def bit_equal(got: Dict[str, Optional[torch.Tensor]], want: Dict[str, Optional[torch.Tensor]],
              names) -> Dict[str, float]:
    """Fraction of bit-equal elements per name (same dtype only)."""
    return {n: bit_equal_fraction(got[n], want[n]) for n in names
            if want.get(n) is not None and got.get(n) is not None and got[n].dtype == want[n].dtype}


def spread(case: dict, rerun: dict) -> Dict[str, float]:
    """Upstream against upstream: ``rel_rms(rerun, golden)`` of ``Out`` and the gradients."""
    return errors(rerun["autograd"], case["autograd"])


def chain_stages(inputs: dict, policy, segsum_num_warps: Optional[int] = None,
                 backend: str = "reference") -> Dict[str, Dict[str, torch.Tensor]]:
    """Every stage's outputs of the reference chain from the raw inputs, by the golden sections' names (``pre``,
    ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post``, ``autograd``); ``segsum_num_warps``: the recording run's autotuner
    pick of ``dacs_segsum_kernel`` (``golden.SEGSUM_NUM_WARPS_OF_RUN``; None: the default; the reference's
    preprocessing only); ``backend="triton"``: every step on the package's kernels (``chain.run_*``; a policy they
    cannot express raises ``UnsupportedPolicyError``)."""
    if backend not in ("reference", "triton"):
        raise ValueError(f"backend must be 'reference' or 'triton', got {backend!r}")
    pre = chain.run_preprocess(inputs, policy, backend=backend,
                               segsum_num_warps=segsum_num_warps if backend == "reference" else None)
    o = chain.run_forward(inputs, pre, policy, backend=backend)
    s1 = chain.run_stage1(inputs, pre, policy, backend=backend)
    s2 = chain.run_stage2(inputs, pre, s1, policy, backend=backend)
    post = chain.run_epilogue(inputs, pre, s1, s2, policy, backend=backend)
    return {"pre": pre, "fwd": {"o": o}, "bwd_fwd": s1, "bwd_bwd": s2, "post": {**post, "dtrap": post.get("dTrap")},
            "autograd": {**post, "Out": o}}


def stage_errors(inputs: dict, case: dict, policy, segsum_num_warps: Optional[int] = None,
                 backend: str = "reference") -> Dict[str, float]:
    """``{"<section>.<name>": rel RMS}`` of :func:`chain_stages` (on ``backend``) against every tensor ``case``
    records (a sampled record of a long case: over its positions, ``golden_samples.sampled_rel_rms``); outputs the
    chain does not produce in the recorded shape are left out. Compared on the CPU, wherever the chain ran."""
    from .. import golden_samples

    ours = chain_stages(inputs, policy, segsum_num_warps, backend)
    out = {}
    for section in ours:
        for name, want in (case.get(section) or {}).items():
            got = ours[section].get(name)
            if want is None or got is None or not torch.is_tensor(got):
                continue
            shape = want["shape"] if isinstance(want, dict) else list(want.shape)
            if list(got.shape) != list(shape):
                continue
            got = got.cpu()
            out[f"{section}.{name}"] = (golden_samples.sampled_rel_rms(got, want) if isinstance(want, dict)
                                        else rel_rms(got, want))
    return out


def _stage1(inputs, pre, policy="upstream_sm90"):
    return chain.run_stage1(inputs, pre, policy)


def chain_on_pre(inputs: dict, pre: dict, policy) -> Dict[str, Optional[torch.Tensor]]:
    """``Out`` and the 14 gradients of the package's chain (no autograd) on given preprocessing outputs."""
    out = chain.run_forward(inputs, pre, policy)
    grads = chain.run_backward(inputs, pre, policy)
    return {"Out": out, **{name: grads[name] for name in OP_GRAD_NAMES}}


def cascade_figures(case: dict, policy="upstream_sm90") -> Dict[str, Dict[str, Dict[str, float]]]:
    """Step-by-step distance of the package to upstream on one golden case (module docstring).

    Returns:
        dict ``row -> {"rel_rms": {output: value}, "bit_equal": {output: fraction}}`` with rows
        ``pre`` (ours in FP32 vs upstream's Triton), ``fwd|own pre``, ``fwd|upstream pre``,
        ``stage1|own pre``, ``stage1|upstream pre``, ``stage2|upstream stage 1``, ``stage2|own stage 1 (upstream
        pre)``, ``stage2|own chain``, ``epilogue|upstream stage 2`` (the epilogue on upstream's recorded inputs:
        its FP32-level floor), ``op|upstream pre`` (the package's forward and backward chain on upstream's
        preprocessing outputs: what the op would give if upstream's hardware tanh could be reproduced) and
        ``op|own chain`` (``mamba3_mimo`` from the raw inputs).
    """
    x = dict(case["inputs"])
    up_pre, up_s1, up_s2 = case["pre"], case["bwd_fwd"], case["bwd_bwd"]
    rows: Dict[str, Tuple[dict, dict, tuple]] = {}
    own_pre = chain.run_preprocess(x, policy)
    rows["pre"] = (own_pre, up_pre, chain.PRE_NAMES)
    rows["fwd|own pre"] = ({"o": chain.run_forward(x, own_pre, policy)}, case["fwd"], ("o",))
    rows["fwd|upstream pre"] = ({"o": chain.run_forward(x, up_pre, policy)}, case["fwd"], ("o",))
    s1_own = _stage1(x, own_pre, policy)
    s1_up_pre = _stage1(x, up_pre, policy)
    rows["stage1|own pre"] = (s1_own, up_s1, STAGE1_OUTPUTS)
    rows["stage1|upstream pre"] = (s1_up_pre, up_s1, STAGE1_OUTPUTS)
    rows["stage2|upstream stage 1"] = (chain.run_stage2(x, up_pre, up_s1, policy), up_s2, STAGE2_OUTPUTS)
    rows["stage2|own stage 1 (upstream pre)"] = (chain.run_stage2(x, up_pre, s1_up_pre, policy), up_s2,
                                                 STAGE2_OUTPUTS)
    s2_own = chain.run_stage2(x, own_pre, s1_own, policy)
    rows["stage2|own chain"] = (s2_own, up_s2, STAGE2_OUTPUTS)
    rows["epilogue|upstream stage 2"] = (chain.run_epilogue(x, up_pre, up_s1, up_s2, policy), case["autograd"],
                                         OP_GRAD_NAMES)
    rows["op|upstream pre"] = (chain_on_pre(x, up_pre, policy), case["autograd"], OUTPUT_KEYS)
    rows["op|own chain"] = (run_op(x, policy), case["autograd"], OUTPUT_KEYS)
    return {row: {"rel_rms": errors(got, want, names), "bit_equal": bit_equal(got, want, names)}
            for row, (got, want, names) in rows.items()}


def flipped_states(case: dict, policy="upstream_sm90") -> Dict[str, int]:
    """How many bf16 ``states`` (and ``qk_dot``) elements of stage 1 differ from upstream's: with upstream's own
    preprocessing and with the package's."""
    x = dict(case["inputs"])
    out = {}
    for label, pre in (("upstream pre", case["pre"]), ("own pre", chain.run_preprocess(x, policy))):
        s1 = _stage1(x, pre, policy)
        for name in ("states", "qk_dot"):
            out[f"{name}|{label}"] = int((s1[name] != case["bwd_fwd"][name]).sum())
        out[f"states elements|{label}"] = s1["states"].numel()
    return out


def site_off_rank(inputs: dict, base="upstream_sm90") -> list:
    """One site off at a time from ``base``: how far ``Out`` and the gradients are from the FP64 chain.

    For every site of the three policy operators, ``base`` with that one site not rounded runs the chain (the
    package's FP32 preprocessing, no autograd) on ``inputs`` (golden names, with ``dout``). Returns rows
    ``{"site": "<op>.<site>", "out": rel RMS of Out, "grads": {grad: rel RMS}, "mean": geometric mean over the
    gradients}`` against the FP64 chain, the base first (``"site": "(none)"``), then the sites by ``mean``, lowest
    first (the site whose rounding costs the gradients most comes first). The geometric mean weighs every gradient
    alike (an arithmetic one is ruled by ``dD``, a cancelling sum ~10x further from FP64 than the others). A forward
    site moves ``Out`` only: the backward recomputes what it needs (stage 1) and reads no forward output.
    """
    from .. import presets

    base = presets.resolve(base)
    want = chain.fp64_chain(inputs)
    want_out = chain.run_forward(inputs, chain.preprocess(inputs, torch.float64), "fp64")

    def row(label, policy):
        got = chain_on_pre(inputs, chain.run_preprocess(inputs, policy), policy)
        grads = errors(got, want, OP_GRAD_NAMES)
        mean = math.exp(sum(math.log(max(v, 1e-300)) for v in grads.values()) / len(grads))
        return {"site": label, "out": rel_rms(got["Out"], want_out), "grads": grads, "mean": mean}

    rows = [row(f"{op}.{site}", base.with_sites(op, **{site: False}))
            for op in chain.POLICY_OPERATORS for site in base.section(op)]
    return [row("(none)", base)] + sorted(rows, key=lambda r: r["mean"])
