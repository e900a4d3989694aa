"""A model built while another thread of the same process builds on the meta device (the
UI's live checks and memory estimates, the run monitor) gets real weights: accelerate's
init_empty_weights patches torch for the whole process, so both go through one lock."""

from __future__ import annotations

import threading
from pathlib import Path


def test_a_tiny_model_built_during_a_memory_estimate_gets_real_weights(tmp_path: Path):
    import diffusers  # noqa: F401  (the build's imports take seconds: before the window)
    import torch
    import transformers  # noqa: F401
    from safetensors.torch import load_file

    from core.models.empty import empty_weights
    from core.models.tiny import build_tiny_folder

    inside, release = threading.Event(), threading.Event()

    def estimate() -> None:
        # Without buffers accelerate patches nn.Module.register_parameter process-wide
        # (as the LoRA-size and random:<family> estimates use it), not per thread.
        with empty_weights(include_buffers=False):
            inside.set()
            release.wait(30)

    worker = threading.Thread(target=estimate)
    worker.start()
    assert inside.wait(30)
    timer = threading.Timer(2.0, release.set)
    timer.start()
    try:
        build_tiny_folder("sd15", tmp_path / "model")  # waits for the estimate to end
    finally:
        release.set()
        worker.join(30)
        timer.cancel()
    weights = load_file(str(next((tmp_path / "model/unet").glob("*.safetensors"))))
    assert weights and all(t.device.type == "cpu" for t in weights.values())
    assert any(float(t.float().abs().sum()) > 0 for t in weights.values())
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu", "no patch left installed"
