"""Facts about the machine a gate run used, for the evidence: GPUs, driver, CUDA, library versions, host.

Bounds hold for one kind of device and one software stack, so a reviewer needs to see both next to the
verdict. The GPU list (name, PCI bus id, UUID, memory) comes from ``torch.cuda`` device properties; the
NVIDIA driver version from ``/proc/driver/nvidia/version``, the kernel module's own report, because torch
exposes only the CUDA runtime version. Host name, user and home folder are collected so the evidence can
redact them wherever they appear; the statement keeps only placeholders.
"""

from __future__ import annotations

import getpass
import platform
import re
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

DRIVER_FILE = Path("/proc/driver/nvidia/version")


def _version(distribution: str) -> str | None:
    """The installed version of ``distribution``; None where it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _user() -> str | None:
    """The login name; None in a container whose uid has no passwd entry and no USER/LOGNAME."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


def driver_version() -> str | None:
    """The NVIDIA kernel driver version (e.g. 550.54.15); None without the NVIDIA kernel module."""
    if not DRIVER_FILE.is_file():
        return None
    match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)", DRIVER_FILE.read_text())
    return match.group(1) if match else None


def gpus() -> list[dict]:
    """Every visible CUDA device: index, name, PCI bus id (domain:bus:device.function), UUID, memory, capability."""
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": props.name,
                "pci_bus_id": f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0",
                "uuid": str(props.uuid),
                "memory_bytes": props.total_memory,
                "compute_capability": f"{props.major}.{props.minor}",
            }
        )
    return found


def collect() -> dict:
    """The environment record of the evidence (``hostname``, ``user``, ``home`` are redacted there)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        # The CPU kernels ATen dispatches to (default, avx2, avx512, ...): bf16 bits follow them.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver_version(),
        "triton": _version("triton"),
        "diffusers": _version("diffusers"),
        "gpus": gpus(),
        "hostname": socket.gethostname(),
        "user": _user(),
        "home": str(Path.home()),
    }
