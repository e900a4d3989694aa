"""Shared start-up for the programs `accelerate launch` runs: config, processes, model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.cache.stage import ProcessGroup
from core.config import Config, load_config, resolved, validate_config
from core.problems import ConfigError, errors


def load_resolved_config(config: Path, workspace: Path) -> Config | None:
    """The config with absolute paths, or None after printing why it cannot be used."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, flush=True)
        return None
    problems = errors(validate_config(cfg))
    for problem in problems:
        print(problem, flush=True)
    return None if problems else resolved(cfg, workspace)


def process_group(state: Any) -> ProcessGroup:
    """Wrap accelerate's PartialState or Accelerator."""
    return ProcessGroup(index=state.process_index, count=state.num_processes,
                        barrier=state.wait_for_everyone, device=state.device)


def load_model(cfg: Config, workspace: Path, state: Any, dtype: Any = None) -> tuple[Any, Any]:
    """The family and its loaded components; a tiny model is built once, by the main
    process, while the others wait."""
    from core.models.registry import get_family
    from core.models.tiny import resolve_model_path

    family = get_family(cfg.model.family)
    with state.main_process_first():
        path = resolve_model_path(cfg.model.path, workspace)
    components = family.load(path, dtype=dtype, device=state.device)
    return family, components


def load_for_caching(config: Path, workspace: Path) -> tuple[Config, Any, Any, ProcessGroup] | None:
    from accelerate import PartialState

    cfg = load_resolved_config(config, workspace)
    if cfg is None:
        return None
    state = PartialState(cpu=cfg.launch.cpu)
    family, components = load_model(cfg, workspace.absolute(), state)
    return cfg, family, components, process_group(state)

