"""The machine the estimate compares with: whether CUDA runs here, and the first visible
GPU's memory and name, read without starting a CUDA context in the calling process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata


def cpu_only_torch() -> bool:
    """Whether the installed torch is a CPU-only build ("2.13.0+cpu"), told from its
    version without importing it: a check on a CPU machine then spends no 2 CPU-seconds
    importing torch only to hear that CUDA is not there."""
    if "torch" in sys.modules:
        return False  # imported already: ask it
    try:
        return metadata.version("torch").endswith("+cpu")
    except metadata.PackageNotFoundError:
        return False


def cuda_available() -> bool:
    if cpu_only_torch():
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install: no GPU to run on
        return False


def detect_gpu() -> tuple[int, str] | None:
    """(total bytes, name) of the first visible GPU, or None without one. Read through
    nvidia-smi rather than torch.cuda, which would start a CUDA context (hundreds of MB
    of GPU memory) in the web server for the rest of its life."""
    if cpu_only_torch():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        if torch.cuda.is_initialized():  # a process that already has its context
            props = torch.cuda.get_device_properties(0)
            return int(props.total_memory), str(props.name)
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPU to compare with
        return None
    return _nvidia_smi_first_gpu()


def _nvidia_smi_first_gpu() -> tuple[int, str] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    command = [smi, "--query-gpu=memory.total,name", "--format=csv,noheader,nounits",
               "-i", visible or "0"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip().splitlines()
        mib, name = out[0].split(",", 1)
        return int(float(mib)) * 1024 ** 2, name.strip()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
