"""Library notices that ask nothing of the user, kept out of the logs and the check's output.

Imports only logging: the check, the trainer and the cache builder all call in here before
the libraries that print the notices are imported.
"""

from __future__ import annotations

import logging

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


def drop_library_advisories() -> None:
    """Filter the ADVISORIES out for the rest of the process (once per logger, however
    often called)."""
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
