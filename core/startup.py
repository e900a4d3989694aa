"""Start-up shared by the programs `accelerate launch` runs (the trainer and the cache
builder): read the run's config, describe the process group, load the model.

Nothing heavy at module level: accelerate and the model code load inside the functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Config, load_config, resolved, validate_config
from core.problems import ConfigError, errors

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily


# Advisories the libraries log on every run that ask nothing of the user (by logger and
# a piece of the message): transformers falls back to its PIL image processors without
# torchvision (the pipelines here never process images with them), and diffusers cannot
# register torchao's tensor types for torchao-serialized checkpoints (never loaded here:
# model.quantize quantizes in memory). Anything else these loggers say still shows.
ADVISORIES = (
    ("transformers.utils.import_utils", "requires torchvision (not installed); falling back"),
    ("diffusers.quantizers.torchao.torchao_quantizer",
     "Unable to import `torchao` Tensor objects"),
    # bitsandbytes (adamw8bit, nf4) on a CPU with AVX-512 BF16, when diffusers imports it:
    # an optional 4-bit CPU kernel from the hub, which nothing here uses.
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
)


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_library_notices() -> None:
    """Keep train.log, cache.log and caption.log readable: import notices (torchao's CUDA
    extensions, torch about torchao's enums) at ERROR only, and the ADVISORIES dropped.
    For the launched programs, which own their process's logging."""
    from core.models.memory import IMPORT_NOISE_LOGGERS

    for name in IMPORT_NOISE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name, text in ADVISORIES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.text == text for f in logger.filters):
            logger.addFilter(_DropMessage(text))


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
               device: Any = None) -> tuple[ModelFamily, Components]:
    """The family and its components, loaded in `dtype` onto `device` (the process's
    device when None); a tiny model is built once, by the main process, while the
    others wait. `random:<family>` is built straight onto `device` by every process (no
    files: the same seed gives every process the same weights). A single file reads its
    architecture from model.config; model.prediction_type then sets the target."""
    from core.models.full_size import RANDOM_PREFIX
    from core.models.registry import get_family
    from core.models.tiny import resolve_model_path

    family = get_family(cfg.model.family)
    device = state.device if device is None else device
    if cfg.model.path.startswith(RANDOM_PREFIX):
        from core.models.full_size.build import build_random
        from core.models.full_size.spec import check_random_source
        from core.models.loading import ModelLoadError

        # Refused as `--stage check` refuses it: another family's or an unknown model.
        for problem in check_random_source(cfg.model.path, cfg.model.family):
            raise ModelLoadError(problem.where, problem.message)
        components = build_random(cfg.model.family, dtype, device)
    else:
        with state.main_process_first():
            path = resolve_model_path(cfg.model.path, workspace)
            # model.config may be tiny:<name> too (a tiny folder describing a tiny file).
            config = resolve_model_path(cfg.model.config, workspace) or None
        components = family.load(path, dtype=dtype, device=device, config=config)
    family.set_prediction_type(components, cfg.model.prediction_type)
    return family, components
