"""Presets and saved configs: load one into the form, save the form, export and import.

A saved file is `dumps_config(cfg)` as is, the format `python app.py --no-ui --config`
reads, with paths exactly as the user wrote them (relative ones resolve against the
workspace, as on the CLI). Saved configs live in `<workspace>/configs/`.
"""

from __future__ import annotations

import re
from pathlib import Path

from core.config import Config, dumps_config, load_config, save_config
from core.ops import PRESETS_DIR, gated_note, is_demo, list_presets
from core.problems import ConfigError, Problem
from ui import actions
from ui.actions import ActionError
from ui.context import AppContext

CONFIGS_DIR = "configs"
# The form as the person left it, saved on every edit and restored when the page opens.
FORM_FILE = ".ui-form.toml"
DEMO = "preset: demo"
PRESET_PREFIX = "preset: "
SAVED_PREFIX = "saved: "
NAME = re.compile(r"^[\w.-]+$")


def sources(ctx: AppContext) -> list[str]:
    """Dropdown entries: the shipped presets, then the configs saved in the workspace."""
    saved = sorted(p.stem for p in (ctx.workspace / CONFIGS_DIR).glob("*.toml"))
    return [PRESET_PREFIX + n for n in list_presets()] + [SAVED_PREFIX + n for n in saved]


def _path_of(ctx: AppContext, source: str) -> Path:
    if source.startswith(PRESET_PREFIX):
        return PRESETS_DIR / f"{source.removeprefix(PRESET_PREFIX)}.toml"
    if source.startswith(SAVED_PREFIX):
        return ctx.workspace / CONFIGS_DIR / f"{source.removeprefix(SAVED_PREFIX)}.toml"
    raise ActionError(f"choose a preset or a saved config (got {source!r})")


def load_source(ctx: AppContext, source: str) -> tuple[Config, list[str]]:
    """The config of a dropdown entry, and notes for the user.

    The demo preset brings its own images, generated into the workspace the first time
    (as `--no-ui --preset demo` does), and never reuses an output folder that holds a run.
    """
    path = _path_of(ctx, source)
    cfg = read_config_file(path)
    notes = [f"loaded {source.split(': ', 1)[-1]} ({path})"]
    gated = gated_note(cfg.model.path)
    if gated:
        notes.append(gated)
    if source.startswith(PRESET_PREFIX) and is_demo(str(path)):
        from core import ops

        with actions.refusals():
            notes += ops.prepare_demo(cfg, ctx.workspace, new_output=True)
    return cfg, notes


def read_config_file(path: str | Path, shown_as: str | None = None) -> Config:
    """The config in `path`; a refusal names it `shown_as` (an upload's original file
    name) instead of the path, which for an upload is Gradio's temp copy
    (`.../gradio/<hash>/name.toml`), a folder the user never chose."""
    try:
        return load_config(path)
    except ConfigError as exc:
        name = shown_as or Path(path).name
        problems = exc.problems
        if shown_as:
            problems = [Problem(p.level, p.where.replace(str(Path(path)), shown_as),
                                p.message.replace(str(Path(path)), shown_as))
                        for p in problems]
        raise ActionError(f"{name} is not a valid config", problems) from None


def uploaded_name(path: str | Path) -> str:
    """The name the user's file had: Gradio keeps it as the temp copy's file name."""
    return Path(path).name


def save_named(ctx: AppContext, cfg: Config, name: str) -> Path:
    """Save the form as `<workspace>/configs/<name>.toml` (replacing one of that name)."""
    path = ctx.workspace / CONFIGS_DIR / f"{_checked_name(name)}.toml"
    save_config(cfg, path)
    return path


def _checked_name(name: str) -> str:
    name = (name or "").strip().removesuffix(".toml")
    if not NAME.match(name):
        raise ActionError(f"config name {name!r}: use letters, digits, '-', '_' or '.'")
    return name


def export(ctx: AppContext, cfg: Config, name: str) -> Path:
    """A file to download: the form's config as `<workspace>/configs/exports/<name>.toml`
    (the "Save as" name, so the download is called what the person asked for)."""
    path = ctx.workspace / CONFIGS_DIR / "exports" / f"{_checked_name(name)}.toml"
    save_config(cfg, path)
    return path


def remember(ctx: AppContext, cfg: Config) -> bool:
    """Save the form to `<workspace>/.ui-form.toml` (atomically) when it changed; True
    when written. A page refresh then restores it instead of an empty form."""
    path = ctx.workspace / FORM_FILE
    text = dumps_config(cfg)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    save_config(cfg, path)
    return True


def opening(ctx: AppContext) -> tuple[Config, list[str], bool]:
    """What the form shows when the page opens: (config, notes, restored). The form as
    last edited when there is one, else the demo preset loaded (its images generated)."""
    path, note = ctx.workspace / FORM_FILE, ""
    if path.is_file():
        try:
            return (load_config(path), [f"restored the form as you left it (kept in "
                                        f"{path} as you edit)"], True)
        except ConfigError as exc:
            note = f"{path} could not be read ({exc.problems[0].message}); "
    cfg, notes = load_source(ctx, DEMO)
    return cfg, [note + notes[0], *notes[1:]], False


def toml_text(cfg: Config) -> str:
    return dumps_config(cfg)
