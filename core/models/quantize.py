"""A quantized frozen base: the denoiser's linear weights stored in 8 or 4 bits through a
maintained library (torchao for int8 and fp8 weight-only, bitsandbytes for nf4), so
Flux-sized models train LoRA on a 24 GB card. LoRA layers (peft) train on top in fp32;
the saved LoRA holds only the adapter and loads on the unquantized model.

`model.quantize`: "none" | "int8" | "fp8" | "nf4". `quantize_problems` refuses a choice
this machine cannot run, for `--stage check`; `quantizable` says which modules are
quantized, and the memory estimate counts with the same rule.

Nothing here imports torch, torchao or bitsandbytes at module level: `--stage check` asks
about a scheme without loading any of them (importing torchao prints warnings about its
CUDA-only extensions on a CPU machine).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from core.problems import Problem, error

QUANTIZED_BYTES_PER_WEIGHT = {"none": None, "int8": 1.0, "fp8": 1.0, "nf4": 0.5}
SCALE_BYTES = {"int8": 2, "fp8": 2, "nf4": 4}  # bf16 per output row; fp32 per 64 weights
FP8_MIN_CAPABILITY = (8, 9)  # Ada (RTX 40xx, L4, L40S) and Hopper (H100) have fp8 units
# torchao's weight-only layers (0.18's Int8Tensor, Float8Tensor) multiply by a dequantized
# copy of their weight, which autograd keeps for the backward wherever the layer's input
# needs a gradient: past the first LoRA layer, every layer. With gradient checkpointing
# only the block being recomputed holds them (an H200's Flux int8 step held 0.73 GiB over
# its estimate without them, and a double block's are 0.63 GiB); without it, every
# quantized weight has a copy in the compute dtype. bitsandbytes' nf4 dequantizes again
# in the backward. The memory estimate counts them, and the check warns without
# checkpointing.
DEQUANTIZED_FOR_BACKWARD = ("int8", "fp8")


def quantizable(name: str, module: Any) -> bool:
    """Whether the denoiser module `name` gets quantized: every nn.Linear (torchao's
    int8/fp8 weight-only and bitsandbytes' nf4 take any shape, the tiny test models'
    32-wide layers included). Embeddings, norms and convolutions stay as they are: they
    hold a small share of the weights of the transformer and UNet families."""
    import torch

    return isinstance(module, torch.nn.Linear)


def frozen_bytes(size: Any, scheme: str, wbytes: int) -> int:
    """What frozen weights hold as stored (the memory estimate's sizes: a whole denoiser,
    or one of its blocks): the weights `quantizable` picks in 8 or 4 bits plus their
    scales when `scheme` quantizes, everything else at `wbytes` a weight."""
    import math

    per_weight = QUANTIZED_BYTES_PER_WEIGHT.get(scheme)
    if per_weight is None:
        return size.floats * wbytes + size.other_bytes
    blocks = size.quantizable_blocks if scheme == "nf4" else size.quantizable_rows
    return ((size.floats - size.quantizable) * wbytes + math.ceil(size.quantizable * per_weight)
            + blocks * SCALE_BYTES[scheme] + size.other_bytes)


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _cuda_devices() -> list[tuple[str, tuple[int, int]]]:
    """(name, compute capability) of each visible CUDA GPU; empty without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())]


def _fp8_problems(where: str) -> list[Problem]:
    devices = _cuda_devices()
    if not devices:
        return [error(where, "fp8 needs an NVIDIA GPU with fp8 support (compute capability "
                             "8.9+: RTX 40xx, L4, L40S, H100) and no CUDA GPU was found; "
                             "use \"int8\" (any GPU) instead")]
    old = [(name, cap) for name, cap in devices if cap < FP8_MIN_CAPABILITY]
    if old:
        name, (major, minor) = old[0]
        return [error(where, f"fp8 needs a GPU with compute capability 8.9+ (RTX 40xx, L4, "
                             f"L40S, H100); found {name} (compute capability {major}.{minor}); "
                             "use \"int8\" instead, which runs on any GPU")]
    return []


def quantize_problems(scheme: str, where: str = "model.quantize") -> list[Problem]:
    """Why this machine cannot run `scheme` (empty when it can)."""
    if scheme in ("int8", "fp8") and not _installed("torchao"):
        return [error(where, f"{scheme} needs torchao: pip install torchao (it is in "
                             "requirements.txt), or set model.quantize = \"none\"")]
    if scheme == "fp8":
        return _fp8_problems(where)
    if scheme == "nf4":
        if not _installed("bitsandbytes"):
            return [error(where, "nf4 needs bitsandbytes: pip install bitsandbytes (CUDA "
                                 "only), or use \"int8\"")]
        if not _cuda_devices():
            return [error(where, "nf4 (bitsandbytes) runs only on a CUDA GPU and none was "
                                 "found; use \"int8\", which also runs on the CPU")]
    return []


def quantize_frozen(module: Any, scheme: str, device: Any) -> None:
    """Quantize `module`'s quantizable layers in place, onto `device`: each layer moves
    from the CPU and is quantized there on its own, so the whole unquantized model never
    sits on the GPU. The module is left on `device` for every scheme, "none" included.
    Call it before peft's add_adapter: peft then wraps the quantized layers."""
    if scheme == "none":
        module.to(device)
    elif scheme in ("int8", "fp8"):
        _quantize_torchao(module, scheme, device)
    elif scheme == "nf4":
        _quantize_nf4(module, device)
    else:
        raise ValueError(f"unknown model.quantize {scheme!r}; use none, int8, fp8 or nf4")


def quantized_layers(module: Any) -> dict[str, Any]:
    """What `module` holds now, read from its weights (not from the config): of its
    quantizable layers (`linear_layers`), how many hold a quantized weight (`quantized`:
    a torchao tensor subclass or bitsandbytes' Params4bit), and how many of each weight
    type (`weight_types`). The trainer records it, so a run shows what it trained on."""
    import torch

    types: dict[str, int] = {}
    linear = 0
    for name, child in module.named_modules():
        if quantizable(name, child):
            linear += 1
            kind = type(child.weight)
            if kind not in (torch.nn.Parameter, torch.Tensor):
                types[kind.__name__] = types.get(kind.__name__, 0) + 1
    return {"linear_layers": linear, "quantized": sum(types.values()),
            "weight_types": dict(sorted(types.items()))}


def _quantize_torchao(module: Any, scheme: str, device: Any) -> None:
    """torchao weight-only: int8 or float8_e4m3 weights with one scale per output row,
    dequantized in the forward; peft wraps them as TorchaoLoraLinear."""
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    # Nothing here compiles; leave torch inductor's process-wide settings alone.
    config = (Int8WeightOnlyConfig(set_inductor_config=False) if scheme == "int8"
              else Float8WeightOnlyConfig(set_inductor_config=False))
    # `device`: torchao moves each matched layer there just before quantizing it and
    # every parent after its children, so the model ends up on `device` entire.
    quantize_(module, config, filter_fn=lambda child, name: quantizable(name, child),
              device=device)


def _quantize_nf4(module: Any, device: Any) -> None:
    """bitsandbytes NF4: each quantizable nn.Linear becomes a bnb Linear4bit computing in
    the module's dtype; its weight is quantized as it moves to the GPU (bitsandbytes
    quantizes in Params4bit.to(cuda)), one layer at a time."""
    import torch

    if torch.device(device).type != "cuda":
        raise ValueError("model.quantize = \"nf4\" (bitsandbytes) needs a CUDA GPU; "
                         "use \"int8\" on this machine")
    import bitsandbytes as bnb

    compute_dtype = next(module.parameters()).dtype
    targets = [(name, child) for name, child in module.named_modules()
               if name and quantizable(name, child)]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, _linear4bit(bnb, linear, compute_dtype).to(device))
    module.to(device)
    # peft wraps a Linear4bit in its own 4-bit LoRA layer only when the model says it was
    # loaded in 4 bit (the flag transformers and diffusers set for bitsandbytes models).
    module.is_loaded_in_4bit = True


def _linear4bit(bnb: Any, linear: Any, compute_dtype: Any) -> Any:
    """A bnb Linear4bit (nf4) holding `linear`'s weights, not yet quantized (on the CPU)."""
    import torch

    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features,
                              bias=linear.bias is not None, compute_dtype=compute_dtype,
                              quant_type="nf4", device="meta")
    layer.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False,
                                     quant_type="nf4", module=layer)
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    return layer
