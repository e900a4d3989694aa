"""Per-prompt validation settings: a validation.prompts entry may end in kohya-style
flags that override the validation section for that prompt alone,

    a red circle on grass --n blurry, text --w 768 --h 512 --d 7 --l 4.5 --s 30

(--n negative prompt, --w width, --h height, --d seed, --l guidance scale, --s steps).
The same text works in TOML, `--set` and the form's one-prompt-per-line box. Pure
functions: the trainer reads `prompt_settings`, the check `prompt_problems`, labels
(the grid, the gallery, events) `prompt_text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.problems import Problem, error

# Flag letter -> (setting, type); kohya's sample-prompt letters.
FLAGS: dict[str, tuple[str, type]] = {
    "n": ("negative", str), "w": ("width", int), "h": ("height", int),
    "d": ("seed", int), "l": ("guidance_scale", float), "s": ("steps", int),
}
_FLAG = re.compile(r"(?:^|\s)--([a-z]+)(?=\s|$)")
SIDE_MULTIPLE = 16  # every family's pipeline takes sides that are multiples of 16


@dataclass(frozen=True)
class PromptSettings:
    """What one validation prompt is drawn with, flags applied over the section."""

    text: str
    negative: str
    width: int
    height: int
    seed: int
    guidance_scale: float
    steps: int


def split_flags(entry: str) -> tuple[str, dict[str, str]]:
    """The prompt text and its flags' raw values by letter (the last of a repeated one);
    an unknown flag letter stays under its own name, for the check to name."""
    marks = list(_FLAG.finditer(entry))
    if not marks:
        return entry.strip(), {}
    flags = {}
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following else len(entry)
        flags[mark.group(1)] = entry[mark.end():end].strip()
    return entry[:marks[0].start()].strip(), flags


def prompt_text(entry: str) -> str:
    """The prompt as labels show it, without its flags."""
    return split_flags(entry)[0]


def _side(cfg: Any, name: str) -> int:
    return getattr(cfg, name) or cfg.resolution


def prompt_settings(cfg: Any, index: int) -> PromptSettings:
    """Prompt `index` of validation section `cfg` (a ValidationConfig) as drawn: seed
    validation.seed + index unless --d says, validation.width/height (0: resolution)
    unless --w/--h say. Assumes `prompt_problems` found nothing wrong."""
    text, flags = split_flags(cfg.prompts[index])
    values: dict[str, Any] = {
        "negative": cfg.negative_prompt, "width": _side(cfg, "width"),
        "height": _side(cfg, "height"), "seed": cfg.seed + index,
        "guidance_scale": cfg.guidance_scale, "steps": cfg.steps}
    for letter, raw in flags.items():
        if letter in FLAGS:
            name, tp = FLAGS[letter]
            values[name] = tp(raw)
    return PromptSettings(text=text, **values)


def largest_size(cfg: Any) -> tuple[int, int]:
    """(width, height) of the validation prompt with the most pixels (the section's
    size where a prompt's flags cannot be read): what the memory estimate sizes."""
    sizes = [(_side(cfg, "width"), _side(cfg, "height"))]
    for index in range(len(cfg.prompts)):
        try:
            drawn = prompt_settings(cfg, index)
        except ValueError:
            continue
        sizes.append((drawn.width, drawn.height))
    return max(sizes, key=lambda wh: wh[0] * wh[1])


def _flag_problem(letter: str, raw: str) -> str | None:
    """What is wrong with one flag's value, or None."""
    if letter not in FLAGS:
        return f"--{letter} is not a flag; use " + ", ".join(f"--{k}" for k in FLAGS)
    name, tp = FLAGS[letter]
    if tp is str:
        return None
    try:
        value = tp(raw)
    except ValueError:
        return f"--{letter} ({name}) must be {'an integer' if tp is int else 'a number'}; " \
               f"got {raw!r}"
    if name in ("width", "height") and (value < 64 or value % SIDE_MULTIPLE):
        return f"--{letter} ({name}) must be a multiple of {SIDE_MULTIPLE} from 64; got {raw}"
    if (name == "steps" and value < 1) or value < 0:
        return f"--{letter} ({name}) must be at least {1 if name == 'steps' else 0}; got {raw}"
    return None


def prompt_problems(cfg: Any) -> list[Problem]:
    """Each prompt's flags that cannot be used, and the section's sides, naming
    validation.prompts (with the prompt's number) or the key."""
    out = [error(f"validation.{name}", f"must be 0 (validation.resolution) or a multiple "
                                       f"of {SIDE_MULTIPLE} from 64; got {value}")
           for name in ("width", "height")
           if (value := getattr(cfg, name)) and (value < 64 or value % SIDE_MULTIPLE)]
    for index, entry in enumerate(cfg.prompts):
        text, flags = split_flags(entry)
        where = f"prompt {index + 1} ({text[:40]!r})"
        if not text:
            out.append(error("validation.prompts", f"{where} has no text before its flags"))
        out += [error("validation.prompts", f"{where}: {message}")
                for letter, raw in flags.items()
                if (message := _flag_problem(letter, raw)) is not None]
    return out


def negative_prompt_problems(cfg: Any, family: Any) -> list[Problem]:
    """A negative prompt (validation.negative_prompt or a prompt's --n) that the run
    would ignore: the family's validation draws without one (its
    `validation.negative_prompt_note` says why), or guidance at 1 or below turns it off."""
    flagged = [i + 1 for i, entry in enumerate(cfg.prompts) if "n" in split_flags(entry)[1]]
    used = bool(cfg.negative_prompt) or bool(flagged)
    if not used or not cfg.prompts:
        return []
    where = "validation.negative_prompt" if cfg.negative_prompt else "validation.prompts"
    said = "" if cfg.negative_prompt else \
        f" (--n of prompt {', '.join(str(n) for n in flagged)})"
    if family.validation.negative_prompt_note:
        note = family.validation.negative_prompt_note
        return [Problem("warning", where, f"is set{said} but {note}")]
    if cfg.negative_prompt and cfg.guidance_scale <= 1:
        return [Problem("warning", where, (
            f"is set but validation.guidance_scale = {cfg.guidance_scale:g} turns "
            "classifier-free guidance off, so it is ignored; raise the scale above 1"))]
    return []
