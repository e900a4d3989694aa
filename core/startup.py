"""Start-up shared by the programs `accelerate launch` runs (the trainer and the cache
builder): read the run's config, describe the process group, load the model.

Nothing heavy at module level: accelerate and the model code load inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Config, load_config, resolved, validate_config
from core.problems import ConfigError, errors

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily


@dataclass
class ProcessGroup:
    """Who this process is among the launched ones, and how to wait for the others."""

    index: int = 0
    count: int = 1
    barrier: Callable[[], None] = lambda: None
    device: Any = "cpu"

    @property
    def is_main(self) -> bool:
        return self.index == 0


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


def load_model(cfg: Config, workspace: Path, state: Any, dtype: Any = None,
               device: Any = None, stream_denoiser: bool = False
               ) -> tuple[ModelFamily, Components]:
    """The family and its components, loaded in `dtype` onto `device` (the process's
    device when None); a tiny model is built once, by the main process, while the
    others wait. `random:<family>` is built straight onto `device` by every process (no
    files: the same seed gives every process the same weights); with `stream_denoiser`
    its denoiser waits on the meta device to be filled where it is placed
    (core/models/stream_load.py; config/streaming.py says when). A single file reads its
    architecture from model.config; model.prediction_type then sets the target."""
    from core.models.registry import get_family
    from core.models.source import model_source
    from core.models.tiny import resolve_model_path

    family = get_family(cfg.model.family)
    device = state.device if device is None else device
    if model_source(cfg.model.path).kind == "random":
        from core.models.full_size.build import build_random
        from core.models.full_size.spec import check_random_source
        from core.models.loading import ModelLoadError

        # Refused as `--stage check` refuses it: another family's or an unknown model.
        for problem in check_random_source(cfg.model.path, cfg.model.family):
            raise ModelLoadError(problem.where, problem.message)
        components = build_random(model_source(cfg.model.path).name, dtype, device,
                                  stream_denoiser=stream_denoiser)
    else:
        with state.main_process_first():
            path = resolve_model_path(cfg.model.path, workspace)
            # model.config may be tiny:<name> too (a tiny folder describing a tiny file).
            config = resolve_model_path(cfg.model.config, workspace) or None
        components = _load_source(family, path, dtype, device, config, stream_denoiser)
    family.set_prediction_type(components, cfg.model.prediction_type)
    return family, components


def _load_source(family: ModelFamily, path: str, dtype: Any, device: Any, config: str | None,
                 stream: bool) -> Components:
    """`family.load`, given the folder's transformer on the meta device when it streams
    (core/models/stream_files.py); a folder that cannot stream loads whole, as before,
    and the log says why."""
    from core.config.streaming import loads_given_denoiser
    from core.models.source import model_source

    if not (stream and model_source(path).kind == "folder"
            and loads_given_denoiser(family.name)):
        return family.load(path, dtype=dtype, device=device, config=config)
    from core.models.stream_files import folder_denoiser

    got = folder_denoiser(path, "transformer", dtype)
    if isinstance(got, str):
        print(f"denoiser: {path} does not stream ({got}); it loads whole", flush=True)
        return family.load(path, dtype=dtype, device=device, config=config)
    module, streamed = got
    components = family.load(path, dtype=dtype, device=device, config=config,  # type: ignore[call-arg]
                             denoiser=module)
    components.denoiser_stream = streamed
    return components
