"""Anima's own `--stage check` problems with model.path (no torch, no weights read):

- Anima Turbo, the few-step distilled checkpoint (circlestone-labs/Anima's
  anima-turbo-v1.0: 10 steps, no guidance): "turbo" in the path's name, or in its
  index's `_class_name`, or `is_distilled: true` there. Training should use the base
  checkpoint (Anima-Base-v1.0): a warning naming model.path.
- A folder with model_index.json but no modular_model_index.json: diffusers has Anima
  only as a modular pipeline (AnimaModularPipeline), whose folder diffusers writes with
  modular_model_index.json; a model_index.json there is another tool's format (an
  "AnimaPipeline" of custom code, say), which this tool cannot load: explained.
- A model its modular_model_index.json names (transformer, text_conditioner,
  text_encoder, vae) whose folder is missing: named with the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE = "circlestone-labs/Anima-Base-v1.0-Diffusers"
MODULAR = "modular_model_index.json"
INDEXES = (MODULAR, "model_index.json")
MODELS = ("transformer", "text_conditioner", "text_encoder", "vae")


def _index(folder: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_turbo(path: str) -> bool:
    """Whether model.path is Anima Turbo (see the module docstring)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        for name in INDEXES:
            index = _index(folder, name)
            if index.get("is_distilled") is True or "turbo" in str(
                    index.get("_class_name", "")).lower():
                return True
    return "turbo" in Path(path).name.lower()


def missing_components(folder: Path) -> list[tuple[str, str]]:
    """(component, class) of each model the folder's modular index names (MODELS: what
    the checkpoint's own repository holds; its index may take tokenizers from another)
    whose subfolder is absent."""
    out = []
    for name, spec in _index(folder, MODULAR).items():
        # a component is [library, class, {loading spec}]; settings are not
        if name not in MODELS or not (isinstance(spec, list) and len(spec) == 3
                                      and isinstance(spec[2], dict)):
            continue
        subfolder = spec[2].get("subfolder") or name
        if not (folder / subfolder).is_dir():
            out.append((name, str(spec[1])))
    return out


def model_problems(path: str) -> list[Any]:
    """The problems above for model.path (tiny:, random: and hub ids only the name)."""
    from core.problems import Problem, error

    out: list[Any] = []
    if is_turbo(path):
        out.append(Problem("warning", "model.path",
                           f"{path} is Anima Turbo, the few-step distilled checkpoint: "
                           f"training should use the base checkpoint (e.g. {BASE}), whose "
                           "LoRA then also applies to Turbo"))
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return out
    if not (folder / MODULAR).is_file():
        if (folder / "model_index.json").is_file():
            out.append(error("model.path", f"{folder} has model_index.json but no "
                             f"{MODULAR}: diffusers loads Anima only as a modular pipeline "
                             f"(AnimaModularPipeline), from a folder such as {BASE}'s"))
        return out
    for name, cls in missing_components(folder):
        out.append(error("model.path", f"{folder} has no {name}/ folder ({cls}), which its "
                         f"{MODULAR} names: the download is incomplete; fetch it again"))
    return out
