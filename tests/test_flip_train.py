"""datasets.N.flip in a real run (in-process, on the CPU): what each step batches is
the mirror image's latents for about half the samples and the image's own for the rest;
without flip, never the mirror's. (tests/test_cache.py proves the entry's mirror latents
are the VAE's encoding of the mirrored image; tests/test_buckets.py the check's warning
for captions that say left or right, and its refusal of flip on edit pairs.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import small_config, train_events

STEPS = 16  # batch 2: 32 samples


def trained_latents(tmp_path: Path, workspace: Path, flip: bool,
                    monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each training sample's latents as the step batches them (the eval's own batches
    are not counted), over a short run."""
    from core.train import stepping

    real = stepping.collate
    seen: list[Any] = []

    def spy(items: list[dict[str, Any]]) -> Any:
        seen.extend(item["latents"].detach().float().clone() for item in items)
        return real(items)

    monkeypatch.setattr(stepping, "collate", spy)
    cfg = small_config(tmp_path, images=4)
    cfg.datasets[0].flip = flip
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = STEPS, 1000, 1000
    train_events(cfg, tmp_path, workspace)
    monkeypatch.undo()
    return seen


def entries(tmp_path: Path) -> list[dict[str, Any]]:
    from core.cache.store import load_entry

    return [load_entry(p)[0] for p in sorted((tmp_path / "cache/vae0").glob("*.safetensors"))]


def which(row: Any, cached: list[dict[str, Any]]) -> str:
    """"own" or "mirror": the entry tensor `row` is (every sample is one of them)."""
    import torch

    for tensors in cached:
        for key, name in (("latents", "own"), ("flipped_latents", "mirror")):
            if key in tensors and torch.allclose(row, tensors[key].float(), atol=1e-5):
                return name
    raise AssertionError("a sample's latents are neither an image's nor its mirror's")


def test_a_flip_dataset_trains_on_the_mirror_image_about_half_the_time(
        tmp_path: Path, tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = trained_latents(tmp_path, tiny_workspace, True, monkeypatch)
    cached = entries(tmp_path)
    assert len(seen) == 2 * STEPS and all("flipped_latents" in t for t in cached)
    kinds = [which(row, cached) for row in seen]
    mirrored = kinds.count("mirror")
    assert 8 <= mirrored <= 24, f"{mirrored} of {len(kinds)} samples mirrored"


def test_without_flip_no_sample_is_mirrored(tmp_path: Path, tiny_workspace: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen = trained_latents(tmp_path, tiny_workspace, False, monkeypatch)
    cached = entries(tmp_path)
    assert not any("flipped_latents" in t for t in cached)
    assert {which(row, cached) for row in seen} == {"own"}
