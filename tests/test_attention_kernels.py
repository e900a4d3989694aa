"""The trainer, the cache builder and the captioner take cuDNN out of PyTorch's attention
kernels.

On an H200 (torch 2.11, cu130) Chroma's first backward stopped with cuDNN's
`mha_graph.execute(...).is_good()` (core/models/modules.py: avoid_cudnn_attention says why).
That failure needs a Hopper GPU; what this CPU machine can check is that the programs
that run models on the GPU turn the kernel off before their first attention. The switch
is process-wide, so each test turns it back on first and leaves it as it found it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import small_config, step_losses


@pytest.fixture
def cudnn_attention_on() -> Iterator[None]:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_trainer_turns_cudnn_attention_off(tmp_path: Path, cudnn_attention_on: None):
    losses = step_losses(tmp_path, 1, family="chroma")

    assert len(losses) == 1
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_the_cache_builder_turns_cudnn_attention_off(tmp_path: Path, cudnn_attention_on: None):
    from core.cache.main import load_for_caching
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="chroma")
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")

    assert load_for_caching(tmp_path / "config.toml", tmp_path) is not None
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_the_captioner_turns_cudnn_attention_off(tmp_path: Path, cudnn_attention_on: None):
    from core.caption.model import load_captioner
    from core.caption.tiny import build_tiny_blip

    captioner = load_captioner(str(build_tiny_blip(tmp_path / "blip")), cpu=True)

    assert captioner is not None
    assert not torch.backends.cuda.cudnn_sdp_enabled()
