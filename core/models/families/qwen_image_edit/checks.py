"""--stage check of Qwen-Image-Edit's one-reference variant: the shared check allows up to
`control_images` (3, what the Plus models take) references per pair; a model.path known
without loading it to be a plain Qwen-Image-Edit (QwenImageEditPipeline) takes one, so a
second control folder or validation image is refused here, naming its key. A hub id is
not read (no network at check); the family's count check refuses it when the caches are
built instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.families.qwen_image_edit.validation import EDIT

# tiny: names of this family's tiny models and their pipelines.
TINY_PIPELINES = {"qwen_image_edit": EDIT,
                  "qwen_image_edit_plus": "QwenImageEditPlusPipeline"}


def configured_pipeline(path: str) -> str | None:
    """The pipeline class of model.path when it can be known without loading: tiny:, or
    a folder's model_index.json; None otherwise."""
    from core.models.source import model_source

    source = model_source(path)
    if source.kind == "tiny":
        return TINY_PIPELINES.get(source.name)
    if source.kind != "folder":
        return None
    try:
        data = json.loads((Path(source.name).expanduser() / "model_index.json").read_text(
            encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("_class_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def plain_edit_problems(cfg: Any) -> list[Any]:
    """Errors for a second reference where model.path is a plain Qwen-Image-Edit."""
    from core.data.controls import split_controls
    from core.problems import error

    if configured_pipeline(cfg.model.path) != EDIT:
        return []
    why = (f"{cfg.model.path} is a Qwen-Image-Edit model ({EDIT}), which takes 1 control "
           "image; clear it, or use a Qwen-Image-Edit-2509/2511 model "
           "(QwenImageEditPlusPipeline), which takes up to 3")
    out = [error(f"datasets.{i}.control_2", f"is set, but {why}")
           for i, ds in enumerate(cfg.datasets) if getattr(ds, "control_2", "").strip()]
    for n, entry in enumerate(cfg.validation.control_images):
        if len(split_controls(entry)) > 1:
            out.append(error("validation.control_images",
                             f"entry {n + 1} names several images, but {why}"))
    return out
