"""`random:<family>`: the real architecture of a family's usual checkpoint (SD1.5, SD2.1,
SDXL base, SD3.5 medium, FLUX.1-dev, Qwen-Image) with random weights, built offline from the configs
shipped in core/models/full_size/<family>/, to measure memory and speed at real sizes
without a download. What it is for and its sizes: docs/random-models.md.

Each module is instantiated on the meta device, then given storage on `device` in
`dtype` and seeded random weights (meta.py, fill.py). Tokenizers are the tiny
byte-level ones of core/models/tiny, written to a temporary folder, loaded and the
folder deleted; their ids lie inside the real vocabularies (CLIP 49408, T5 32128,
Qwen 152064), so the real embedding tables serve them. The scheduler comes from the
shipped config, with the class the family's own loader uses.

Heavy imports stay inside the functions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from core.models.base import Components
from core.models.full_size import RANDOM_PREFIX
from core.models.full_size.spec import (
    component_config,
    component_specs,
    model_components,
    require_family,
)

# The families whose loader (StableDiffusionFamily) trains with a DDPMScheduler built
# from the folder's scheduler config, whatever inference scheduler the index names.
DDPM_FAMILIES = ("sd15", "sd2", "sdxl")
# CLIP tokenizers that pad with "!" in the real models (OpenCLIP's); the others pad with
# the end-of-text token.
BANG_PADDED = {("sd2", "tokenizer"), ("sdxl", "tokenizer_2"), ("sd3", "tokenizer_2")}


def random_fingerprint(family: str, seed: int = 0) -> str:
    """What caches record for random:<family>: the weights depend on nothing else (the
    dtype only rounds them)."""
    return f"random-{family}-{seed}"


def build_module(family: str, name: str, dtype: Any, device: Any = "cpu",
                 seed: int = 0) -> Any:
    """One component of random:<family> on `device` in `dtype`, random, frozen."""
    from core.models.full_size.fill import materialize
    from core.models.full_size.meta import instantiate

    module = instantiate(family, name, device=device)
    materialize(module, dtype, device, seed, prefix=f"{family}/{name}")
    module.requires_grad_(False)
    return module.eval()


def _tokenizers(family: str) -> list[Any]:
    """The family's tokenizers, in component order, from the tiny builders; their files
    live in a temporary folder only while they load."""
    from core.models.tiny.clip import EOS_TOKEN, clip_tokenizer
    from core.models.tiny.t5 import t5_tokenizer

    names = sorted(n for n in component_specs(family) if n.startswith("tokenizer"))
    out = []
    with tempfile.TemporaryDirectory(prefix="random-tokenizers-") as tmp:
        for name in names:
            cls = component_specs(family)[name][1]
            if cls.startswith("T5"):
                out.append(t5_tokenizer(Path(tmp) / name)[0])
            elif cls.startswith("Qwen2"):  # each Qwen family's tiny tokenizer and template
                out.append(_qwen_tokenizer(family, Path(tmp) / name))
            else:
                pad = "!" if (family, name) in BANG_PADDED else EOS_TOKEN
                out.append(clip_tokenizer(Path(tmp) / name, pad_token=pad))
    return out


def _qwen_tokenizer(family: str, folder: Path) -> Any:
    """The tiny Qwen tokenizer of the family's tiny build: Qwen3's chat template for
    Z-Image and FLUX.2-klein, Qwen2.5-VL's prompt template for Qwen-Image."""
    if family == "qwen_image":
        from core.models.tiny.qwen import qwen_tokenizer

        return qwen_tokenizer(folder)
    if family == "flux2":
        from core.models.tiny.flux2_qwen3 import qwen_tokenizer as flux2_tokenizer

        return flux2_tokenizer(folder)[0]
    from core.models.tiny.z_image_qwen3 import qwen_tokenizer as z_image_tokenizer

    return z_image_tokenizer(folder)


def _scheduler(family: str) -> Any:
    import diffusers

    config = component_config(family, "scheduler")
    name = "DDPMScheduler" if family in DDPM_FAMILIES else config["_class_name"]
    return getattr(diffusers, name).from_config(config)


def _family_settings(c: Components) -> None:
    """What the families' own `_components_from_pipeline` set (sd3.py, flux.py)."""
    from core.models.registry import get_family

    family = get_family(c.family)
    if c.family in ("sd3", "flux", "flux2", "chroma", "z_image", "qwen_image"):
        c.max_sequence_length = getattr(family, "max_sequence_length", None)
    if c.family == "sd3":
        c.has_t5 = len(c.text_encoders) == 3
    if c.family in ("flux", "flux2"):
        c.guidance = getattr(family, "train_guidance", None)
    if c.family == "flux2":
        from core.models.full_size.spec import model_index

        c.pipeline_class = model_index("flux2")["_class_name"]
        c.is_distilled = bool(model_index("flux2").get("is_distilled", False))


def build_random(family: str, dtype: Any = None, device: Any = "cpu",
                 seed: int = 0) -> Components:
    """random:<family> as Components: every module on `device` in `dtype` (None: float32;
    also "no"/"fp16"/"bf16"), eval mode, requires_grad False (the base.py contract).
    The same seed gives the same weights on every device."""
    import torch

    from core.models.loading import resolve_dtype
    from core.models.modules import freeze

    require_family(family)
    dtype = resolve_dtype(dtype) or torch.float32
    device = torch.device(device)
    modules = {name: build_module(family, name, dtype, device, seed)
               for name in model_components(family)}
    encoders = sorted(n for n in modules if n.startswith("text_encoder"))
    c = Components(
        family=family, source=RANDOM_PREFIX + family,
        fingerprint=random_fingerprint(family, seed), vae=modules["vae"],
        denoiser=modules["unet"] if "unet" in modules else modules["transformer"],
        text_encoders=[modules[n] for n in encoders], tokenizers=_tokenizers(family),
        noise_scheduler=_scheduler(family))
    _family_settings(c)
    freeze((c.vae, c.denoiser, *c.text_encoders), device)
    return c
