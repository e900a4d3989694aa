"""Rules on an edit family's control keys (datasets.N.control, control_2, control_3 and
validation.control_images): which families take them, how many, and in what order. No
disk access (the folders' conflicts are core/data/conflicts.py's, the pairs'
core/data/controls.py's)."""

from __future__ import annotations

from typing import Any

from core.data.controls import CONTROL_KEYS, split_controls
from core.problems import Problem, error, warning


def _edit_family_names() -> str:
    from core.models.registry import families

    return ", ".join(f.name for f in families() if f.edit)


def control_problems(cfg: Any, family: Any) -> list[Problem]:
    """Control keys against `family` (its edit spec: references, text_reads_references)."""
    spec = family.edit
    if spec is None:
        return _not_edit(cfg, family)
    out: list[Problem] = []
    for i, ds in enumerate(cfg.datasets):
        key = f"datasets.{i}"
        given = [name for name in CONTROL_KEYS if getattr(ds, name).strip()]
        if not ds.control.strip() and not spec.optional:
            out.append(error(f"{key}.control", f"is empty, but model.family = "
                                               f"{family.name!r} trains edits from pairs: set "
                                               "the folder of control (source) images, "
                                               "matched to the targets by file name"))
        for before, name in zip(CONTROL_KEYS, CONTROL_KEYS[1:], strict=False):
            if name in given and before not in given:
                out.append(error(f"{key}.{name}", f"is set but {key}.{before} is empty; "
                                                  f"fill {before} first"))
        if len(given) > spec.references:
            extra = CONTROL_KEYS[spec.references]
            out.append(error(f"{key}.{extra}", f"{family.name} takes {spec.references} "
                                               "control image(s) per target; clear it"))
        if ds.flip and given:  # a dataset without references (spec.optional) may flip
            out.append(error(f"{key}.flip", f"{family.name} trains edits from pairs, and a "
                                            "mirrored target would need its control "
                                            "mirrored too, which is not done; turn flip off"))
        if spec.text_reads_references and ds.shuffle_tags:
            out.append(error(f"{key}.shuffle_tags", f"{family.name}'s text encoder reads "
                                                    "the control images with the caption, "
                                                    "so captions are cached with them; turn "
                                                    "tag shuffling off"))
    if spec.text_reads_references and cfg.train.caption_dropout > 0:
        out.append(error("train.caption_dropout", f"{family.name}'s text encoder reads the "
                                                  "control images with the caption, so a "
                                                  "dropped caption is not one cached entry; "
                                                  "set it to 0"))
    if spec.text_reads_references and cfg.train.text_encoder_lora:
        out.append(error("train.text_encoder_lora", f"{family.name}'s text encoder reads the "
                                                    "control images; training it is not "
                                                    "supported yet: turn it off"))
    return out + _validation_controls(cfg, family)


def _validation_controls(cfg: Any, family: Any) -> list[Problem]:
    entries, prompts = cfg.validation.control_images, cfg.validation.prompts
    key = "validation.control_images"
    optional = family.edit.optional  # no entries, or an empty one: drawn from text alone
    if not prompts or (optional and not entries):
        return []
    if len(entries) != len(prompts):
        empty = " (an empty entry draws that prompt without one)" if optional else ""
        return [error(key, f"has {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                           f"for {len(prompts)} validation prompt(s): give one control "
                           f"image per prompt, in order, for the edit model to edit{empty}")]
    out = []
    for n, entry in enumerate(entries):
        count = len(split_controls(entry))
        if count == 0 and not optional:
            out.append(error(key, f"entry {n + 1} is empty; give prompt {n + 1}'s control "
                                  "image"))
        elif count > family.edit.references:
            out.append(error(key, f"entry {n + 1} names {count} images, but {family.name} "
                                  f"takes {family.edit.references} per prompt"))
    return out


def _not_edit(cfg: Any, family: Any) -> list[Problem]:
    what = (f"model.family = {family.name!r} is not an edit model; clear it, or choose an "
            f"edit family ({_edit_family_names()})")
    out = [error(f"datasets.{i}.{name}", f"is set, but {what}")
           for i, ds in enumerate(cfg.datasets) for name in CONTROL_KEYS
           if getattr(ds, name).strip()]
    # An image-to-video family's model may take a first image: the check, which reads
    # the model's folder, says whether the key is used (core/check.py).
    if cfg.validation.control_images and not family.first_image:
        out.append(warning("validation.control_images", f"is ignored: {what}"))
    return out

