"""How many images the cache builder encodes at once, and what the estimate counts for
it: the encode's memory grows with its pixels (on an H200 Qwen-Image's VAE held 10.7 GiB
for 4 images at 1024 px beside a 15.4 GiB text encoder, past a 24 GB card)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO

from core.cache.build import _chunks
from core.cache.plan import VaeJob
from core.memory.activations import vae_encode_bytes, validation_bytes
from core.models.modules import vae_batch_size

GIB = 1024 ** 3


def _job(name: str, bucket: tuple[int, int], frames: int = 0) -> VaeJob:
    return VaeJob(dataset_id="a", image=Path(name), entry=Path(name + ".st"), bucket=bucket,
                  box=(*bucket, 0, 0), original_size=bucket[::-1], crop_top_left=(0, 0),
                  meta={}, frames=tuple(range(frames)))


def test_small_images_go_four_at_a_time_and_large_ones_one_at_a_time() -> None:
    assert vae_batch_size(512, 512) == 4
    assert vae_batch_size(768, 768) == 1
    assert vae_batch_size(1024, 1024) == 1
    assert vae_batch_size(256, 256) == 4  # never more than the builder's own limit
    assert vae_batch_size(512, 512, limit=2) == 2
    assert vae_batch_size(480, 832, frames=33) == 1  # a clip's 4-frame chunk counts
    assert vae_batch_size(4096, 4096) == 1  # at least one


def test_the_builder_chunks_each_bucket_by_its_own_size() -> None:
    jobs = [_job(f"s{i}", (512, 512)) for i in range(6)]
    jobs += [_job(f"l{i}", (1024, 1024)) for i in range(3)]
    sizes = sorted((len(c), c[0].bucket) for c in _chunks(jobs, 4))
    assert sizes == [(1, (1024, 1024))] * 3 + [(2, (512, 512)), (4, (512, 512))]


def _vae_config(family: str) -> dict:
    path = REPO / "core/models/families" / family / "full_size/vae/config.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_a_causal_vae_counts_the_frames_it_keeps_for_the_next_chunk() -> None:
    """Qwen-Image's VAE (base width 96) at 1024 px, 4 images in bf16: 10.66 GiB measured on
    an H200; a 2-D VAE of the same width counts under half of that."""
    qwen = _vae_config("qwen_image")
    flat = {**qwen, "_class_name": "AutoencoderKL", "block_out_channels": [96]}
    measured = 10.66 * GIB
    assert 0.95 * measured < vae_encode_bytes(qwen, 1024, 1024, 4, 2) < 1.05 * measured
    assert vae_encode_bytes(flat, 1024, 1024, 4, 2) < 0.5 * measured
    # validation: 4.16 GiB over the weights at 1024 px on the H200
    assert 0.95 * 4.16 * GIB < validation_bytes(qwen, 1024, 1024, 1, 2) < 1.05 * 4.16 * GIB


def test_no_cap_without_the_variable_or_without_a_cuda_gpu(monkeypatch) -> None:
    from core.models.modules import GPU_MEMORY_CAP_ENV, cap_gpu_memory

    monkeypatch.delenv(GPU_MEMORY_CAP_ENV, raising=False)
    assert cap_gpu_memory() is None
    monkeypatch.setenv(GPU_MEMORY_CAP_ENV, "23.5")
    import torch

    if not torch.cuda.is_available():
        assert cap_gpu_memory() is None
