"""Devices for the accuracy gates (:mod:`mimo_numerics.testing`): whether torch can run on a device here.

Checked once, before any case runs, by the CLI, the pytest plugin and :func:`mimo_numerics.testing.check`.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["DeviceUnavailableError", "check_device"]


class DeviceUnavailableError(ValueError):
    """``device`` cannot run anything here (unknown type, no such device, backend package missing).

    Attributes:
        device (str): the device as given. reason (str): what is wrong. hint (str): what to do about it.
    """

    def __init__(self, device: str, reason: str, hint: str):
        super().__init__(f"device {device!r}: {reason} (hint: {hint})")
        self.device, self.reason, self.hint = device, reason, hint


def _device_index_error(text: str, dev: torch.device, count: int) -> Optional[DeviceUnavailableError]:
    if dev.index is None or dev.index < count:
        return None
    return DeviceUnavailableError(text, f"torch sees {count} {dev.type} device(s) here, so index {dev.index} does "
                                        f"not exist", f"use {dev.type}:0 .. {dev.type}:{count - 1}")


def check_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a ``torch.device`` when torch can run on it here; :class:`DeviceUnavailableError` otherwise.

    Checked once, before any case runs, by the CLI, the pytest plugin and :func:`check`, so an
    absent CUDA device or a missing ``torch_npu`` is one clear message instead of a torch traceback per case.
    """
    text = str(device)
    if text.split(":")[0] == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device type with torch)
        except ImportError:
            raise DeviceUnavailableError(text, "torch_npu is not installed (torch knows npu devices only through "
                                               "it)", "on an Ascend machine: pip install 'mimo_numerics[npu]'") \
                from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceUnavailableError(text, "not a torch device", "use cpu, cuda, cuda:N or npu") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = ("this torch build has no CUDA support" if torch.version.cuda is None and
                     getattr(torch.version, "hip", None) is None else "torch.cuda.is_available() is False")
            raise DeviceUnavailableError(text, f"torch has no CUDA device here ({built}; torch {torch.__version__})",
                                         "run on cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch")
        error = _device_index_error(text, dev, torch.cuda.device_count())
        if error is not None:
            raise error
        return dev
    if dev.type == "npu":
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            raise DeviceUnavailableError(text, "torch_npu is installed but sees no NPU here",
                                         "run on cpu, or on an Ascend machine with its driver loaded")
        error = _device_index_error(text, dev, npu.device_count())
        if error is not None:
            raise error
        return dev
    if dev.type == "meta":
        raise DeviceUnavailableError(text, "meta tensors hold no values, so nothing can be compared",
                                     "use cpu, cuda or npu")
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DeviceUnavailableError(text, f"torch cannot allocate on {dev.type} here ({first})",
                                     "use cpu, cuda or npu") from None
    return dev
