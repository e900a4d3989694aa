"""ComfyUI's LoRA key layout, as data: the LoRA module names ComfyUI's loader maps onto a
family's model, what each one patches there, and the suffixes it reads under them.

Each family declares the layout of the file it writes for ComfyUI (lora_comfyui; sd15,
sd2 and sdxl: lora_kohya) in core/models/families/<name>/comfyui_keys.py, as `LAYOUT`.
The names are facts read from ComfyUI 0.29.0
(comfy/lora.py `model_lora_keys_unet`: the generic "diffusion_model.<weight>" map and the
per-model branches, and `model_lora_keys_clip`; comfy/utils.py: unet_to_diffusers,
flux_to_diffusers, mmdit_to_diffusers, z_image_to_diffusers; comfy/ldm/*: the models'
weight names), written down here as
patterns, not code: ComfyUI is GPL and not a dependency. tests/test_comfyui_keys.py holds
every family's file to its layout: each key a mapped name with a suffix ComfyUI reads,
and each module's weight change the diffusers file's.

Only the names this tool's LoRA targets can reach are listed (the blocks' attention and
feed-forward Linears, a few outside them); ComfyUI maps more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The suffixes ComfyUI's load_lora reads under a mapped module name, by adapter kind
# (comfy/lora.py load_lora; comfy/weight_adapter/lora.py, lokr.py, loha.py).
LORA_SUFFIXES = frozenset({"lora_up.weight", "lora_down.weight", "lora_mid.weight",
                           "lora_A.weight", "lora_B.weight"})
LOKR_SUFFIXES = frozenset({"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a",
                           "lokr_w2_b", "lokr_t2"})
LOHA_SUFFIXES = frozenset({"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1",
                           "hada_t2"})
SUFFIXES = LORA_SUFFIXES | LOKR_SUFFIXES | LOHA_SUFFIXES | {"alpha", "dora_scale"}


PLACEHOLDER = re.compile(r"\{([a-z])\}")  # {i}, {j}, ...: a block index


@dataclass(frozen=True)
class Name:
    """One LoRA module name ComfyUI maps. {i} (and {j}, {k}: nested blocks) stand for
    block indices, the same in `lora` and `diffusers`.

    lora: the name in the file, without its suffix. weight: the ComfyUI model weight it
    patches (its state-dict key after "diffusion_model.", without ".weight"). part:
    (start, stop, total) when ComfyUI patches a slice of that weight's outputs (q of a
    fused qkv: (0, 1, 3)), None for the whole weight. diffusers: the diffusers modules
    whose change it carries, stacked along the outputs in that order (more than one for
    a fused module).
    """

    lora: str
    weight: str
    diffusers: tuple[str, ...]
    part: tuple[int, int, int] | None = None

    def pattern(self) -> re.Pattern[str]:
        return re.compile(PLACEHOLDER.sub(r"(?P<\1>\\d+)", re.escape(self.lora)
                                          .replace(r"\{", "{").replace(r"\}", "}")))


@dataclass(frozen=True)
class Layout:
    """The names ComfyUI maps for one model (`model`: its class in comfy/model_base.py)."""

    model: str
    names: tuple[Name, ...]

    def match(self, module: str) -> tuple[Name, dict[str, str]] | None:
        """The Name `module` (a file key without its suffix) is, and its block indices
        ({"i": "3"}); None when ComfyUI maps no such name."""
        for name in self.names:
            found = name.pattern().fullmatch(module)
            if found:
                return name, found.groupdict()
        return None

    def diffusers_of(self, module: str) -> tuple[str, ...] | None:
        """The diffusers modules a mapped `module` carries, block indices filled in."""
        found = self.match(module)
        if found is None:
            return None
        name, indices = found
        return tuple(PLACEHOLDER.sub(lambda m: indices[m.group(1)], d) for d in name.diffusers)


def split_suffix(key: str) -> tuple[str, str] | None:
    """(module, suffix) of a file key whose suffix ComfyUI reads; None otherwise."""
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if key.endswith("." + suffix):
            return key[:-len(suffix) - 1], suffix
    return None


Row = tuple[str, str, tuple[int, int, int] | None]  # (diffusers module, weight, part)


def sliced(modules: tuple[str, ...], weight: str, total: int = 0) -> tuple[Row, ...]:
    """Rows of `transformer_names` for diffusers modules ComfyUI maps onto equal slices
    of one fused weight, in order (q, k, v of a qkv: the first, second and third third);
    total: the fused weight's outputs in those slices' units (default: one each)."""
    total = total or len(modules)
    return tuple((m, weight, (n, n + 1, total)) for n, m in enumerate(modules))


def transformer_names(rows: tuple[Row, ...]) -> tuple[Name, ...]:
    """Names "transformer.<diffusers module>", as ComfyUI's diffusers tables map them:
    rows of (diffusers module, ComfyUI weight, part)."""
    return tuple(Name(f"transformer.{d}", w, (d,), p) for d, w, p in rows)


def original_names(rows: tuple[tuple[str, str, tuple[str, ...]], ...],
                   prefix: str = "diffusion_model.") -> tuple[Name, ...]:
    """Names in the original model's own weight names, "diffusion_model.<weight>" (the
    map ComfyUI builds for every model): rows of (weight, diffusers modules)."""
    return tuple(Name(prefix + w, w, d) for w, d in rows)
