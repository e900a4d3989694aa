"""The streamed load (core/models/stream_load.py): a denoiser filled a layer at a time
where it runs gives the model today's path gives, and never holds the whole model in
host memory.

What "its device" means on a CPU: there is no GPU here, so the destination is the CPU,
which is also where today's path first loads everything. Placing unquantized weights
there would hold the same bytes either way, so the memory test loads into int8
(model.quantize, torchao on the CPU) from float32 (the training dtype of
mixed_precision "no"): today's path holds the whole float32 model and then quantizes it
(a second, int8 copy beside the first), the streamed one holds the int8 layers and one
float32 layer in flight. The model is random:wan's architecture cut to 5 of its 30
blocks (258 M parameters, 1.0 GiB in float32), built from a copy of its shipped configs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
WAN = REPO / "core/models/families/wan/full_size"


def _configs(folder: Path, **transformer: object) -> Path:
    """random:wan's configs with the transformer's changed by `transformer`."""
    import shutil

    shutil.copytree(WAN, folder)
    path = folder / "transformer/config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **transformer}))
    return folder


SMALL = {"num_layers": 3, "num_attention_heads": 2, "attention_head_dim": 16,
         "ffn_dim": 64, "text_dim": 32, "freq_dim": 32}


@pytest.fixture
def small_wan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """random:wan's transformer at a few thousand weights a block (the same classes)."""
    import core.models.full_size.meta as meta

    folder = _configs(tmp_path / "wan", **SMALL)
    monkeypatch.setattr(meta, "full_size_dir", lambda name: folder)
    return folder


def _forward(module: object) -> object:
    import torch

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 1, 8, 8, generator=gen)
    text = torch.randn(1, 4, SMALL["text_dim"], generator=gen)
    with torch.no_grad():
        return module(latents, torch.tensor([500]), text, return_dict=False)[0]


@pytest.mark.parametrize("scheme", ["none", "int8"])
def test_streamed_equals_built_then_placed_with_a_swapped_block(small_wan: Path,
                                                               scheme: str) -> None:
    import torch

    from core.models.block_swap import place_denoiser
    from core.models.full_size.build import build_module
    from core.models.stream_load import place_streamed, random_denoiser

    built = build_module("wan", "transformer", torch.float32, "cpu", seed=0)
    place_denoiser(built, [list(built.blocks)], 1, scheme, "cpu")
    streamed, stream = random_denoiser("wan", "transformer", torch.float32, seed=0)
    assert next(streamed.parameters()).device.type == "meta"
    place_streamed(streamed, stream, [streamed.blocks[0]], scheme, "cpu")
    assert not any(p.device.type == "meta" for p in streamed.parameters())
    assert not any(p.requires_grad for p in streamed.parameters())
    if scheme == "none":
        mine, theirs = streamed.state_dict(), built.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert type(streamed.blocks[0].attn1.to_q.weight) is type(built.blocks[0].attn1.to_q.weight)
    assert torch.equal(_forward(streamed), _forward(built))


def test_the_trainer_streams_random_models_and_says_why_others_load_whole() -> None:
    from core.config import apply_overrides, load_config
    from core.config.streaming import stream_fallback
    from core.presets import preset_path

    def cfg(*sets: str):
        return apply_overrides(load_config(preset_path("wan-lora")), list(sets))

    assert stream_fallback(cfg("model.path=random:wan")) is None
    assert stream_fallback(cfg("model.path=random:wan", "model.quantize=int8")) is None
    assert "hub source" in stream_fallback(cfg("model.path=Wan-AI/Wan2.1-T2V-1.3B-Diffusers"))
    assert "reads its denoiser itself" in stream_fallback(cfg("model.path=tiny:wan"))
    assert "full fine-tune" in stream_fallback(cfg("model.path=random:wan",
                                                   "train.method=full"))
    assert "bitsandbytes" in stream_fallback(cfg("model.path=random:wan",
                                                 "model.quantize=nf4"))


def test_place_for_training_fills_the_streamed_denoiser_with_its_swapped_blocks_on_the_host(
        small_wan: Path) -> None:
    import torch

    from core.config import apply_overrides, load_config
    from core.models.registry import get_family
    from core.models.stream_load import random_denoiser
    from core.presets import preset_path
    from core.train.swapping import loading_line, place_for_training

    cfg = apply_overrides(load_config(preset_path("wan-lora")), [
        "model.path=random:wan", "model.blocks_to_swap=2",
        "train.gradient_checkpointing=true"])
    module, stream = random_denoiser("wan", "transformer", torch.bfloat16, seed=0)
    c = SimpleNamespace(denoiser=module, denoiser_stream=stream)
    assert loading_line(c, None).startswith("denoiser: streamed from random:wan")
    place_for_training(get_family("wan"), c, cfg, "cpu")
    assert c.denoiser_stream is None
    assert {p.dtype for p in module.blocks[2].parameters()} == {torch.bfloat16}
    assert "loaded whole into host memory before it is placed (model.path is a" in loading_line(
        c, "model.path is a folder source")


def _child(mode: str, folder: Path, out: Path) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, str(REPO / "tests/stream_load_child.py"), mode,
                    str(folder), str(out)], check=True, env=env, cwd=REPO,
                   capture_output=True, timeout=300)
    return json.loads(out.read_text())


@pytest.mark.slow  # two children of about 20 s each on a loaded 2-core machine
def test_a_streamed_load_peaks_far_below_the_whole_model(tmp_path: Path) -> None:
    """Peak RSS (VmHWM) over the process's RSS before loading, against the model's
    float32 bytes: today's path holds all of it (and the int8 copy while quantizing),
    the streamed load the int8 weights (a quarter), one layer in flight with its
    quantization's temporaries and the meta build's buffers. Outputs are the same."""
    import torch

    folder = _configs(tmp_path / "wan", num_layers=5)
    model_bytes = 257_979_200 * 4  # its parameters, float32
    whole = _child("whole", folder, tmp_path / "whole.json")
    streamed = _child("streamed", folder, tmp_path / "streamed.json")
    grown = {name: (r["loaded_peak_kib"] - r["baseline_kib"]) * 1024
             for name, r in (("whole", whole), ("streamed", streamed))}
    assert grown["whole"] > 0.95 * model_bytes
    assert grown["streamed"] < 0.6 * model_bytes
    assert grown["streamed"] < 0.5 * grown["whole"]
    assert torch.equal(torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "streamed.pt"))


def _same_weights(a: object, b: object) -> bool:
    """Equal parameters, quantized ones compared by their int8 data and scales."""
    import torch

    mine, theirs = dict(a.named_parameters()), dict(b.named_parameters())
    if mine.keys() != theirs.keys():
        return False
    for name, x in mine.items():
        y = theirs[name]
        pairs = ([(x.qdata, y.qdata), (x.scale, y.scale)] if hasattr(x, "qdata")
                 else [(x, y)])
        if type(x) is not type(y) or not all(torch.equal(p, q) for p, q in pairs):
            return False
    return True


@pytest.mark.parametrize("scheme", ["none", "int8"])
def test_a_diffusers_folder_streams_to_the_weights_a_whole_load_places(
        tmp_path: Path, scheme: str) -> None:
    """tiny:flux's folder: its transformer read a tensor at a time from
    transformer/diffusion_pytorch_model.safetensors, two blocks swapped, gives the
    weights the whole load and place_with_swap give."""
    import contextlib

    import torch

    from core.config import apply_overrides, load_config
    from core.config.streaming import stream_fallback
    from core.models.tiny import resolve_model_path
    from core.presets import preset_path
    from core.startup import load_model
    from core.train.swapping import loading_line, place_for_training

    folder = resolve_model_path("tiny:flux", tmp_path)
    cfg = apply_overrides(load_config(preset_path("flux-lora")), [
        f"model.path={folder}", f"model.quantize={scheme}", "model.blocks_to_swap=1",
        "train.gradient_checkpointing=true"])
    assert stream_fallback(cfg) is None
    state = SimpleNamespace(device="cpu", main_process_first=contextlib.nullcontext)
    family, whole = load_model(cfg, tmp_path, state, dtype=torch.bfloat16)
    _, streamed = load_model(cfg, tmp_path, state, dtype=torch.bfloat16,
                             stream_denoiser=True)
    assert next(streamed.denoiser.parameters()).device.type == "meta"
    assert streamed.denoiser.dtype == torch.bfloat16
    assert loading_line(streamed, None).startswith(f"denoiser: streamed from {folder}")
    for c in (whole, streamed):
        place_for_training(family, c, cfg, "cpu")
    assert _same_weights(streamed.denoiser, whole.denoiser)


def test_a_family_with_its_own_loader_loads_a_folder_whole(tmp_path: Path) -> None:
    from core.config import apply_overrides, load_config
    from core.config.streaming import stream_fallback
    from core.presets import preset_path

    cfg = apply_overrides(load_config(preset_path("wan-lora")), [
        f"model.path={tmp_path}"])
    assert stream_fallback(cfg) == "the wan loader reads its denoiser itself"
