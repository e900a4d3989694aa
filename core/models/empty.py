"""accelerate's `init_empty_weights`, one thread at a time.

It patches torch.nn.Module for the whole process while it runs. Two threads inside at
once can leave the patch installed for good (each restores what it found on entry), and
a model another thread builds meanwhile gets meta weights ("Cannot copy out of meta
tensor" when it is saved). The UI process builds meta models in several threads (live
checks and memory estimates, the run monitor's check before a queued launch) and real
tiny models too, so every such build holds MODEL_BUILD_LOCK.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

MODEL_BUILD_LOCK = threading.RLock()


@contextlib.contextmanager
def empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """`init_empty_weights(include_buffers)` under MODEL_BUILD_LOCK."""
    from accelerate import init_empty_weights

    with MODEL_BUILD_LOCK, init_empty_weights(include_buffers=include_buffers):
        yield
