"""LTX-2 LoRA for ComfyUI: "diffusion_model.<module>.lora_A/B.weight" in LTX-2's original
module names, the layout Lightricks' trainer writes and ComfyUI's LTX-2 loader reads; for
the attentions and feed-forwards adapted here those names are diffusers' own
(transformer_blocks.N.attn1.to_q, audio_to_video_attn, ff.net.0.proj, ...), so only the
prefix changes. diffusers reads the same file (LTX2LoraLoaderMixin converts
"diffusion_model." keys) and refuses any key without "lora" in it, so no `.alpha` is
written: each module's PEFT scale alpha/r is folded into B and every reader applies
scale 1, giving what PEFT trained whatever the rank.

Plain LoRA only: DoRA, LoKr and LoHa files keep lora_files.save_comfy_lora's layout (with
`.alpha`, which ComfyUI reads) under the same prefix; `original_tensors` returns None for
them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.lora_files import _write, lora_modules, module_alpha

PREFIX = "diffusion_model."


def original_tensors(peft_sd: dict[str, Any], config: Any) -> dict[str, Any] | None:
    """{key: tensor} with each module's scale folded into B; None for another kind."""
    modules = lora_modules(peft_sd)
    if any(set(w) != {"lora_A.weight", "lora_B.weight"} for w in modules.values()):
        return None
    out: dict[str, Any] = {}
    for module, w in modules.items():
        scale = module_alpha(config, module) / w["lora_A.weight"].shape[0]
        out[f"{PREFIX}{module}.lora_A.weight"] = w["lora_A.weight"]
        out[f"{PREFIX}{module}.lora_B.weight"] = w["lora_B.weight"] * scale
    return out


def save_original_lora(peft_sd: dict[str, Any], config: Any, path: Path,
                       base_weight: Any) -> Path:
    """The ComfyUI file (see the module docstring)."""
    from core.models.lora_files import save_comfy_lora

    tensors = original_tensors(peft_sd, config)
    if tensors is None:
        return save_comfy_lora(peft_sd, config, path, base_weight, prefix=PREFIX)
    return _write(tensors, Path(path), config, {})
