"""Where a result came from: package versions and device names, recorded in every result bundle.

Nothing here changes numerics; every helper is best-effort and returns ``None`` (or leaves a key out) rather than
raising when something cannot be determined. Versions come from package metadata (``importlib.metadata``) so that
asking for them does not import heavy modules such as ``triton`` or ``tilelang``.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import sys
from importlib import metadata
from typing import Dict, Optional, Union

import torch

from .provenance import cpu_model

#: Distributions whose versions are recorded when installed: key in the result -> distribution names tried in order.
DISTRIBUTIONS = {
    "mimo_numerics": ("mimo_numerics", "mimo-numerics"),
    "numpy": ("numpy",),
    "triton": ("triton",),
    "triton_ascend": ("triton-ascend", "triton_ascend"),
    "torch_npu": ("torch_npu", "torch-npu"),
    "tilelang": ("tilelang",),
    "mamba_ssm": ("mamba_ssm", "mamba-ssm"),
    "apache_tvm_ffi": ("apache-tvm-ffi",),
}

#: Where the CANN toolkit is looked for when ``ASCEND_TOOLKIT_HOME`` / ``ASCEND_HOME_PATH`` are not set.
DEFAULT_CANN_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/latest")


def distribution_version(*names: str) -> Optional[str]:
    """The installed version of the first of ``names`` that is installed, or None."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken installation must not break a run  # pragma: no cover
            continue
    return None


def tilelang_version() -> Optional[str]:
    """The TileLang version: from its package metadata, else from an already imported ``tilelang`` module (a source
    checkout on ``sys.path`` has no metadata); None when neither is there. Never imports ``tilelang``."""
    version = distribution_version(*DISTRIBUTIONS["tilelang"])
    if version is None:
        module = sys.modules.get("tilelang")
        version = getattr(module, "__version__", None) if module is not None else None
    return None if version is None else str(version)


def cann_version() -> Optional[str]:
    """The Ascend CANN toolkit version, read from its install-info files; None when no toolkit is found."""
    roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")] + list(DEFAULT_CANN_ROOTS)
    for root in roots:
        if not root or not os.path.isdir(root):
            continue
        candidates = sorted(glob.glob(os.path.join(root, "*", "ascend_toolkit_install.info")))
        candidates += [os.path.join(root, "version.cfg"), os.path.join(root, "version.info")]
        for path in candidates:
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            match = re.search(r"^\s*(?:version|Version)\s*=\s*\[?([^\]\s:]+)", text, flags=re.MULTILINE)
            if match:
                return match.group(1)
    return None


def versions() -> Dict[str, str]:
    """Versions of Python, torch (and its CUDA), and every package of :data:`DISTRIBUTIONS` that is installed.

    Returns:
        dict: e.g. ``{"python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "triton": "3.6.0", ...}``;
        packages that are not installed are left out (``tilelang`` by :func:`tilelang_version`). ``cann`` is present
        when an Ascend toolkit is found.
    """
    out: Dict[str, str] = {"python": platform.python_version(), "torch": torch.__version__}
    if getattr(torch.version, "cuda", None):
        out["torch_cuda"] = str(torch.version.cuda)
    for key, names in DISTRIBUTIONS.items():
        version = tilelang_version() if key == "tilelang" else distribution_version(*names)
        if version is not None:
            out[key] = version
    if "mimo_numerics" not in out:
        from . import __version__

        out["mimo_numerics"] = __version__
    cann = cann_version()
    if cann is not None:
        out["cann"] = cann
    return out




def device_name(device: Union[str, torch.device]) -> str:
    """A human-readable name of ``device``.

    Examples: ``"NVIDIA H200 (sm_90)"``, ``"Ascend910B3"``, ``"cpu: AMD EPYC 7B13"``. Never raises: when the name
    cannot be read the device string itself is returned.
    """
    dev = torch.device(device)
    try:
        if dev.type == "cpu":
            return f"cpu: {cpu_model()}"
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(index)
            return f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"
        if dev.type == "npu":
            npu = getattr(torch, "npu", None)
            index = dev.index if dev.index is not None else npu.current_device()
            return str(npu.get_device_name(index))
    except Exception:
        pass
    return str(dev)


def environment(device: Union[str, torch.device, None] = None) -> Dict[str, object]:
    """``{"device": str, "device_name": str, "host": platform, "versions": versions()}`` (device keys only when
    ``device`` is given)."""
    out: Dict[str, object] = {"platform": f"{sys.platform}-{platform.machine()}", "versions": versions()}
    if device is not None:
        out["device"] = str(torch.device(device))
        out["device_name"] = device_name(device)
    return out
