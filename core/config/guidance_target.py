"""train.guidance_target_scale's rules (CFG-augmented targets, issue 52 item 3; the
training side is core/train/guidance_target.py)."""

from __future__ import annotations

from core.config.schema import Config
from core.problems import Problem, error


def guidance_target_line(cfg: Config) -> str | None:
    """The start-up line naming the scale and what it costs, or None when it is off."""
    scale = cfg.train.guidance_target_scale
    if scale <= 0:
        return None
    base = "the base's" if cfg.train.method != "full" else "the model's own"
    return (f"guidance target scale {scale:g}: the output is trained as a prediction guided "
            f"by {base} unconditional (empty caption) prediction, one extra no-grad "
            "forward per sample")


def guidance_target_problems(cfg: Config) -> list[Problem]:
    from core.models.registry import family_or_defaults

    scale, key = cfg.train.guidance_target_scale, "train.guidance_target_scale"
    if scale <= 0:
        return []
    if scale <= 1:
        return [error(key, f"{scale:g}: a guided prediction's scale is above 1 (a "
                           "CFG-distilled base samples as if guided at 3 to 5); 0 "
                           "turns it off")]
    family = family_or_defaults(cfg.model.family)
    if family.edit and family.edit.text_reads_references:
        return [error(key, f"{family.name}'s text encoder reads the control images with "
                           "the prompt, so there is no unconditional prediction without "
                           "them; set it to 0")]
    return []
