"""Krea 2's own `--stage check` problems with model.path (no torch, no weights read):

- Krea 2 Turbo, the few-step distilled (TDM) checkpoint: its folder's model_index.json
  says `is_distilled: true` (Krea2Pipeline's own config flag) or names a Turbo pipeline
  (Krea2TurboModularPipeline), or its modular_model_index.json does, or the path itself
  says "turbo" (krea/Krea-2-Turbo). Training should use the base (Raw) checkpoint, as
  diffusers' reference trainer does (its card: LoRAs are trained on krea/Krea-2-Raw and
  served on Turbo): a warning naming model.path.
- A modular-only folder (modular_model_index.json without model_index.json): explained,
  since Krea2Pipeline reads model_index.json.
- A component its model_index.json names (transformer, text_encoder, vae, ...) whose
  folder is missing: named with the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RAW = "krea/Krea-2-Raw"
INDEXES = ("model_index.json", "modular_model_index.json")


def _index(folder: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_turbo(path: str) -> bool:
    """Whether model.path is Krea 2 Turbo (see the module docstring)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        for name in INDEXES:
            index = _index(folder, name)
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
                           f"{path} is Krea 2 Turbo, the few-step distilled checkpoint: "
                           "training should use the base (Raw) checkpoint (e.g. "
                           f"{RAW}), whose LoRA then also applies to Turbo"))
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return out
    if not (folder / "model_index.json").is_file():
        if (folder / "modular_model_index.json").is_file():
            out.append(error("model.path", f"{folder} holds only a modular pipeline "
                             "(modular_model_index.json); Krea 2 trains from a Krea2Pipeline "
                             f"folder with model_index.json, such as {RAW}'s"))
        return out
    for name, spec in _index(folder, "model_index.json").items():
        # a component is [library, class]; config values (the taps' list) are not
        if name.startswith("_") or not (isinstance(spec, list) and len(spec) == 2
                                        and isinstance(spec[0], str)):
            continue
        if not (folder / name).is_dir():
            out.append(error("model.path", f"{folder} has no {name}/ folder, which its "
                             f"model_index.json names ({spec[-1]}): the download is "
                             "incomplete; fetch it again"))
    return out
