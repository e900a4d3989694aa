"""What an Ideogram 4 diffusers folder must hold, checked without torch: each component
the pipeline loads, as a subfolder named in model_index.json. `--stage check` names a
missing one with the folder (family.py `config_problems`), as `load` does."""

from __future__ import annotations

import json
from pathlib import Path

# What training loads, and what validation and --stage merge add.
TRAINED = ("transformer", "text_encoder", "tokenizer", "vae", "scheduler")
VALIDATION = ("unconditional_transformer",)


def missing_components(path: str) -> tuple[list[str], list[str]]:
    """(missing for training, missing for validation) of a local diffusers folder; empty
    lists for anything else (a hub id, a file, tiny:/random:), which the loader checks."""
    folder = Path(path)
    if not (folder / "model_index.json").is_file():
        return [], []
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], []  # the loader names an unreadable index

    def absent(names: tuple[str, ...]) -> list[str]:
        return [n for n in names if n not in index or not (folder / n).is_dir()]

    return absent(TRAINED), absent(VALIDATION)


def describe(path: str, names: list[str]) -> str:
    return (f"{path} has no {', '.join(f'{n}/' for n in names)} (an Ideogram 4 diffusers "
            "folder holds transformer/, unconditional_transformer/, text_encoder/, "
            "tokenizer/, vae/ and scheduler/, each named in model_index.json)")
