"""Presets shipped in presets/: named TOML configs, `demo` among them."""

from __future__ import annotations

from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
DEMO_PRESET = "demo"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """A preset name (`demo`) or a path to a TOML file. Only a file counts as a path:
    a folder of the same name (the demo's `demo/` images in the workspace) must not
    shadow the preset."""
    candidate = Path(name)
    if candidate.suffix == ".toml" or candidate.is_file():
        return candidate
    return PRESETS_DIR / f"{name}.toml"


def is_demo(name: str | None) -> bool:
    return name is not None and preset_path(name).resolve() == (
        PRESETS_DIR / f"{DEMO_PRESET}.toml").resolve()
