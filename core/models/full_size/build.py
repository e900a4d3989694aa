"""`random:<family>`: the real architecture of a family's usual checkpoint (SD1.5, SD2.1,
SDXL base, SD3.5 medium, FLUX.1-dev, Qwen-Image) with random weights, built offline from the configs
shipped in core/models/families/<family>/full_size/, to measure memory and speed at real sizes
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
from core.models.full_size import RANDOM_PREFIX, family_of
from core.models.full_size.spec import (
    component_config,
    component_specs,
    model_components,
    require_family,
)


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
    """The family's tokenizers, in component order, from its `random.tokenizer` builder;
    their files live in a temporary folder only while they load."""
    from core.models.registry import get_family

    spec = get_family(family_of(family)).random
    names = sorted(n for n in component_specs(family) if n.startswith("tokenizer"))
    with tempfile.TemporaryDirectory(prefix="random-tokenizers-") as tmp:
        return [spec.tokenizer(component_specs(family)[name][1], Path(tmp) / name,
                               name in spec.bang_padded_tokenizers) for name in names]


def _scheduler(family: str) -> Any:
    import diffusers

    from core.models.registry import get_family

    config = component_config(family, "scheduler")
    name = get_family(family_of(family)).random.scheduler or config["_class_name"]
    return getattr(diffusers, name).from_config(config)


def build_random(family: str, dtype: Any = None, device: Any = "cpu",
                 seed: int = 0, stream_denoiser: bool = False) -> Components:
    """random:<family> as Components: every module on `device` in `dtype` (None: float32;
    also "no"/"fp16"/"bf16"), eval mode, requires_grad False (the base.py contract).
    The same seed gives the same weights on every device. With `stream_denoiser` the
    denoiser stays on the meta device and `denoiser_stream` fills it where it is placed
    (core/models/stream_load.py), the same weights a layer at a time."""
    import torch

    from core.models.modules import freeze
    from core.models.registry import get_family
    from core.models.stream_load import random_denoiser
    from core.models.weights import resolve_dtype

    require_family(family)
    dtype = resolve_dtype(dtype) or torch.float32
    device = torch.device(device)
    names = model_components(family)
    denoiser = "unet" if "unet" in names else "transformer"
    modules, stream = {}, None
    for name in names:
        if stream_denoiser and name == denoiser:
            modules[name], stream = random_denoiser(family, name, dtype, seed)
        else:
            modules[name] = build_module(family, name, dtype, device, seed)
    encoders = sorted(n for n in modules if n.startswith("text_encoder"))
    c = Components(
        family=family_of(family), source=RANDOM_PREFIX + family,
        fingerprint=random_fingerprint(family, seed), vae=modules["vae"],
        denoiser=modules[denoiser], text_encoders=[modules[n] for n in encoders],
        tokenizers=_tokenizers(family), noise_scheduler=_scheduler(family),
        denoiser_stream=stream)
    settings = get_family(family_of(family)).random.settings
    c = settings(c) if settings else c  # the family's Components, as its `load` gives them
    # A streamed denoiser has no storage to move yet (it is frozen and in eval mode).
    freeze((c.vae, *([] if stream else [c.denoiser]), *c.text_encoders), device)
    return c
