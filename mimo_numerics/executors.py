"""Where the items of a sweep run: this process, a pool of processes on this machine, or Ray tasks.

:func:`map_items` is the one entry point: ``executor="process"`` (the default) is
:func:`mimo_numerics.sweep.parallel_map` (spawned processes, one torch thread each); ``executor="ray"`` submits one
Ray task per item to a local Ray instance (started here and shut down afterwards) or to an existing cluster
(``address="auto"`` on a cluster node, ``"ray://head:10001"`` through Ray Client: ``pip install "ray[client]"``),
with ``num_gpus`` per task where asked. Both keep the input order, show the same progress bar, and run each item
with one torch intra-op thread, so the results are the same bits whichever executor ran them (a test checks it).
Ray is an optional extra (``pip install "mimo_numerics[ray]"``); asking for it without Ray installed raises an
error that says so.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional

EXECUTORS = ("process", "ray")


def _one_thread(fn: Callable[[Any], Any], item: Any) -> Any:
    """``fn(item)`` with one torch intra-op thread (as the process pool's workers run)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(item)
    finally:
        torch.set_num_threads(saved)


def ray_map(fn: Callable[[Any], Any], items: Iterable[Any], *, address: Optional[str] = None,
            num_gpus: Optional[float] = None, num_cpus: Optional[int] = None, progress: bool = True,
            desc: str = "sweep") -> List[Any]:
    """``[fn(item) for item in items]`` as Ray tasks, in input order.

    Args:
        fn (callable): a module-level (picklable) function. items (iterable): picklable arguments.
        address (str, optional): a Ray cluster to connect to (``"auto"``, ``"ray://host:10001"``); None starts a
            local instance for this call (with ``num_cpus`` CPUs, default all) and shuts it down at the end.
        num_gpus (float, optional): GPUs each task reserves (e.g. 1 for a device sweep on a GPU cluster).
        num_cpus (int, optional): CPUs of the local instance (ignored with ``address``).
        progress (bool), desc (str): the progress bar (``sweep.progress_bar``).

    Raises:
        ImportError: Ray is not installed (the message names the extra).
        RuntimeError: an item failed (naming it; the task's exception is the cause).
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'mimo_numerics[ray]' (or 'ray[client]' for a "
                          "ray:// address)") from exc
    from .sweep import progress_bar

    items = list(items)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    try:
        task = ray.remote(num_cpus=1, num_gpus=num_gpus or 0)(_one_thread)
        fn_ref = ray.put(fn)
        pending = {task.remote(fn_ref, item): i for i, item in enumerate(items)}
        results: List[Any] = [None] * len(items)
        with progress_bar(len(items), desc, enabled=progress) as bar:
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


def map_items(fn: Callable[[Any], Any], items: Iterable[Any], *, executor: str = "process",
              workers: Optional[int] = None, address: Optional[str] = None, num_gpus: Optional[float] = None,
              progress: bool = True, desc: str = "sweep") -> List[Any]:
    """``[fn(item) for item in items]`` on ``executor`` (module docstring), in input order.

    Args:
        executor (str): ``"process"`` (default) or ``"ray"``.
        workers (int, optional): processes of the pool, or CPUs of a local Ray instance.
        address, num_gpus: Ray only (see :func:`ray_map`); giving them with ``executor="process"`` is an error.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if executor == "process":
        if address is not None or num_gpus is not None:
            raise ValueError("address and num_gpus apply to executor='ray' only")
        from .sweep import parallel_map

        return parallel_map(fn, items, workers=workers, progress=progress, desc=desc)
    return ray_map(fn, items, address=address, num_gpus=num_gpus, num_cpus=workers, progress=progress, desc=desc)
