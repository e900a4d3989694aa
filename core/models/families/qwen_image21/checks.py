"""Qwen-Image 2.1's own `--stage check` problems with model.path (no torch, no weights):

- Qwen-Image 2.1 Turbo, the few-step checkpoint that samples without guidance: diffusers
  tells it from the base by the sampling grid its pipeline config ships (`sample_sigmas`
  in model_index.json, or in modular_model_index.json: modular_pipeline.py
  `_qwenimage21_map_fn` picks QwenImage21TurboModularPipeline then), or its modular
  index names the Turbo pipeline class, or the path itself says "turbo". Training should
  use the base checkpoint (Qwen/Qwen-Image-2.1): a warning naming model.path.
- A modular-only folder (modular_model_index.json without model_index.json): explained,
  since QwenImage21Pipeline reads model_index.json.
- A component its model_index.json names (transformer, text_encoder, processor, vae,
  scheduler) whose folder is missing: named with the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE = "Qwen/Qwen-Image-2.1"
INDEXES = ("model_index.json", "modular_model_index.json")


def read_index(folder: Path, name: str) -> dict[str, Any]:
    """The JSON object in folder/name, or {} when it is absent or unreadable."""
    try:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_turbo(path: str) -> bool:
    """Whether model.path is Qwen-Image 2.1 Turbo (see the module docstring)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        for name in INDEXES:
            index = read_index(folder, name)
            if index.get("sample_sigmas") or "turbo" in str(
                    index.get("_class_name", "")).lower():
                return True
    return "turbo" in Path(path).name.lower()


def missing_components(folder: Path) -> list[tuple[str, str]]:
    """(component, class) of each component model_index.json names without a folder."""
    out = []
    for name, spec in read_index(folder, "model_index.json").items():
        # a component is [library, class]; config values (sample_sigmas) are not
        if name.startswith("_") or not (isinstance(spec, list) and len(spec) == 2
                                        and isinstance(spec[1], str)):
            continue
        if not (folder / name).is_dir():
            out.append((name, spec[1]))
    return out


def model_problems(path: str) -> list[Any]:
    """The problems above for model.path (tiny:, random: and hub ids only the name)."""
    from core.problems import Problem, error

    out: list[Any] = []
    if is_turbo(path):
        out.append(Problem("warning", "model.path",
                           f"{path} is Qwen-Image 2.1 Turbo, the few-step checkpoint that "
                           "samples without guidance: training should use the base "
                           f"checkpoint (e.g. {BASE}), whose LoRA then also applies to "
                           "Turbo"))
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return out
    if not (folder / "model_index.json").is_file():
        if (folder / "modular_model_index.json").is_file():
            out.append(error("model.path", f"{folder} holds only a modular pipeline "
                             "(modular_model_index.json); Qwen-Image 2.1 trains from a "
                             "QwenImage21Pipeline folder with model_index.json, such as "
                             f"{BASE}'s"))
        return out
    for name, cls in missing_components(folder):
        out.append(error("model.path", f"{folder} has no {name}/ folder, which its "
                         f"model_index.json names ({cls}): the download is incomplete; "
                         "fetch it again"))
    return out
