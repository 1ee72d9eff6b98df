"""Where a TorchNetwork lives: resolving a device spec, placing a module, the device a file was saved from.

torch is imported lazily (``import psrv.nn`` works without it)."""

from __future__ import annotations

import logging
from typing import Any

from psrv.nn.errors import ConfigError

log = logging.getLogger("psrv.nn.torch_adapter")


def import_torch() -> Any:
    """torch, or a ConfigError saying how to install it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigError("TorchNetwork needs PyTorch: pip install 'psrv[torch]'") from exc
    return torch


def resolve_device(spec: Any) -> Any:
    """A torch.device for "cpu", "cuda", "cuda:1", "auto" or a torch.device; a clear ConfigError for a
    device that does not exist here. "auto": the current CUDA device when CUDA is available, else the CPU.
    """
    torch = import_torch()
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        chosen = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        log.info("device='auto': using %s", chosen)
        return chosen
    try:
        device = spec if isinstance(spec, torch.device) else torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device: expected 'cpu', 'cuda', 'cuda:<index>' or 'auto', got {spec!r}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r}: CUDA is not available here (torch.cuda.is_available() is "
                              "False); use device='auto' (CUDA when present, else CPU) or 'cpu'")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {spec!r}: this host has {torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", index)
    if device.type != "cpu":
        log.warning("device %s is neither CPU nor CUDA: psrv has not been tested there", device)
    return device


def place_module(module: Any, device: Any) -> tuple[Any, Any]:
    """(device, parameter dtype) of a module, moved to ``device`` when one is asked for (never otherwise)."""
    torch = import_torch()
    tensors = [*module.parameters(), *module.buffers()]
    if device is None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ConfigError(
                f"the module's tensors are on several devices {sorted(map(str, devices))}; TorchNetwork "
                "trains on one: pass device='cuda:0' (or 'cpu') to move it there")
        target = devices.pop() if devices else torch.device("cpu")
    else:
        target = resolve_device(device)
        module.to(target)
    dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
    if len(dtypes) > 1:
        raise ConfigError(f"the module's trainable parameters mix dtypes {sorted(map(str, dtypes))}; "
                          "TorchNetwork keeps one flat vector: make them all float32 (or float64)")
    dtype = dtypes.pop() if dtypes else torch.float32
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(
            f"the module's parameters are {dtype}; TorchNetwork trains float32 or float64 parameters (the "
            "update and the wire are float32): keep the parameters float32 and use torch.autocast inside "
            "forward for mixed precision")
    return target, dtype


def saved_device(saved: str, source: str) -> Any:
    """The device a file was saved from when it exists here, else the CPU (logged)."""
    torch = import_torch()
    device = torch.device(saved)
    if device.type == "cuda" and not (torch.cuda.is_available()
                                      and (device.index or 0) < torch.cuda.device_count()):
        log.warning("%s: saved from %s, which this host does not have; loading on the CPU", source, saved)
        return torch.device("cpu")
    return device


__all__ = ["import_torch", "place_module", "resolve_device", "saved_device"]
