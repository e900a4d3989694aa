"""Library notices that ask nothing of the user, kept out of the logs and the check's output.

Imports only the standard library: the check, the trainer and the cache builder all call
in here before the libraries that print the notices are imported. `quiet_libraries` lives
here, below core.models, because both the model loading and the memory estimate use it
(in the memory estimate it made an import circle: loading -> memory -> loading).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

# Loggers whose import-time notices (torchao's CUDA extensions, torch about torchao's
# enums) show at ERROR only.
IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")

# Advisories the libraries log on every run (by logger and a piece of the message):
# transformers falls back to its PIL image processors without torchvision (the pipelines
# here never process images with them), and diffusers cannot register torchao's tensor
# types for torchao-serialized checkpoints (never loaded here: model.quantize quantizes in
# memory). Anything else these loggers say still shows.
ADVISORIES = (
    ("transformers.utils.import_utils", "requires torchvision (not installed); falling back"),
    ("diffusers.quantizers.torchao.torchao_quantizer",
     "Unable to import `torchao` Tensor objects"),
    # bitsandbytes (its 8-bit optimizer, nf4) on a CPU with AVX-512 BF16, when diffusers imports it:
    # an optional 4-bit CPU kernel from the hub, which nothing here uses.
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
)


# Deprecations the libraries warn about in their own code, not in this tool's (by the
# start of the message): diffusers' Chroma transformer builds the FluxPosEmbed that
# diffusers itself has deprecated, on every Chroma load and check.
LIBRARY_DEPRECATIONS = ("`FluxPosEmbed` is deprecated",)


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def drop_library_advisories() -> None:
    """Filter the ADVISORIES and the LIBRARY_DEPRECATIONS out for the rest of the process
    (once per logger, however often called)."""
    for message in LIBRARY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    for name, text in ADVISORIES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.text == text for f in logger.filters):
            logger.addFilter(_DropMessage(text))


def quiet_library_notices() -> None:
    """Keep train.log, cache.log and caption.log readable: the import notices at ERROR only
    and the ADVISORIES dropped. For the launched programs, which own their process's
    logging."""
    for name in IMPORT_NOISE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    drop_library_advisories()


_QUIET_ENV = {"DIFFUSERS_VERBOSITY": "error", "TRANSFORMERS_VERBOSITY": "error",
              "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Meta-device models (and a tiny model built in a temporary folder) make diffusers,
    transformers and torchao print import notices and progress bars that would bury the
    check's own output; the environment is put back for the processes launched after."""
    saved = {key: os.environ.get(key) for key in _QUIET_ENV}
    os.environ.update(_QUIET_ENV)
    drop_library_advisories()
    loggers = {name: logging.getLogger(name).level for name in IMPORT_NOISE_LOGGERS}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        levels = diffusers_logging.get_verbosity(), transformers_logging.get_verbosity()
        bars = (diffusers_logging.is_progress_bar_enabled(),
                transformers_logging.is_progress_bar_enabled())
        diffusers_logging.set_verbosity_error()
        transformers_logging.set_verbosity_error()
        diffusers_logging.disable_progress_bar()
        transformers_logging.disable_progress_bar()
        try:
            yield
        finally:
            diffusers_logging.set_verbosity(levels[0])
            transformers_logging.set_verbosity(levels[1])
            if bars[0]:
                diffusers_logging.enable_progress_bar()
            if bars[1]:
                transformers_logging.enable_progress_bar()
    finally:
        for name, level in loggers.items():
            logging.getLogger(name).setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
