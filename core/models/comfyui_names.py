"""The one diffusers -> ComfyUI module-name mapper, for the families whose ComfyUI file
uses the original checkpoint's names (Wan, HunyuanVideo 1.5, FLUX.2's BFL names), and the
fused-LoRA writer they share.

`ModuleNames` renames a diffusers module ("blocks.3.attn1.to_q") by its block list and
the leaf inside the block ("blocks.3.self_attn.q"), or by a whole-name table for modules
outside the blocks. `fused_tensors` writes plain LoRA under those names, where the
original model holds q, k and v in one Linear (FLUX.2's and HunyuanVideo's `qkv`): the
three LoRAs become one of rank 3r whose down (A) stacks Aq, Ak, Av and whose up (B) is
block-diagonal, so B A = [Bq Aq; Bk Ak; Bv Av] exactly, the fused weight's change. Each
module's PEFT scale alpha/r is folded into B and no `.alpha` is written: ComfyUI scales a
module without one by 1, whatever rank it sees, and diffusers' converters split such a
file back by chunking B in three along its outputs and sharing A.

Plain LoRA only: a DoRA, LoKr or LoHa update of q, k and v is no single update of that
kind on the fused weight (Kronecker and Hadamard products do not stack, DoRA's magnitudes
are per module), so `fused_tensors` returns None for them and the family writes those
kinds with `save_named_comfy` (one module per diffusers module).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.models.lora_files import (
    _write,
    base_weights,
    lora_modules,
    module_alpha,
    save_comfy_lora,
)

PREFIX = "diffusion_model."  # ComfyUI's key prefix of a diffusion model's weights


@dataclass(frozen=True)
class Fused:
    """One fused Linear of the original model: `name` (its leaf inside the block, as the
    ComfyUI file names it) holds the diffusers leaves `parts`, stacked in that order
    along its outputs, in the blocks of the diffusers list `head`."""

    head: str
    name: str
    parts: tuple[str, ...]


@dataclass(frozen=True)
class ModuleNames:
    """diffusers module -> original name. blocks: {diffusers block list: (original block
    list, {leaf: original leaf})}; top: whole names outside the blocks."""

    blocks: Mapping[str, tuple[str, Mapping[str, str]]]
    top: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, module: str) -> str | None:
        """The original name of `module`; None for one without a name here."""
        if module in self.top:
            return self.top[module]
        head, _, rest = module.partition(".")
        index, _, leaf = rest.partition(".")
        if head in self.blocks and index.isdigit():
            to_head, leaves = self.blocks[head]
            if leaf in leaves:
                return f"{to_head}.{index}.{leaves[leaf]}"
        return None


def _plain_lora(modules: dict[str, dict[str, Any]]) -> bool:
    return all(set(w) == {"lora_A.weight", "lora_B.weight"} for w in modules.values())


def _fuse(pairs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """(A, B) of one LoRA carrying every pair's update on stacked outputs."""
    import torch

    return torch.cat([a for a, _ in pairs]), torch.block_diag(*[b for _, b in pairs])


def fused_tensors(peft_sd: dict[str, Any], config: Any, names: ModuleNames,
                  fused: tuple[Fused, ...] = (), prefix: str = PREFIX
                  ) -> dict[str, Any] | None:
    """{key: tensor}: the `fused` groups as one LoRA each, every other module under
    `names`, scales folded into B (module docstring). None when the adapter is not plain
    LoRA, a module has no name, or a fused group lacks one of its parts (a fused Linear
    takes all of them or none)."""
    modules = lora_modules(peft_sd)
    if not _plain_lora(modules):
        return None

    def scaled(module: str) -> tuple[Any, Any]:
        w = modules.pop(module)
        scale = module_alpha(config, module) / w["lora_A.weight"].shape[0]
        return w["lora_A.weight"], w["lora_B.weight"] * scale

    out: dict[str, Any] = {}
    for group in fused:
        indices = {m.split(".")[1] for m in modules if m.startswith(group.head + ".")}
        for index in sorted(indices, key=int):
            parts = [f"{group.head}.{index}.{p}" for p in group.parts]
            present = [p in modules for p in parts]
            if not any(present):
                continue
            if not all(present):
                return None
            to_head = names.blocks[group.head][0]
            key = f"{prefix}{to_head}.{index}.{group.name}"
            out[f"{key}.lora_A.weight"], out[f"{key}.lora_B.weight"] = _fuse(
                [scaled(p) for p in parts])
    for module in list(modules):
        name = names(module)
        if name is None:
            return None
        out[f"{prefix}{name}.lora_A.weight"], out[f"{prefix}{name}.lora_B.weight"] = \
            scaled(module)
    return out


def save_fused_comfy(denoiser: Any, peft_sd: dict[str, Any], config: Any, path: Path,
                     names: ModuleNames, fused: tuple[Fused, ...]) -> Path:
    """Plain LoRA as `fused_tensors`; any other kind (or a module without a name) as
    `save_named_comfy`."""
    tensors = fused_tensors(peft_sd, config, names, fused)
    if tensors is None:
        return save_named_comfy(denoiser, peft_sd, config, path, names)
    return _write(tensors, Path(path), config, {})


def save_named_comfy(denoiser: Any, peft_sd: dict[str, Any], config: Any, path: Path,
                     names: ModuleNames) -> Path:
    """Every module under its original name after "diffusion_model.", with ComfyUI's
    suffixes per kind and one `.alpha` (lora_files.save_comfy_lora). An adapter with a
    module `names` does not know (an unusual target) keeps diffusers' "transformer."
    names instead, as the other families write, rather than a file of mixed layouts."""
    weights = base_weights(denoiser)
    if any(names(m) is None for m in lora_modules(peft_sd)):
        return save_comfy_lora(peft_sd, config, path, weights)
    return save_comfy_lora(peft_sd, config, path, weights, prefix=PREFIX, rename=names)
