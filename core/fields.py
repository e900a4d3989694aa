"""Field metadata, which drives conversion, validation, docs/config.md and the UI form:
`meta` and `_f`, the dataclass field that carries it (core/config/schema.py, and a
family's options.py). Outside the core.config package so that a family's options.py
imports it without building the config first (the schema imports those options)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def meta(
    label: str,
    help: str = "",
    *,
    choices: tuple[str, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    max_exclusive: bool = False,
    kind: str = "",
    advanced: bool = False,
    video: bool = False,
    edit: bool = False,
    flow: bool = False,
    ddpm: bool = False,
    guidance: bool = False,
    lora: bool = False,
    blocks: bool = False,
    conditioned: bool = False,
    audio: bool = False,
    routing: bool = False,
) -> dict[str, Any]:
    """Field metadata. `kind="path"` marks paths (or lists of them) resolved against the
    workspace. The tags say where a key applies, and the form shows it only there
    (ui/form.py): `video` a video family, `edit` an edit family (its `edit` spec,
    core/models/capabilities.py), `flow` a flow-matching family, `ddpm` an epsilon/v
    family, `guidance` a family with guidance-distilled models, `lora` an adapter run
    (train.method = "lora"), `blocks` an adapter run of a family with blocks to swap
    (model.blocks_to_swap), `conditioned` a family whose validation can start from given
    images (an edit family, or a video family: its image-to-video models take a first
    image), `audio` a family that trains sound with its video (its `audio` spec),
    `routing` a family that routes tokens around its middle blocks (ModelFamily.routing:
    train.token_routing)."""
    return {
        "video": video,
        "edit": edit,
        "flow": flow,
        "ddpm": ddpm,
        "guidance": guidance,
        "lora": lora,
        "blocks": blocks,
        "conditioned": conditioned,
        "audio": audio,
        "routing": routing,
        "label": label,
        "help": help,
        "choices": choices,
        "min": min,
        "max": max,
        "min_exclusive": min_exclusive,
        "max_exclusive": max_exclusive,
        "kind": kind,
        "advanced": advanced,
    }


def _f(default: Any, **kwargs: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta(**kwargs))
    return field(default=default, metadata=meta(**kwargs))
