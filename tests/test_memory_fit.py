"""The fix that makes a plan fit (core/memory/fit.py): every change it names, applied
together, brings each phase 1.5 GiB under the card, as the card presets keep; the cache
build over the card alone asks for streamed text encoders and no swap; a swap that
would pin more than the machine's RAM is no fit. The check prints it as --set items."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_shapes

from core.config import apply_overrides, load_config, resolved
from core.memory.estimate import estimate_memory
from core.memory.fit import FIT_MARGIN
from core.presets import preset_path

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fit")
    write_shapes(folder / "data/mydata", 2)
    return folder


def _estimate(workspace: Path, preset: str, path: str, *sets: str):
    cfg = apply_overrides(load_config(preset_path(preset)),
                          [f"model.path={path}", "launch.host_memory_gib=512", *sets])
    return cfg, estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)


def _phases(estimate) -> int:
    return max(estimate.training_bytes, estimate.validation_bytes, estimate.caching_bytes)


@pytest.mark.parametrize(("preset", "path", "card", "sets"), [
    ("qwen-image-lora", "random:qwen_image", 24, ()),
    ("qwen-image-lora", "random:qwen_image", 16, ()),
    ("chroma-lora", "random:chroma", 12, ("train.gradient_checkpointing=false",)),
    ("flux2-lora", "random:flux2:dev", 24, ("model.quantize=none",)),
], ids=["qwen24", "qwen16", "chroma12-no-checkpointing", "flux2dev24-bf16"])
def test_every_change_applied_together_fits_with_the_presets_margin(
        workspace: Path, preset: str, path: str, card: int, sets: tuple[str, ...]) -> None:
    cfg, before = _estimate(workspace, preset, path, f"launch.gpu_memory_gib={card}", *sets)
    assert _phases(before) > card * GIB and before.fit is not None
    items = before.fit.set_items()
    assert f"  to fit: {' '.join('--set ' + i for i in items)}" in before.lines()
    _, after = _estimate(workspace, preset, path, f"launch.gpu_memory_gib={card}", *sets,
                         *items)
    assert _phases(after) <= card * GIB - FIT_MARGIN, after.lines()
    assert after.fit is None and not any("planned GPU" in x for x in after.lines())
    if "train.gradient_checkpointing=false" in sets:
        assert "train.gradient_checkpointing=true" in items


def test_a_cache_build_over_the_card_alone_streams_and_swaps_nothing(workspace: Path) -> None:
    _, before = _estimate(workspace, "flux2-dev-lora-24gb", "random:flux2:dev",
                          "launch.gpu_memory_gib=24", "model.stream_text_encoders=false")
    assert before.caching_bytes > 24 * GIB >= before.training_bytes
    assert before.fit.changes == {"model.stream_text_encoders": True}
    assert before.swap_fit is None


def test_a_swap_that_pins_more_than_the_ram_is_no_fit_and_int8_comes_next(
        workspace: Path) -> None:
    """FLUX.2-dev in bf16 on a 24 GB card: swapping alone needs about 40 GiB pinned; on a
    machine of 64 GiB the fit quantizes the base to int8 first."""
    _, roomy = _estimate(workspace, "flux2-lora", "random:flux2:dev",
                         "launch.gpu_memory_gib=24", "model.quantize=none")
    assert "model.quantize" not in roomy.fit.changes
    assert roomy.fit.host_pinned_bytes > 30 * GIB
    _, small = _estimate(workspace, "flux2-lora", "random:flux2:dev",
                         "launch.gpu_memory_gib=24", "model.quantize=none",
                         "launch.host_memory_gib=80")
    assert small.fit.changes["model.quantize"] == "int8"
    assert small.fit.host_pinned_bytes < roomy.fit.host_pinned_bytes
