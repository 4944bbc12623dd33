"""Sweeps over many cases × policies, in parallel across processes, with a progress bar.

:func:`parallel_map` runs a picklable function over items with ``concurrent.futures.ProcessPoolExecutor`` in the
``spawn`` start method (safe with torch and on every OS; ``workers=1`` runs in-process, without a pool) and keeps the
input order. Each worker limits torch to one intra-op thread so ``workers`` processes use ``workers`` cores.

:func:`run_sweep` evaluates every (case, policy) pair against a baseline (the ``fp64`` preset or the oracle) and,
for golden cases, against the real H200 outputs too. Cases are ``CaseSpec`` objects (``mimo_numerics.cases``) or
golden case names (``mimo_numerics.golden``).

The progress bar is ``tqdm`` (``tqdm.auto``: a widget in Jupyter, text on stderr elsewhere); ``progress=False`` silences
it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from tqdm.auto import tqdm

from .cases import CaseSpec

CaseLike = Union[CaseSpec, str]


# ---------------------------------------------------------------------------------------------- progress
def progress_bar(total: int, desc: str = "", enabled: bool = True, stream=None) -> tqdm:
    """A ``tqdm`` bar over ``total`` items labelled ``desc``, on ``stream`` (default stderr).

    ``enabled=False`` gives a silent bar (tqdm's ``disable``). Use it as a context manager and call ``update()`` once
    per finished item.
    """
    return tqdm(total=total, desc=desc, disable=not enabled, file=stream if stream is not None else sys.stderr)


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def default_workers() -> int:
    """The usable CPU count (``os.sched_getaffinity`` where it exists)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def parallel_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: Optional[int] = None,
                 progress: bool = True, desc: str = "sweep", threads_per_worker: int = 1) -> List[Any]:
    """``[fn(item) for item in items]`` across ``workers`` spawned processes, in input order.

    Args:
        fn (callable): a module-level (picklable) function.
        items (iterable): picklable arguments.
        workers (int, optional): process count; default :func:`default_workers`, capped at the item count.
            ``1`` runs in this process without a pool.
        progress (bool): show a progress bar on stderr.
        desc (str): the bar's label.
        threads_per_worker (int): torch intra-op threads in each worker.

    Returns:
        list: the results, in the order of ``items``. An exception in a worker is raised here as a ``RuntimeError``
        naming the item (the original exception is its cause); in-process, the exception propagates as is.
    """
    items = list(items)
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    workers = min(workers, max(len(items), 1))
    results: List[Any] = [None] * len(items)
    with progress_bar(len(items), desc, enabled=progress) as bar:
        if workers == 1:
            for i, item in enumerate(items):
                results[i] = fn(item)
                bar.update()
            return results
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                                 initargs=(threads_per_worker,)) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for future in as_completed(futures):
                index = futures[future]
                try:
                    results[index] = future.result()
                except Exception as exc:
                    for other in futures:
                        other.cancel()
                    raise RuntimeError(f"{desc}: item {index} ({items[index]!r}) failed: {exc}") from exc
                bar.update()
    return results


# ---------------------------------------------------------------------------------------------- sweeps
@dataclass(frozen=True)
class SweepTask:
    """One (case, policy) evaluation: ``case`` is a ``CaseSpec`` or a golden case name; ``policy`` a preset name or
    policy JSON dict; ``baseline`` ``"fp64"`` (reference preset) or ``"oracle"``."""

    case: CaseLike
    policy: Union[str, Dict[str, Any]]
    baseline: str = "fp64"


def case_label(case: CaseLike) -> str:
    """A case's id: ``CaseSpec.case_id`` or the golden name."""
    return case.case_id if isinstance(case, CaseSpec) else str(case)


def load_case(case: CaseLike):
    """``(inputs, device outputs or None)`` of a CaseSpec (inputs drawn on the CPU) or a golden case name."""
    if isinstance(case, CaseSpec):
        from .cases import make_inputs

        return make_inputs(case), None
    from .golden import golden_case

    return golden_case(case)


def evaluate_task(task: SweepTask) -> Dict[str, Any]:
    """Evaluate one task (runs in a worker): per output, rel RMS / max rel / bit-equal fraction vs the baseline,
    and vs the device outputs when the case has them. A policy whose ``lp_dtype`` differs from the case's is run in
    the case's lp dtype and labelled ``name[float16]``. Returns plain JSON types."""
    from . import presets
    from .metrics import compare_outputs
    from .policy import RoundingPolicy
    from .sensitivity import baseline_outputs
    from .inference import run_reference

    from .inference import lp_dtype_of

    policy = (RoundingPolicy.from_dict(task.policy) if isinstance(task.policy, dict)
              else presets.resolve(task.policy))
    label = task.policy if isinstance(task.policy, str) else policy.name
    start = time.monotonic()
    inputs, device = load_case(task.case)
    lp = lp_dtype_of(inputs)
    if policy.lp_dtype != lp:  # a float16 case: the same policy in float16
        policy = policy.replace(lp_dtype=lp)
        label = f"{label}[{lp}]"
    outputs = run_reference(inputs, policy)
    base = baseline_outputs(inputs, task.baseline)[0]
    record: Dict[str, Any] = {"case": case_label(task.case), "policy": label, "policy_json": policy.to_dict(),
                              "baseline": task.baseline,
                              "vs_baseline": _clean(compare_outputs(outputs, base))}
    if device is not None:
        record["vs_device"] = _clean(compare_outputs(outputs, device))
    record["seconds"] = time.monotonic() - start
    return record


def _clean(metrics: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for name, values in metrics.items():
        if values is None:
            continue
        out[name] = {k: (None if isinstance(v, float) and v != v else v) for k, v in values.items()}
    return out


@dataclass
class SweepResult:
    """Records of :func:`run_sweep`, one per (case, policy), in case-major order."""

    records: List[Dict[str, Any]] = field(default_factory=list)

    def pivot(self, output: str, metric: str = "rel_rms", against: str = "vs_baseline") -> Dict[str, Dict[str, Any]]:
        """``{case: {policy: value}}`` of one output's metric (``against``: vs_baseline or vs_device)."""
        table: Dict[str, Dict[str, Any]] = {}
        for r in self.records:
            value = r.get(against, {}).get(output, {}).get(metric)
            table.setdefault(r["case"], {})[r["policy"]] = value
        return table

    def to_dict(self) -> Dict[str, Any]:
        return {"records": self.records}

    def save_json(self, path) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1)

    def to_markdown(self, output: str = "dz", metric: str = "rel_rms", against: str = "vs_baseline") -> str:
        """Cases as rows, policies as columns, for one output."""
        table = self.pivot(output, metric, against)
        policies = list(dict.fromkeys(p for row in table.values() for p in row))
        lines = [f"{output} {metric} ({against})", "", "| case | " + " | ".join(policies) + " |",
                 "|" + "---|" * (len(policies) + 1)]
        for case, row in table.items():
            cells = ["–" if row.get(p) is None else f"{row[p]:.3g}" for p in policies]
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def run_sweep(cases: Sequence[CaseLike], policies: Sequence[Union[str, Any]], baseline: str = "fp64",
              workers: Optional[int] = None, progress: bool = True) -> SweepResult:
    """Evaluate every (case, policy) pair in parallel (see :func:`evaluate_task`).

    Args:
        cases: ``CaseSpec`` objects and/or golden case names.
        policies: preset names or ``RoundingPolicy`` objects.
        baseline (str): ``"fp64"`` or ``"oracle"``.
        workers (int, optional): processes (default: the CPU count; 1: in-process).
        progress (bool): progress bar on stderr.

    Returns:
        SweepResult
    """
    from .policy import RoundingPolicy

    tasks = [SweepTask(case, p.to_dict() if isinstance(p, RoundingPolicy) else p, baseline)
             for case in cases for p in policies]
    return SweepResult(parallel_map(evaluate_task, tasks, workers=workers, progress=progress, desc="sweep"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mimo_numerics.sweep``: a grid and/or the golden cases × policies, in parallel."""
    import argparse

    from .cases import grid, grid_names
    from .golden import golden_names

    parser = argparse.ArgumentParser(prog="python -m mimo_numerics.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", action="append", default=[], choices=grid_names(),
                        help="a case grid of mimo_numerics.cases (repeatable)")
    parser.add_argument("--golden", action="store_true", help="also the golden H200 cases (compared to the device)")
    parser.add_argument("--policies", default="fp32,seed_bf16,upstream_sm90", help="comma-separated presets")
    parser.add_argument("--baseline", default="fp64", choices=("fp64", "oracle"))
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPU count)")
    parser.add_argument("--output", default="dz", help="output shown in the printed table")
    parser.add_argument("--out", default=None, help="write all records as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    specs: List[CaseLike] = [spec for name in (args.grid or ([] if args.golden else ["smoke"]))
                             for spec in grid(name)]
    if args.golden:
        specs += list(golden_names())
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    result = run_sweep(specs, policies, args.baseline, args.workers, progress=not args.quiet)
    if args.out:
        result.save_json(args.out)
    print(result.to_markdown(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
