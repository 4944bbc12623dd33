"""The provenance header of every generated report: what ran, at which commit, on which machine.

Every report generator (``scripts/``, ``benchmarks/``, ``golden/``, the report-writing parts of the package) takes
its header from :func:`collect` and :func:`markdown_header` (or puts :func:`collect`'s dict into a JSON report), so
that a reader of any file under ``reports/`` can tell which code made it, how to make it again, and where.

Recorded (:func:`collect`):

* ``commit``: ``git rev-parse --short HEAD`` of the checkout the package was imported from;
* ``describe``: ``git describe --always --dirty`` (``-dirty`` = any tracked file differs from the commit);
* ``source_clean``: True when nothing outside ``reports/`` differs from the commit (tracked or untracked, ignored
  files excepted). Regenerating several reports one after the other changes ``reports/`` only, so a report made
  from a clean commit says so even when an earlier report of the same run was already rewritten;
* ``command``: the command line, the script given relative to the repository root;
* ``versions``: :func:`mimo_numerics.envinfo.versions` (Python, torch, triton, ...);
* ``machine``: CPU model, logical cores, platform, and the GPU name(s) when CUDA is available.

One-off measurements (``scripts/measure_*.py``) print Markdown; :func:`record_measurement` echoes what they print and
writes it, under the header, to ``reports/measurements/<name>.md`` and, with the provenance, to ``<name>.json``, so
that ``mimo_numerics/tolerances.py`` and ``docs/`` cite a file instead of hand-copied figures.

Outside a git checkout (an installed wheel) ``commit`` and ``describe`` are ``"unknown"`` and ``source_clean`` is
None. Nothing here changes a numerical result; it only reads git, ``/proc/cpuinfo`` and package metadata.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

#: The repository root of a source checkout (the folder holding ``mimo_numerics/``).
ROOT = Path(__file__).resolve().parent.parent
#: Where :func:`record_measurement` writes by default.
MEASUREMENTS = ROOT / "reports" / "measurements"
#: Changes under these top-level folders do not make the source unclean (they are the reports being regenerated).
REPORT_DIRS = ("reports",)

__all__ = ["MEASUREMENTS", "ROOT", "collect", "command_line", "export_package", "git", "machine",
           "markdown_header", "record_measurement", "source_state"]


def git(*args: str, root: Path = ROOT, strip: bool = True) -> Optional[str]:
    """``git args`` in ``root``; its stdout (stripped unless ``strip`` is False), or None when git fails or is not
    installed."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() if strip else out.stdout


def source_state(root: Path = ROOT) -> Dict[str, object]:
    """``{"commit", "describe", "source_clean", "changed"}``: ``changed`` lists the paths outside ``reports/`` that
    differ from the commit (at most 20)."""
    commit = git("rev-parse", "--short", "HEAD", root=root)
    if commit is None:
        return {"commit": "unknown", "describe": "unknown", "source_clean": None, "changed": []}
    describe = git("describe", "--always", "--dirty", root=root) or commit
    status = git("status", "--porcelain", "--untracked-files=all", root=root, strip=False) or ""
    changed = []
    for line in status.splitlines():
        path = line[3:].split(" -> ")[-1].strip().strip('"')
        if path and path.split("/", 1)[0] not in REPORT_DIRS:
            changed.append(path)
    return {"commit": commit, "describe": describe, "source_clean": not changed, "changed": changed[:20]}


def export_package(rev: str, into: Path, root: Path = ROOT) -> Path:
    """Extract ``mimo_numerics/`` of commit ``rev`` under ``into`` (``git archive``), and ``kernels/`` where the
    commit has it (``mimo_numerics/kernels`` links there), so that a worker process with ``PYTHONPATH=into`` imports
    that commit's package with its kernels; returns ``into``.

    Raises:
        ValueError: ``rev`` is not a commit of the checkout at ``root``.
    """
    if not isinstance(rev, str) or git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", root=root) is None:
        raise ValueError(f"rev must name a commit of the checkout at {root}, got {rev!r}")
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "src.tar"
    with open(archive, "wb") as fh:
        parts = ["mimo_numerics"] + (["kernels"] if git("cat-file", "-e", f"{rev}:kernels", root=root) is not None
                                     else [])
        subprocess.run(["git", "archive", rev, *parts], cwd=root, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into)
    return into


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that is running, as one would type it in the repository root: ``python scripts/x.py --a 1``
    (``python -m mod ...`` for a module run with ``-m``)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    first = argv[0]
    try:
        first = str(Path(first).resolve().relative_to(ROOT))
    except (ValueError, OSError):
        pass
    if first.endswith("__main__.py") or first == "-m":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            name = spec.name[:-len(".__main__")] if spec.name.endswith(".__main__") else spec.name
            return " ".join(["python", "-m", name] + [shlex.quote(a) for a in argv[1:]])
    if first.endswith(".py"):
        return " ".join(["python", first] + [shlex.quote(a) for a in argv[1:]])
    return " ".join([Path(first).name] + [shlex.quote(a) for a in argv[1:]])


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpus() -> List[str]:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811
        except ImportError:  # pragma: no cover
            return []
    try:
        if not torch.cuda.is_available():
            return []
        from .envinfo import device_name

        return [device_name(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not break a report  # pragma: no cover
        return []


def machine() -> Dict[str, object]:
    """``{"cpu": model name, "cores": logical cores, "platform": "linux-x86_64", "gpus": [names]}``."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": f"{sys.platform}-{platform.machine()}",
            "gpus": _gpus()}


def collect(argv: Optional[Sequence[str]] = None, command: Optional[str] = None) -> Dict[str, object]:
    """The provenance of the running report generator (module docstring); ``command`` overrides the command line
    read from ``argv`` (default ``sys.argv``)."""
    from .envinfo import versions

    out: Dict[str, object] = dict(source_state())
    out["command"] = command if command is not None else command_line(argv)
    out["versions"] = versions()
    out["machine"] = machine()
    return out


def _versions_text(versions: Dict[str, str]) -> str:
    keys = ("mimo_numerics", "python", "torch", "numpy", "triton", "tilelang", "mamba_ssm")
    return ", ".join(f"{k} {versions[k]}" for k in keys if k in versions)


def markdown_header(prov: Optional[Dict[str, object]] = None, **collect_kw) -> str:
    """The provenance as one Markdown paragraph (no trailing newline), e.g.

    ``Generated by `python scripts/x.py` at commit `abc1234` (`git describe --always --dirty`: `abc1234`; source
    tree clean) on Intel(R) Xeon(R) ... (2 cores), no GPU; mimo_numerics 0.1.0, python 3.12.3, torch 2.13.0.``
    """
    prov = collect(**collect_kw) if prov is None else prov
    clean = prov.get("source_clean")
    if clean is None:
        state = "not a git checkout"
    elif clean:
        state = "source tree clean"
    else:
        changed = list(prov.get("changed") or [])
        state = "source tree NOT clean: " + ", ".join(f"`{p}`" for p in changed[:5]) + (
            ", ..." if len(changed) > 5 else "")
    mach = prov.get("machine") or {}
    gpus = mach.get("gpus") or []
    gpu = ", ".join(gpus) if gpus else "no GPU"
    return (f"Generated by `{prov.get('command')}` at commit `{prov.get('commit')}` (`git describe --always "
            f"--dirty`: `{prov.get('describe')}`; {state}) on {mach.get('cpu')} ({mach.get('cores')} cores), {gpu}; "
            f"{_versions_text(prov.get('versions') or {})}.")



class _Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and keeps a copy."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def record_measurement(name: str, title: str, out_dir: Optional[Path] = MEASUREMENTS,
                       data: Optional[Dict[str, object]] = None) -> Iterator[Dict[str, object]]:
    """Echo what the block prints to stdout and, when it ends without an exception, write it to
    ``out_dir/<name>.md`` (``# title``, the provenance header, the printed Markdown) and ``out_dir/<name>.json``
    (``{"provenance", "title", "wall_s", "data", "stdout"}``; ``data``: the yielded dict, which the block may fill
    with its figures). ``out_dir=None`` writes nothing (the block's output is only printed).

        with provenance.record_measurement("measure_x", "What x measures") as data:
            print(table)
            data["worst"] = worst
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name must be a plain file stem, got {name!r}")
    prov = collect()
    figures: Dict[str, object] = dict(data or {})
    tee = _Tee(sys.stdout)
    start = time.perf_counter()
    with contextlib.redirect_stdout(tee):
        yield figures
    wall = time.perf_counter() - start
    if out_dir is None:
        return
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    printed = tee.copy.getvalue()
    header = markdown_header(prov) + f" Wall time {wall:.0f} s (an upper bound on a shared machine)."
    (out_dir / f"{name}.md").write_text(f"# {title}\n\n{header}\n\n{printed.rstrip()}\n", encoding="utf-8")
    record = {"provenance": prov, "title": title, "wall_s": round(wall, 1), "data": figures, "stdout": printed}
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {out_dir / name}.md and .json", file=sys.stderr)
