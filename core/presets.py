"""Presets shipped in presets/: named TOML configs, `demo` among them."""

from __future__ import annotations

from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
DEMO_PRESET = "demo"
# Presets that bring their own generated dataset (core/ops/datasets.prepare_demo).
DEMO_PRESETS = (DEMO_PRESET, "demo-video")


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
    """Whether `name` is one of DEMO_PRESETS (by name or by its file)."""
    return name is not None and preset_path(name).resolve() in {
        (PRESETS_DIR / f"{demo}.toml").resolve() for demo in DEMO_PRESETS}


# Hub models whose download needs an accepted license and a login (the others are open).
GATED_MODELS = ("black-forest-labs/FLUX.1-dev",)


def gated_note(model_path: str) -> str | None:
    """What a config whose model.path is a gated hub model needs, in words; else None."""
    if model_path.strip() not in GATED_MODELS:
        return None
    return (f"{model_path} is a gated model: accept its license at "
            f"https://huggingface.co/{model_path} with your Hugging Face account, then log "
            "in on this machine (`hf auth login`, or set HF_TOKEN) so it can download")
