"""`resolved`: a config's copy with every path joined to the workspace and what it leaves
to the family (a frame rate of 0) set to the family's own (what the check, the estimate
and the trainer read), and `resolve_path` for one path."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path

from core.config.schema import SECTION_TYPES, Config
from core.models.registry import family_or_defaults
from core.models.source import model_source


def resolve_path(value: str, workspace: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else workspace / p


def resolved(cfg: Config, workspace: str | Path) -> Config:
    """A copy with every path field absolute (relative ones joined to the workspace), and
    what the config leaves to the family set to the family's own (the frame rates).

    `model.path` and `model.config` are joined only when they name something that exists
    there, because they may also be hub ids such as `org/model`, or `tiny:sd15`.
    """
    workspace = Path(workspace).expanduser().absolute()
    out = dataclasses.replace(cfg)
    for name in SECTION_TYPES:
        setattr(out, name, dataclasses.replace(getattr(cfg, name)))
    out.datasets = [dataclasses.replace(ds) for ds in cfg.datasets]
    for obj in (*(getattr(out, name) for name in SECTION_TYPES), *out.datasets):
        for f in fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("kind") == "path" and value:
                setattr(obj, f.name, [_resolve_paths(v, workspace) for v in value]
                        if isinstance(value, list) else str(resolve_path(value, workspace)))
    for part, f in [(p, f) for p in (out.model, out.validation) for f in fields(p)]:
        if f.metadata.get("kind") == "model_path":  # model.path, .config, validation.model
            setattr(part, f.name, _resolve_model_path(getattr(part, f.name), workspace))
    from core.models.comfy_file import implied_quantize

    # Set here, where check, estimate and trainer all read the config: a file of fp8
    # weights trains as model.quantize = "fp8" (core/models/comfy_file.py), and a clip
    # rate of 0 is the family's (datasets.N.fps, validation.fps).
    out.model.quantize = implied_quantize(out.model.path, out.model.quantize,
                                          out.train.method, out.train.lora_kind)
    rate = family_or_defaults(out.model.family).geometry.fps or 0.0
    for part in (*out.datasets, out.validation):
        part.fps = part.fps or rate
    return out


def _resolve_paths(value: str, workspace: Path) -> str:
    """A list entry of paths separated by "|" (a prompt's control images), each resolved;
    an empty one stays empty (a prompt drawn without control images), not the workspace."""
    return "|".join(str(resolve_path(v.strip(), workspace)) if v.strip() else ""
                    for v in value.split("|"))


def _resolve_model_path(value: str, workspace: Path) -> str:
    """model.path or model.config: joined to the workspace only when it names something
    there (or is absolute); otherwise a hub id, kept. tiny:/random: name built models,
    never files (a folder called "random:sd15" in the workspace must not capture them)."""
    if not value or model_source(value).built:
        return value
    candidate = resolve_path(value, workspace)
    if Path(value).expanduser().is_absolute() or candidate.exists():
        return str(candidate)
    return value
