"""The full-size modules built from the shipped configs with no weights: parameters on
the meta device (accelerate's init_empty_weights), so even FLUX.1-dev's 12 B parameters
cost nothing until `fill.materialize` gives them storage.

torch, diffusers and transformers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
from typing import Any

from core.models.full_size import full_size_dir
from core.models.full_size.spec import model_components


def component_class(library: str, class_name: str) -> Any:
    """The diffusers or transformers class model_index.json names."""
    import importlib

    if library not in ("diffusers", "transformers"):
        raise ValueError(f"unexpected library {library!r} for {class_name}")
    return getattr(importlib.import_module(library), class_name)


def instantiate(family: str, name: str, device: Any = None,
                meta_buffers: bool = False) -> Any:
    """Component `name` of random:<family> with its parameters on the meta device.

    Buffers (CLIP's position ids, SD3's 384x384 sin-cos position table) are computed for
    real on `device` unless `meta_buffers`: SD3's table takes seconds on a CPU, which a
    parameter count does not need, and little time on a GPU.
    """
    import torch

    from core.models.empty import empty_weights

    library, class_name = model_components(family)[name]
    cls = component_class(library, class_name)
    folder = full_size_dir(family) / name
    place = torch.device("meta") if meta_buffers else (
        torch.device(device) if device is not None else contextlib.nullcontext())
    with place, empty_weights(include_buffers=meta_buffers):
        if library == "diffusers":
            module = cls.from_config(cls.load_config(str(folder)))
        else:
            module = cls(cls.config_class.from_json_file(str(folder / "config.json")))
    if hasattr(module, "tie_weights"):
        # transformers ties T5's encoder.embed_tokens to `shared` only in from_pretrained;
        # the real checkpoints hold one embedding, so the random model must too.
        module.tie_weights()
    return module.eval()


def parameter_counts(family: str) -> dict[str, int]:
    """Parameters of each component (tied ones once), from the configs alone."""
    counts = {}
    for name in model_components(family):
        module = instantiate(family, name, meta_buffers=True)
        counts[name] = sum(p.numel() for p in module.parameters())
    return counts
