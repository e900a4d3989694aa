"""Optional libraries a process can leave out: peft and transformers import bitsandbytes
and torchao whenever they are installed, whether or not the run uses them. The trainer's
process and the headless CLI's (one config each, nothing else run afterwards) skip the
ones their config does not use, the cache builder and the captioner (which only encode)
skip both; the UI's process never does.

No imports of torch or of the rest of core: the callers use this before anything heavy,
and name the package of the run's optimizer (core/config/optimizers.py's
`optimizer_package`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


def unused_optional_libraries(optimizer_package: str, quantize: str) -> list[str]:
    """Installed libraries a run whose optimizer comes from `optimizer_package` ("": a
    program that steps none) and of this quantization does not use, which peft and
    transformers import anyway whenever they are installed: bitsandbytes (it imports
    torch's inductor: 0.5 s of a 4 s start-up on the 2-core test machine) serves its own
    optimizers and model.quantize = nf4; torchao (0.2 s) serves model.quantize = int8 and
    fp8."""
    unused = []
    if optimizer_package != "bitsandbytes" and quantize != "nf4":
        unused.append("bitsandbytes")
    if quantize not in ("int8", "fp8"):
        unused.append("torchao")
    return unused


def skip_libraries(names: list[str]) -> None:
    """Make `names` unimportable in this process: libraries that check for a package
    (importlib.util.find_spec) then see none. Only for a process of its own (the
    trainer's, the headless CLI's), never one that may run something else afterwards
    (tests, the UI)."""
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def leave_out_unused_libraries(optimizer_package: str, quantize: str) -> None:
    """skip_libraries of what a run of this optimizer's package and quantization does not
    use."""
    skip_libraries(unused_optional_libraries(optimizer_package, quantize))


@contextmanager
def loaded_outside_collections() -> Iterator[None]:
    """The libraries imported inside load with the garbage collector paused, and what they
    made is frozen after: torch, diffusers, transformers and peft leave about 600k objects
    that live as long as the process, and each full collection walked them all again
    (seven while the trainer imported them, 0.9 s of its start). Frozen objects are still
    freed when their last reference goes. For a process of its own only."""
    import gc

    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def preload_outside_collections(*names: str) -> None:
    """Import `names` (with what they import) inside loaded_outside_collections: for a
    program of its own whose run imports them later (the cache builder, the captioner)."""
    import importlib

    with loaded_outside_collections():
        for name in names:
            importlib.import_module(name)


def preload_for_encoding() -> None:
    """The start of a program that loads models only to encode (the cache builder, the
    captioner): it neither quantizes a model nor steps an optimizer, so bitsandbytes and
    torchao are left out (1 of the 4.6 CPU-s its imports took on the 2-core test
    machine), and diffusers and transformers (torch with them) load outside the
    collections. For a program of its own only."""
    skip_libraries(unused_optional_libraries("", "none"))
    preload_outside_collections("diffusers", "transformers")
