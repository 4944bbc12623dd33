"""Sweeps over many cases × policies of one operator, in parallel, with a progress bar.

:func:`parallel_map` maps a picklable function over items and keeps the input order. ``workers=1`` runs in this
process; otherwise an **executor** (:data:`EXECUTORS`) spreads the items: ``"process"`` uses
``concurrent.futures.ProcessPoolExecutor`` in the ``spawn`` start method (safe with torch and on every OS), each worker
limited to ``threads_per_worker`` torch intra-op threads so ``workers`` processes use ``workers`` cores. An executor
is one function ``executor(fn, items, *, workers, bar, desc, threads_per_worker) -> list`` (results in input order,
``bar.update()`` once per finished item, a failed item raised as a ``RuntimeError`` naming it); adding one (e.g. Ray)
is adding such a function to :data:`EXECUTORS`.

:func:`run_sweep` evaluates every (case, policy) pair of an operator (``op``, default the registry's default
operator) against a baseline (the ``fp64`` preset or the FP64 oracle) and, for golden cases, against the real H200
outputs too. Cases are the operator's case specs (``op.cases(grid)``: ``CaseSpec``, ``StoredCase``, ``OpCaseSpec``)
or the names of its golden cases (``op.load("golden")``). Tasks carry the operator's *name* to the worker processes.

The progress bar is ``tqdm`` (``tqdm.auto``: a widget in Jupyter, text on stderr elsewhere); ``progress=False`` silences
it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from tqdm.auto import tqdm

from . import operator as _operator

#: A case spec object (anything with ``case_id`` that ``op.draw`` takes) or a golden case name.
CaseLike = Any
OperatorLike = Union[str, _operator.Operator, None]
#: Presets a sweep compares by default, where they define the operator.
DEFAULT_POLICIES = ("fp32", "seed_bf16", "upstream_sm90")


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


# ---------------------------------------------------------------------------------------------- executors
def _map_in_process(fn: Callable[[Any], Any], items: List[Any], *, workers: int, bar: tqdm, desc: str,
                    threads_per_worker: int) -> List[Any]:
    """The items one after the other in this process (an exception propagates as is)."""
    results = []
    for item in items:
        results.append(fn(item))
        bar.update()
    return results


def _map_processes(fn: Callable[[Any], Any], items: List[Any], *, workers: int, bar: tqdm, desc: str,
                   threads_per_worker: int) -> List[Any]:
    """The items across ``workers`` spawned processes (``ProcessPoolExecutor``), in input order."""
    results: List[Any] = [None] * len(items)
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


def _one_thread(fn: Callable[[Any], Any], item: Any, threads: int) -> Any:
    """``fn(item)`` with ``threads`` torch intra-op threads (as the process pool's workers run), restored after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(item)
    finally:
        torch.set_num_threads(saved)


#: Seconds :func:`check_ray_address` waits for a TCP connection to a Ray address before giving up.
RAY_CONNECT_TIMEOUT_S = 10.0
#: Ray's default ports: the GCS of a head (``host`` alone) and the Ray client server (``ray://host``).
_RAY_GCS_PORT, _RAY_CLIENT_PORT = 6379, 10001


def ray_endpoint(address: Optional[str]) -> Optional[Tuple[str, int]]:
    """``(host, port)`` that a Ray ``address`` names: ``"host:port"`` (a head's GCS, port 6379 when left out) or
    ``"ray://host:port"`` (the Ray client server, port 10001 when left out); None for the addresses that name no
    endpoint (None: a local instance, ``"auto"``: the cluster Ray finds on this machine, ``"local"``).

    Raises:
        ValueError: an address of another scheme, or a port that is not a number in 1..65535.
    """
    if address is None:
        return None
    if not isinstance(address, str):
        raise TypeError(f"address must be a str (host:port, ray://host:port, 'auto', 'local') or None, got "
                        f"{type(address).__name__}")
    text = address.strip()
    if text in ("", "auto", "local"):
        return None
    port = _RAY_GCS_PORT
    if text.startswith("ray://"):
        text, port = text[len("ray://"):], _RAY_CLIENT_PORT
    elif "://" in text:
        raise ValueError(f"address {address!r}: expected host:port, ray://host:port, 'auto' or 'local'")
    text = text.split("/", 1)[0]
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"address {address!r}: the port must be a number in 1..65535, got {port_text!r}")
        port = int(port_text)
    if not host:
        raise ValueError(f"address {address!r} names no host")
    return host, port


def check_ray_address(address: Optional[str], timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Fail fast where ``ray.init(address)`` would wait for minutes: a TCP connection to the host and port the
    address names (:func:`ray_endpoint`), given up after ``timeout`` seconds.

    It checks only that something accepts a TCP connection there, not that it is a Ray head of a matching version
    (``ray.init`` still checks that, with its own waits); ``None``, ``"auto"`` and ``"local"`` are not checked.

    Raises:
        ConnectionError: nothing accepted the connection in time, naming the address and the timeout.
    """
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except socket.timeout:
        raise ConnectionError(f"executor='ray': no answer from {host}:{port} (address {address!r}) within "
                              f"{timeout:g} s; is a Ray head running there (ray start --head)?") from None
    except OSError as exc:
        raise ConnectionError(f"executor='ray': cannot connect to {host}:{port} (address {address!r}): "
                              f"{exc.strerror or exc}; is a Ray head running there (ray start --head)?") from None


def _ray_preflight(address: Optional[str], connect_timeout: float) -> None:
    """:func:`check_ray_address`, unless this process already runs a Ray instance (then ``address`` is not used)."""
    running = sys.modules.get("ray")
    if not (running is not None and running.is_initialized()):
        check_ray_address(address, connect_timeout)


def _map_ray(fn: Callable[[Any], Any], items: List[Any], *, workers: int, bar: tqdm, desc: str,
             threads_per_worker: int, address: Optional[str] = None, num_gpus: Optional[float] = None,
             connect_timeout: float = RAY_CONNECT_TIMEOUT_S) -> List[Any]:
    """One Ray task per item, in input order, on a local Ray instance (``workers`` CPUs, started here and shut down
    afterwards) or on the cluster at ``address`` (``"auto"``, ``"ray://head:10001"``), ``num_gpus`` per task.
    An instance already running in this process (``ray.init`` in a notebook) is used and left running. Before
    ``ray.init``, :func:`check_ray_address` gives up on an address that accepts no TCP connection within
    ``connect_timeout`` seconds (``ray.init`` itself would retry for minutes)."""
    _ray_preflight(address, connect_timeout)
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'mimo_numerics[ray]' (and 'ray[client]' for a "
                          "ray:// address)") from exc
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False)
    try:
        task = ray.remote(num_cpus=threads_per_worker, num_gpus=num_gpus or 0)(_one_thread)
        fn_ref = ray.put(fn)
        pending = {task.remote(fn_ref, item, threads_per_worker): i for i, item in enumerate(items)}
        results: List[Any] = [None] * len(items)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    results[index] = ray.get(ref)
                except Exception as exc:
                    for other in pending:
                        ray.cancel(other)
                    raise RuntimeError(f"{desc}: item {index} ({items[index]!r}) failed: {exc}") from exc
                bar.update()
        return results
    finally:
        if started:
            ray.shutdown()


#: Executors of :func:`parallel_map` by name (module docstring: the interface of one); ``"ray"`` also takes
#: ``address``, ``num_gpus`` and ``connect_timeout`` (docs/sweeps.md).
EXECUTORS: Dict[str, Callable[..., List[Any]]] = {"process": _map_processes, "ray": _map_ray}


def parallel_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: Optional[int] = None,
                 progress: bool = True, desc: str = "sweep", threads_per_worker: int = 1,
                 executor: str = "process", **executor_options) -> List[Any]:
    """``[fn(item) for item in items]`` across ``workers`` workers of ``executor``, in input order.

    Args:
        fn (callable): a module-level (picklable) function.
        items (iterable): picklable arguments.
        workers (int, optional): worker count; default :func:`default_workers`, capped at the item count.
            ``1`` runs in this process, with no executor.
        progress (bool): show a progress bar on stderr.
        desc (str): the bar's label.
        threads_per_worker (int): torch intra-op threads in each worker.
        executor (str): a key of :data:`EXECUTORS` (``"process"``, ``"ray"``).
        executor_options: the executor's own options (``"ray"``: ``address``, ``num_gpus``, ``connect_timeout``).

    Returns:
        list: the results, in the order of ``items``. An exception in a worker is raised here as a ``RuntimeError``
        naming the item (the original exception is its cause); in-process, the exception propagates as is.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; executors: {list(EXECUTORS)}")
    if executor == "process" and executor_options:
        raise ValueError(f"{sorted(executor_options)} apply to executor='ray' only")
    items = list(items)
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    workers = min(workers, max(len(items), 1))
    if workers == 1 and executor == "process":
        run, executor_options = _map_in_process, {}
    else:
        run = EXECUTORS[executor]
    if executor == "ray":  # before the bar: an unreachable address is one line, not a bar and a traceback
        _ray_preflight(executor_options.get("address"),
                       executor_options.get("connect_timeout", RAY_CONNECT_TIMEOUT_S))
    with progress_bar(len(items), desc, enabled=progress) as bar:
        return run(fn, items, workers=workers, bar=bar, desc=desc, threads_per_worker=threads_per_worker,
                   **executor_options)


# ---------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class SweepTask:
    """One (case, policy) evaluation: ``case`` is a case spec or a golden case name of operator ``op`` (a registry
    name; None: the default operator); ``policy`` a preset name or policy JSON dict; ``baseline`` ``"fp64"``
    (reference preset) or ``"oracle"``."""

    case: CaseLike
    policy: Union[str, Dict[str, Any]]
    baseline: str = "fp64"
    op: Optional[str] = None


def case_label(case: CaseLike) -> str:
    """A case's id: its spec's ``case_id`` or the golden name."""
    return str(case) if isinstance(case, str) else case.case_id


def golden_case_spec(name: str, op: OperatorLike = None):
    """The ``StoredCase`` of golden case ``name`` of operator ``op`` (``KeyError`` listing the names otherwise)."""
    op = _operator.get(op)
    stored = {spec.case_id: spec for spec in op.load("golden")()}
    if name not in stored:
        raise KeyError(f"unknown golden case {name!r} of {op.name}; known cases: {list(stored)}")
    return stored[name]


def load_case(case: CaseLike, op: OperatorLike = None):
    """``(inputs, device outputs or None)`` of a case spec (inputs drawn on the CPU) or a golden case name of
    operator ``op`` (its stored inputs and the upstream outputs, by output name)."""
    from .bundles import golden_outputs

    op = _operator.get(op)
    if isinstance(case, str):
        return op.draw(golden_case_spec(case, op), "cpu"), golden_outputs(case, op)
    return op.draw(case, "cpu"), None


# ---------------------------------------------------------------------------------------------- sweeps
def evaluate_task(task: SweepTask) -> Dict[str, Any]:
    """Evaluate one task (runs in a worker): per output, rel RMS / max rel / bit-equal fraction vs the baseline,
    and vs the device outputs when the case has them. A policy whose ``lp_dtype`` differs from the case's is run in
    the case's lp dtype and labelled ``name[float16]``. Returns plain JSON types."""
    from . import presets
    from .metrics import compare_outputs
    from .policy import RoundingPolicy

    op = _operator.get(task.op)
    policy = (RoundingPolicy.from_dict(task.policy) if isinstance(task.policy, dict)
              else presets.resolve(task.policy))
    label = task.policy if isinstance(task.policy, str) else policy.name
    start = time.monotonic()
    spec = golden_case_spec(task.case, op) if isinstance(task.case, str) else task.case
    inputs, device = load_case(task.case, op)
    lp = spec.dtype
    if policy.lp_dtype != lp:  # a float16 case: the same policy in float16
        policy = policy.replace(lp_dtype=lp)
        label = f"{label}[{lp}]"
    outputs = op.run_reference(inputs, policy)
    base = _baseline(op, inputs, task.baseline, lp)
    record: Dict[str, Any] = {"case": case_label(task.case), "policy": label, "operator": op.name,
                              "policy_json": policy.to_dict(), "baseline": task.baseline,
                              "vs_baseline": _clean(compare_outputs(outputs, base, op=op))}
    if device is not None:
        record["vs_device"] = _clean(compare_outputs(outputs, device, op=op))
    record["seconds"] = time.monotonic() - start
    return record


BASELINES = ("fp64", "oracle")


def _baseline(op: _operator.Operator, inputs: dict, baseline: str, lp: str):
    """The outputs the errors are measured against: the ``fp64`` preset in the case's lp dtype, or the oracle."""
    from . import presets
    from .bundles import outputs_of

    if baseline == "oracle":
        return outputs_of(op.run_oracle(inputs), op)  # oracles return a tensor (forward), a dict (stage 2), ...
    if baseline == "fp64":
        return op.run_reference(inputs, presets.get("fp64").replace(lp_dtype=lp))
    raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")


def _clean(metrics: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for name, values in metrics.items():
        if values is None:
            continue
        out[name] = {k: (None if isinstance(v, float) and v != v else v) for k, v in values.items()}
    return out


def default_output(op: OperatorLike = None) -> str:
    """The output a sweep table shows by default: the operator's first output along the tokens (stage 1's ``dz``,
    the forward's ``o``, stage 2's ``dq``), else its first output."""
    op = _operator.get(op)
    along_tokens = [s.name for s in op.outputs if s.sequence_axis is not None and s.sequence_axis[0] == "token"]
    return (along_tokens or list(op.output_names))[0]


@dataclass
class SweepResult:
    """Records of :func:`run_sweep`, one per (case, policy), in case-major order, of operator ``operator``."""

    records: List[Dict[str, Any]] = field(default_factory=list)
    operator: Optional[str] = None

    def __post_init__(self):
        self.operator = _operator.get(self.operator).name

    def pivot(self, output: str, metric: str = "rel_rms", against: str = "vs_baseline") -> Dict[str, Dict[str, Any]]:
        """``{case: {policy: value}}`` of one output's metric (``against``: vs_baseline or vs_device)."""
        table: Dict[str, Dict[str, Any]] = {}
        for r in self.records:
            value = r.get(against, {}).get(output, {}).get(metric)
            table.setdefault(r["case"], {})[r["policy"]] = value
        return table

    def to_dict(self) -> Dict[str, Any]:
        return {"operator": self.operator, "records": self.records}

    def save_json(self, path) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1)

    def to_markdown(self, output: Optional[str] = None, metric: str = "rel_rms", against: str = "vs_baseline") -> str:
        """Cases as rows, policies as columns, for one output (default :func:`default_output`)."""
        output = output or default_output(self.operator)
        table = self.pivot(output, metric, against)
        policies = list(dict.fromkeys(p for row in table.values() for p in row))
        lines = [f"{self.operator}: {output} {metric} ({against})", "", "| case | " + " | ".join(policies) + " |",
                 "|" + "---|" * (len(policies) + 1)]
        for case, row in table.items():
            cells = ["–" if row.get(p) is None else f"{row[p]:.3g}" for p in policies]
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def run_sweep(cases: Sequence[CaseLike], policies: Sequence[Union[str, Any]], baseline: str = "fp64",
              workers: Optional[int] = None, progress: bool = True, op: OperatorLike = None,
              executor: str = "process", address: Optional[str] = None,
              num_gpus: Optional[float] = None, connect_timeout: Optional[float] = None) -> SweepResult:
    """Evaluate every (case, policy) pair of operator ``op`` in parallel (see :func:`evaluate_task`).

    Args:
        cases: the operator's case specs and/or golden case names.
        policies: preset names, policy JSON paths or ``RoundingPolicy`` objects; each must define the operator
            (``PolicyUndefined`` naming it otherwise, before anything runs).
        baseline (str): ``"fp64"`` or ``"oracle"``.
        workers (int, optional): workers (default: the CPU count; 1: in-process).
        progress (bool): progress bar on stderr.
        op (str | Operator, optional): the operator (default: the registry's default operator).
        executor (str): how the tasks are spread (:data:`EXECUTORS`: ``"process"``, ``"ray"``).
        address (str, optional), num_gpus (float, optional): Ray only (docs/sweeps.md): the cluster to use (None: a
            local instance for this call) and the GPUs each task reserves.
        connect_timeout (float, optional): Ray only: seconds to wait for a TCP connection to ``address`` before
            giving up (:func:`check_ray_address`; default :data:`RAY_CONNECT_TIMEOUT_S`).

    Returns:
        SweepResult
    """
    from . import presets
    from .policy import RoundingPolicy

    op = _operator.get(op)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    for policy in policies:
        presets.resolve(policy).section(op.name)  # PolicyUndefined names the policy and the operator
    tasks = [SweepTask(case, p.to_dict() if isinstance(p, RoundingPolicy) else p, baseline, op.name)
             for case in cases for p in policies]
    options = {k: v for k, v in (("address", address), ("num_gpus", num_gpus),
                                 ("connect_timeout", connect_timeout)) if v is not None}
    records = parallel_map(evaluate_task, tasks, workers=workers, progress=progress, desc=f"sweep {op.name}",
                           executor=executor, **options)
    return SweepResult(records, operator=op.name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``mimo-numerics sweep`` (also ``python -m mimo_numerics.sweep``): a grid and/or the golden cases × policies of
    one operator, in parallel."""
    import argparse

    from . import presets
    from .ops import registry

    parser = argparse.ArgumentParser(prog="mimo-numerics sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=registry.OPERATORS, default=registry.DEFAULT_OPERATOR,
                        help=f"the operator (default {registry.DEFAULT_OPERATOR})")
    parser.add_argument("--grid", action="append", default=[],
                        help="a case grid of the operator (op.cases; repeatable; default smoke)")
    parser.add_argument("--golden", action="store_true", help="also the golden H200 cases (compared to the device)")
    parser.add_argument("--policies", default=None,
                        help=f"comma-separated presets (default: those of {','.join(DEFAULT_POLICIES)} that define "
                             "the operator)")
    parser.add_argument("--baseline", default="fp64", choices=BASELINES)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPU count)")
    parser.add_argument("--executor", default="process", choices=tuple(EXECUTORS))
    parser.add_argument("--address", default=None, help="Ray cluster address (executor ray; default: a local "
                                                        "instance)")
    parser.add_argument("--num-gpus", type=float, default=None, help="GPUs per Ray task (executor ray)")
    parser.add_argument("--connect-timeout", type=float, default=None, metavar="SECONDS",
                        help=f"executor ray: give up when --address accepts no TCP connection within SECONDS "
                             f"(default {RAY_CONNECT_TIMEOUT_S:g})")
    parser.add_argument("--output", default=None, help="output shown in the printed table (default: the first "
                                                       "output along the tokens)")
    parser.add_argument("--out", default=None, help="write all records as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    op = _operator.get(args.op)
    try:
        specs: List[CaseLike] = [spec for name in (args.grid or ([] if args.golden else ["smoke"]))
                                 for spec in op.cases(name)]
    except ValueError as exc:
        parser.error(str(exc))
    if args.golden:
        specs += [spec.case_id for spec in op.load("golden")()]
    if args.policies is None:
        policies = [p for p in DEFAULT_POLICIES if presets.get(p).defines(op.name)]
    else:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.output is not None and args.output not in op.output_names:
        parser.error(f"--output {args.output}: not an output of {op.name}; outputs: {', '.join(op.output_names)}")
    if args.executor != "ray" and (args.address is not None or args.num_gpus is not None
                                   or args.connect_timeout is not None):
        parser.error("--address, --num-gpus and --connect-timeout apply to --executor ray only")
    if args.connect_timeout is not None and not args.connect_timeout > 0:
        parser.error(f"--connect-timeout must be > 0 seconds, got {args.connect_timeout:g}")
    result = run_sweep(specs, policies, args.baseline, args.workers, progress=not args.quiet, op=op,
                       executor=args.executor, address=args.address, num_gpus=args.num_gpus,
                       connect_timeout=args.connect_timeout)
    if args.out:
        result.save_json(args.out)
    print(result.to_markdown(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
