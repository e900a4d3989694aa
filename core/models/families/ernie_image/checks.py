"""ERNIE-Image's own `--stage check` problems with model.path (no torch, no weights read):

- ERNIE-Image-Turbo, the distilled checkpoint (DMD and RL, 8 steps at guidance 1.0: its
  model card): nothing in its model_index.json tells it from the base (ErnieImagePipeline
  has no `is_distilled` config), so it is recognised by its name ("turbo" in the path,
  baidu/ERNIE-Image-Turbo), or by an index that says `is_distilled` or names a Turbo
  pipeline class. Training should use the base (SFT) checkpoint, baidu/ERNIE-Image: a
  warning naming model.path. A LoRA trained on the base applies to Turbo (the same
  architecture and module names).
- A component its model_index.json names (transformer, text_encoder, vae, tokenizer,
  scheduler) whose folder is missing: named with the folder. The prompt enhancer (`pe`,
  `pe_tokenizer`, optional in ErnieImagePipeline) is never loaded here, so its absence is
  no problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE = "baidu/ERNIE-Image"
# ErnieImagePipeline's optional prompt enhancer: not loaded for training or validation.
OPTIONAL = ("pe", "pe_tokenizer")


def _index(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_turbo(path: str) -> bool:
    """Whether model.path is ERNIE-Image-Turbo (see the module docstring)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        index = _index(folder)
        if index.get("is_distilled") is True or "turbo" in str(
                index.get("_class_name", "")).lower():
            return True
    return "turbo" in Path(path).name.lower()


def model_problems(path: str) -> list[Any]:
    """The problems above for model.path (tiny:, random: and hub ids only the name)."""
    from core.problems import Problem, error

    out: list[Any] = []
    if is_turbo(path):
        out.append(Problem("warning", "model.path",
                           f"{path} is ERNIE-Image-Turbo, the distilled 8-step checkpoint: "
                           f"training should use the base checkpoint ({BASE}), whose LoRA "
                           "then also applies to Turbo"))
    folder = Path(path).expanduser()
    if not (folder / "model_index.json").is_file():
        return out
    for name, spec in _index(folder).items():
        # a component is [library, class]; an empty one is [null, null]
        if name.startswith("_") or name in OPTIONAL or not (
                isinstance(spec, list) and len(spec) == 2 and spec[0]):
            continue
        if not (folder / name).is_dir():
            out.append(error("model.path", f"{folder} has no {name}/ folder, which its "
                             f"model_index.json names ({spec[-1]}): the download is "
                             "incomplete; fetch it again"))
    return out
