"""FLUX.3's own `--stage check` problems with model.path (no torch, no weights read):

- The step-distilled checkpoint: its modular_model_index.json names
  Flux3DistilledModularPipeline (or Flux3DistilledAutoBlocks), or its transformer
  config says `flow_map: true` (the step-distilled transformer's second timestep
  embedder), or the path itself says "distilled". Training should use the base
  checkpoint (a Flux3ModularPipeline folder): a warning naming model.path.
- A folder without modular_model_index.json: FLUX.3 ships modular pipelines only, and
  the index is what names its components (a model_index.json folder is another family's,
  which the shared check names).
- A component the index names (transformer, vae, text_encoder, tokenizer) whose folder
  is missing: named with the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.families.flux3.folder import DISTILLED_CLASS, INDEX, index_components, read_index

NEEDED = ("transformer", "vae", "text_encoder", "tokenizer")


def _flow_map(folder: Path) -> bool:
    try:
        config = json.loads((folder / "transformer" / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("flow_map") is True


def is_distilled(path: str) -> bool:
    """Whether model.path is the step-distilled FLUX.3 (see the module docstring)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        index = read_index(folder)
        names = f"{index.get('_class_name', '')} {index.get('_blocks_class_name', '')}"
        if "Distilled" in names or _flow_map(folder):
            return True
    return "distilled" in Path(path).name.lower()


def model_problems(path: str) -> list[Any]:
    """The problems above for model.path (tiny:, random: and hub ids only the name)."""
    from core.problems import Problem, error

    out: list[Any] = []
    if is_distilled(path):
        out.append(Problem("warning", "model.path",
                           f"{path} is the step-distilled FLUX.3 ({DISTILLED_CLASS}: a flow "
                           "map sampling 16 steps without guidance): training should use "
                           "the base checkpoint (a Flux3ModularPipeline folder), whose LoRA "
                           "then also applies to the distilled one"))
    folder = Path(path).expanduser()
    if not folder.is_dir() or (folder / "model_index.json").is_file():
        return out
    if not (folder / INDEX).is_file():
        out.append(error("model.path", f"{folder} has no {INDEX}: FLUX.3 ships modular "
                         "pipelines only, whose folder holds that index beside transformer/, "
                         "vae/, text_encoder/ and tokenizer/; point model.path at such a "
                         "folder (or its hub id)"))
        return out
    named = index_components(read_index(folder))
    for name in NEEDED:
        if not (folder / name).is_dir():
            what = f"which its {INDEX} names ({named[name]})" if name in named else \
                "which FLUX.3 needs"
            out.append(error("model.path", f"{folder} has no {name}/ folder, {what}: the "
                             "download is incomplete; fetch it again"))
    return out
