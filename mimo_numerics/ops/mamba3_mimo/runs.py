"""Runs of the whole op for its report: every named tensor of the chain, by ``record`` key, in chain order.

A *run* here is what ``mamba3_mimo(..., record=record)`` fills (``autograd.RECORD_PREFIXES``): the preprocessing
outputs (``mamba3_mimo_preprocess.<name>``), the recorded stages of each operator (``mamba_mimo_fwd.<stage>``,
``mamba_mimo_bwd_fwd.<stage>``, ``mamba_mimo_bwd_bwd.<stage>``), its outputs (``<operator>.outputs.<name>``) and the
epilogue's outputs (``mamba3_mimo_epilogue.<gradient>``). The generic drift tools take it as is, ordered by
:func:`chain_order` and grouped by :func:`groups`.

* :func:`policy_run`: the op under a policy (forward and ``backward(dout)``), with its record.
* :func:`fp64_run`: the ``fp64`` run of the op. Its chain runs the FP64 oracles, which record no internal stages,
  only each step's outputs; :func:`fp64_run` fills the internal stages by running each operator's reference under
  the ``fp64`` preset on the fp64 chain's own float64 tensors (its preprocessing, stage 1's float64 ``states`` and
  ``qk_dot``), so every stage of a policy run has an FP64 counterpart. The outputs stay the oracles'
  (the references agree with them to ~1e-15, FP64 summation order: ``tests/studies/test_mamba3_mimo_report.py``).
* :func:`upstream_run`: a golden case's upstream tensors (the H200's kernel outputs and autograd gradients) under
  the same keys: outputs only.
* :func:`op_outputs`: ``Out`` and the 14 gradients of a run, by golden ``autograd`` names, unrounded (under ``fp64``
  the record holds the float64 gradients that torch autograd would cast to the inputs' dtypes).
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional, Tuple

import torch

from ... import operator as _operator
from ... import presets as _presets
from ..mamba_mimo_bwd_fwd import reference as _stage1_reference
from ..mamba3_mimo_epilogue import spec as _epilogue_spec
from ..mamba_mimo_bwd_bwd import reference as _stage2_reference
from ..mamba_mimo_bwd_bwd import spec as _stage2_spec
from ..mamba_mimo_fwd import reference as _fwd_reference
from ..mamba_mimo_fwd import spec as _fwd_spec
from . import chain
from .autograd import GOLDEN_SECTIONS, RECORD_PREFIXES, mamba3_mimo
from .cases import OP_GRAD_NAMES, OP_INPUT_NAMES
from ..mamba_mimo_bwd_fwd import validation as stage1_validation

Run = Dict[str, torch.Tensor]
#: ``Out`` and the 14 gradients, as the golden ``autograd`` entry names them.
OUTPUT_KEYS = ("Out",) + OP_GRAD_NAMES
#: Record key of ``Out`` (the forward operator's output).
OUT_KEY = "mamba_mimo_fwd.outputs.o"
_PRE, _EPILOGUE = RECORD_PREFIXES[0], RECORD_PREFIXES[-1]
#: Per policy operator: the reference module whose ``validate_inputs`` :func:`fp64_run` widens, its tensor
#: arguments in call order and those of them in the lp dtype.
_REFERENCES = {
    "mamba_mimo_fwd": (_fwd_reference, _fwd_spec.INPUT_NAMES, _fwd_spec.LP_INPUTS),
    "mamba_mimo_bwd_fwd": (_stage1_reference, stage1_validation.INPUT_NAMES, stage1_validation.LP_INPUTS),
    "mamba_mimo_bwd_bwd": (_stage2_reference, _stage2_spec.INPUT_NAMES, _stage2_spec.LP_INPUTS),
}


# ---------------------------------------------------------------------------------------------------- keys
def chain_order() -> Tuple[str, ...]:
    """Every record key in chain order: the preprocessing, then per operator its recorded stages (its spec's
    order) and its outputs, then the epilogue's outputs (the gradients, then ``ddt_core``, ``dDT_angle``)."""
    keys = [f"{_PRE}.{name}" for name in chain.PRE_NAMES]
    for name in chain.POLICY_OPERATORS:
        op = _operator.get(name)
        keys += [f"{name}.{stage}" for stage in op.stage_names]
        keys += [f"{name}.outputs.{output}" for output in op.output_names]
    keys += [f"{_EPILOGUE}.{name}" for name in _epilogue_spec.OUTPUT_NAMES]
    return tuple(keys)


def group_of(key: str) -> str:
    """The step of the chain a record key belongs to (its prefix, one of ``autograd.RECORD_PREFIXES``)."""
    group = key.partition(".")[0]
    if group not in RECORD_PREFIXES:
        raise KeyError(f"{key!r} is not a record key of mamba3_mimo; prefixes: {list(RECORD_PREFIXES)}")
    return group


def groups(keys) -> Dict[str, str]:
    """``{key: group_of(key)}`` (the ``groups`` argument of ``plots.plot_stage_drift``)."""
    return {key: group_of(key) for key in keys}


def op_outputs(run: Run) -> Dict[str, Optional[torch.Tensor]]:
    """``Out`` and the 14 gradients of a run by golden ``autograd`` names (None where the branch is absent or the
    run lacks them)."""
    out = {"Out": run.get(OUT_KEY)}
    out.update({name: run.get(f"{_EPILOGUE}.{name}") for name in OP_GRAD_NAMES})
    return out


# ---------------------------------------------------------------------------------------------------- runs
def backend_for(policy, backend: str) -> str:
    """The op's backend for one policy of a study asked to use ``backend``: ``"triton"`` only where the kernels
    can express the policy (``fp64`` and other float64 or unrounded policies run the reference).

    Raises:
        ValueError: ``backend`` is not ``"reference"`` or ``"triton"``.
    """
    if backend == "reference":
        return backend
    if backend != "triton":
        raise ValueError(f"backend must be 'reference' or 'triton', got {backend!r}")
    from ... import kernels  # imports triton only when asked for

    try:
        for operator in ("mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd"):
            kernels.operator_constexprs(_presets.resolve(policy), operator)
    except kernels.UnsupportedPolicyError:
        return "reference"
    return "triton"


def run_op(inputs: dict, policy, *, backend: str = "reference",
           record: Optional[dict] = None) -> Dict[str, Optional[torch.Tensor]]:
    """``mamba3_mimo`` forward and ``backward(dout)`` on fresh leaves of ``inputs`` (golden names): ``Out`` and
    every input's ``.grad`` by golden ``autograd`` names (None for absent inputs)."""
    leaves = {n: (None if inputs[n] is None else inputs[n].detach().clone().requires_grad_(True))
              for n in OP_INPUT_NAMES}
    out = mamba3_mimo(*leaves.values(), inputs["chunk_size"], inputs["rotary_dim_divisor"], policy=policy,
                      backend=backend, record=record)
    out.backward(inputs["dout"].to(out.dtype))
    result = {"Out": out.detach()}
    result.update({f"d{n}": (None if leaf is None else leaf.grad) for n, leaf in leaves.items()})
    return result


def policy_run(inputs: dict, policy, *, backend: str = "reference") -> Run:
    """The record of ``mamba3_mimo`` under ``policy`` (forward and ``backward(dout)``) on ``inputs`` (the 14 raw
    inputs by golden names, ``dout``, ``chunk_size``, ``rotary_dim_divisor``)."""
    record: Run = {}
    run_op(inputs, policy, backend=backend, record=record)
    return record


@contextlib.contextmanager
def _references_check_narrow_copies() -> Iterator[None]:
    """While active, the three operator references validate float32 (lp, for their lp arguments) copies of float64
    tensors and compute on the float64 tensors themselves (their checks keep upstream's dtypes; under the ``fp64``
    preset their arithmetic is float64 anyway). Swaps each reference module's ``validate_inputs`` for the call's
    duration, as ``chain.stage1_oracle_fp64`` does for the stage-1 oracle: not thread-safe. A ``wide=True`` option
    of the references' validation would remove this."""
    saved = {}
    for module, names, lp_names in _REFERENCES.values():
        checker = module.validate_inputs

        def check_copies(*args, _checker=checker, _names=names, _lp=lp_names, **kwargs):
            lp = next(a.dtype for n, a in zip(_names, args) if n in _lp and isinstance(a, torch.Tensor)
                      and a.dtype != torch.float64)
            copied = [a.to(lp if n in _lp else torch.float32)
                      if isinstance(a, torch.Tensor) and a.dtype == torch.float64 else a
                      for n, a in zip(_names, args)]
            return _checker(*copied, *args[len(_names):], **kwargs)

        saved[module] = checker
        module.validate_inputs = check_copies
    try:
        yield
    finally:
        for module, checker in saved.items():
            module.validate_inputs = checker


def _stages_of(record: Run, prefix: str) -> Run:
    return {f"{prefix}.{k}": v for k, v in record.items() if v is not None}


def fp64_stages(inputs: dict, run: Run) -> Run:
    """The internal stages of the fp64 chain: each operator's reference under the ``fp64`` preset (nothing rounded,
    float64) on the float64 tensors of the fp64 run ``run`` (:func:`policy_run` under ``"fp64"``), by record key,
    with the references' outputs under ``<operator>.outputs.<name>`` (to check against the oracles' in ``run``).
    The forward and stage 1 take its preprocessing, stage 2 also its stage-1 ``states`` and ``qk_dot``."""
    policy = _presets.get("fp64").replace(lp_dtype=str(inputs["Q"].dtype).replace("torch.", ""))
    x = dict(inputs)
    x["dout"] = inputs["dout"].to(torch.float64)
    pre = {name: run[f"{_PRE}.{name}"] for name in chain.PRE_NAMES}
    stage1 = {name: run.get(f"mamba_mimo_bwd_fwd.outputs.{name}") for name in ("states", "qk_dot")}
    kw = chain.stage2_kwargs(x)
    steps = {"mamba_mimo_fwd": (_fwd_reference.mamba_mimo_fwd, chain.forward_args(x, pre)),
             "mamba_mimo_bwd_fwd": (_stage1_reference.mamba_mimo_bwd_fwd, chain.stage1_args(x, pre)),
             "mamba_mimo_bwd_bwd": (_stage2_reference.mamba_mimo_bwd_bwd, chain.stage2_args(x, pre, stage1))}
    stages: Run = {}
    with _references_check_narrow_copies():
        for name, (reference, args) in steps.items():
            record: Run = {}
            outputs = reference(*args, **kw, policy=policy, record=record)
            stages.update(_stages_of(record, name))
            stages.update(_stages_of(outputs.as_dict(), f"{name}.outputs"))
    return stages


def fp64_run(inputs: dict) -> Run:
    """The ``fp64`` run of the op (FP64 oracles: preprocessing and outputs of every step) with the internal stages
    of :func:`fp64_stages` added (module docstring)."""
    run = policy_run(inputs, "fp64")
    for key, value in fp64_stages(inputs, run).items():
        run.setdefault(key, value)
    return run


def upstream_run(case: dict) -> Run:
    """A golden case's upstream tensors by record key: ``pre``, ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post`` and the
    14 gradients of ``autograd`` (sections upstream refused are absent)."""
    run: Run = {}
    for section, (prefix, names) in GOLDEN_SECTIONS.items():
        values = case.get("autograd" if section == "grads" else section) or {}
        for golden_name, name in names.items():
            if values.get(golden_name) is not None:
                run[f"{prefix}.{name}"] = values[golden_name]
    return run

