"""ComfyUI base files as model.path (core/models/comfy_file.py): tiny Z-Image's
transformer written in ComfyUI's layout (`model.diffusion_model.` keys, fused attention
qkv, the inverse of diffusers' convert_z_image_transformer_checkpoint_to_diffusers) as
bf16, fp8 (float8_e4m3fn) and fp8_scaled (`scale_weight` / `scale_input` beside each
weight and the `scaled_fp8` marker), loaded through model.path with model.config = the
tiny folder. Offline (conftest sets HF_HUB_OFFLINE)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import small_config
from safetensors.torch import save_file

from core.check import run_check
from core.config import resolved
from core.models.quantize import quantized_layers
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

PREFIX = "model.diffusion_model."
FP8 = torch.float8_e4m3fn
RENAMES = (("all_final_layer.2-1.", "final_layer."), ("all_x_embedder.2-1.", "x_embedder."),
           (".attention.to_out.0.", ".attention.out."),
           (".attention.norm_k.", ".attention.k_norm."),
           (".attention.norm_q.", ".attention.q_norm."))


def comfy_layout(diffusers_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Z-Image's original (ComfyUI) names: q, k, v fused into attention.qkv, renamed."""
    out: dict[str, torch.Tensor] = {}
    for key, value in diffusers_sd.items():
        if ".attention.to_k." in key or ".attention.to_v." in key:
            continue
        if ".attention.to_q." in key:
            parts = [diffusers_sd[key.replace("to_q", n)] for n in ("to_q", "to_k", "to_v")]
            key, value = key.replace("to_q", "qkv"), torch.cat(parts)
        for old, new in RENAMES:
            key = key.replace(old, new)
        out[PREFIX + key] = value.to(torch.bfloat16).contiguous()
    return out


def _quantized(key: str, value: torch.Tensor) -> bool:
    """The weights ComfyUI's fp8 files store in fp8: the blocks' Linear weights."""
    return value.dim() == 2 and key.endswith(".weight") and any(
        f".{b}." in key for b in ("layers", "noise_refiner", "context_refiner"))


def fp8_layout(sd: dict[str, torch.Tensor], scaled: bool) -> dict[str, torch.Tensor]:
    out = dict(sd)
    for key, value in sd.items():
        if not _quantized(key, value):
            continue
        layer = key.removesuffix(".weight")
        scale = value.float().abs().max() / 448.0 if scaled else torch.tensor(1.0)
        out[key] = (value.float() / scale).to(FP8)
        if scaled:
            out[layer + ".scale_weight"] = scale.reshape(())
            out[layer + ".scale_input"] = torch.tensor(1.0)
    if scaled:
        out[PREFIX + "scaled_fp8"] = torch.empty(0, dtype=FP8)
    return out


@pytest.fixture(scope="module")
def files(tiny_workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"folder" (the tiny diffusers model) and one file per layout."""
    import diffusers

    folder = Path(resolve_model_path("tiny:z_image", tiny_workspace))
    out = tmp_path_factory.mktemp("comfy-base")
    model = diffusers.ZImageTransformer2DModel.from_pretrained(folder, subfolder="transformer")
    torch.manual_seed(0)  # the tiny model's 0.02-std weights are too alike to compare on
    for p in model.parameters():
        p.data.normal_(0, 0.3)
    sd = comfy_layout(model.state_dict())
    layouts = {"bf16": sd, "fp8": fp8_layout(sd, False), "fp8_scaled": fp8_layout(sd, True)}
    paths = {"folder": folder}
    for name, tensors in layouts.items():
        paths[name] = out / f"z_image_{name}.safetensors"
        save_file(tensors, str(paths[name]))
    return paths


def _prediction(files: dict[str, Path], name: str) -> tuple[torch.Tensor, object]:
    fam = get_family("z_image")
    c = fam.load(str(files[name]), dtype=torch.bfloat16, config=str(files["folder"]))
    texts = fam.encode_prompts(c, ["a red circle"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    sample = fam.noise_and_target(c, latents.to(torch.bfloat16),
                                  generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return fam.predict(c, sample, batch).float(), c


def test_bf16_fp8_and_fp8_scaled_files_load_and_predict_alike(files) -> None:
    want, _ = _prediction(files, "bf16")
    for name in ("fp8", "fp8_scaled"):
        got, c = _prediction(files, name)
        assert c.denoiser.dtype == torch.bfloat16 and not any(
            p.is_meta for p in c.denoiser.parameters()), name
        error = (got - want).abs().max() / want.abs().max()
        assert 0 < error < 0.15, (name, float(error))  # fp8's 3 mantissa bits


def test_unscaled_read_of_a_scaled_file_would_be_wrong(files) -> None:
    """What de-scaling buys: the scaled file's raw fp8 values are far from the weights."""
    from safetensors import safe_open

    key = PREFIX + "layers.0.attention.qkv.weight"
    with safe_open(str(files["fp8_scaled"]), "pt") as fh, safe_open(str(files["bf16"]),
                                                                      "pt") as ref:
        raw, want = fh.get_tensor(key).float(), ref.get_tensor(key).float()
        descaled = raw * fh.get_tensor(key.replace(".weight", ".scale_weight"))
    assert (raw - want).abs().max() > 10 * (descaled - want).abs().max()


def _config(tmp_path: Path, files: dict[str, Path], name: str):
    cfg = small_config(tmp_path, images=2, family="z_image")
    cfg.model.path, cfg.model.config = str(files[name]), str(files["folder"])
    return cfg


@pytest.mark.parametrize("name", ["fp8", "fp8_scaled"])
def test_a_file_of_fp8_weights_trains_as_fp8_and_is_estimated_at_one_byte(
        files, tmp_path, name) -> None:
    cfg = _config(tmp_path, files, name)
    assert resolved(cfg, tmp_path).model.quantize == "fp8"
    cfg.train.method = "full"
    assert resolved(cfg, tmp_path).model.quantize == "none", "a full fine-tune: unquantized"
    cfg.train.method, cfg.train.lora_kind = "lora", "dora"
    assert resolved(cfg, tmp_path).model.quantize == "none", "DoRA: an unquantized base"
    cfg.train.lora_kind = "lora"
    cfg.model.quantize = "int8"
    assert resolved(cfg, tmp_path).model.quantize == "int8", "the user's scheme wins"
    from core.memory.estimate import estimate_memory

    bf16 = dataclasses.replace(resolved(_config(tmp_path, files, "bf16"), tmp_path))
    file = estimate_memory(resolved(_config(tmp_path, files, name), tmp_path), tmp_path, [],
                           caches_built=False)
    bf16.model = dataclasses.replace(bf16.model, quantize="fp8")
    assert file.parts == estimate_memory(bf16, tmp_path, [], caches_built=False).parts
    bf16.model = dataclasses.replace(bf16.model, quantize="none")
    assert file.parts != estimate_memory(bf16, tmp_path, [], caches_built=False).parts


def test_a_lora_run_on_a_scaled_fp8_file_keeps_its_linears_in_fp8(files, tmp_path) -> None:
    """model.quantize stays "none" in the config: the file's fp8 implies it."""
    from test_quantize import assert_one_step_quantizes

    assert_one_step_quantizes(_config(tmp_path, files, "fp8_scaled"), tmp_path, "fp8")


def test_quantized_layers_counts_fp8_on_the_loaded_file(files) -> None:
    from core.models.quantize import quantize_frozen

    _, c = _prediction(files, "fp8_scaled")
    quantize_frozen(c.denoiser, "fp8", torch.device("cpu"))
    found = quantized_layers(c.denoiser)
    assert found["quantized"] == found["linear_layers"] > 10
    assert found["weight_types"] == {"Float8Tensor": found["linear_layers"]}


# ---------------------------------------------------------------- refused at check


def _model_errors(cfg, workspace: Path) -> list[str]:
    report = run_check(cfg, workspace, estimate=False)
    return [str(p) for p in report.problems
            if p.level == "error" and p.where.startswith("model.path")]


def _scaled_without_scales() -> dict[str, torch.Tensor]:
    """A Z-Image block in the fp8_scaled layout, marker kept, its scales left out."""
    block = {f"layers.0.{name}.weight": torch.randn(8, 8) for name in (
        "attention.to_q", "attention.to_k", "attention.to_v", "adaLN_modulation.0")}
    return {k: v for k, v in fp8_layout(comfy_layout(block), True).items()
            if not k.endswith((".scale_weight", ".scale_input"))}


def test_bad_base_files_are_refused_at_check_naming_model_path(files, tmp_path) -> None:
    scaled = _scaled_without_scales()
    bad = {
        "flux": ({PREFIX + "double_blocks.0.img_attn.qkv.weight": torch.zeros(8, 8)},
                 'looks like a flux checkpoint, not z_image'),
        "no-scales": (scaled, "holds no `scale_weight`"),
        "text-encoder": ({"model.embed_tokens.weight": torch.zeros(8, 8),
                          "model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8)},
                         "holds only a text encoder"),
        "vae": ({"decoder.conv_in.weight": torch.zeros(4, 4, 3, 3),
                 "encoder.conv_in.weight": torch.zeros(4, 3, 3, 3)}, "holds only a VAE"),
    }
    for name, (tensors, says) in bad.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        cfg = _config(tmp_path, files | {name: path}, name)
        [message] = _model_errors(cfg, tmp_path)
        assert message.startswith(f"error: model.path: {path}") and says in message, message


def test_check_says_the_fp8_it_implies(files, tmp_path, monkeypatch) -> None:
    """On a machine without an fp8 GPU the implied scheme is refused, saying where it
    came from; model.quantize = "int8" is then the user's way out."""
    from core.models import quantize

    monkeypatch.setattr(quantize, "_cuda_devices", lambda: [])
    cfg = _config(tmp_path, files, "fp8_scaled")
    [p] = [p for p in run_check(cfg, tmp_path, estimate=False).problems
           if p.where == "model.quantize"]
    assert p.level == "error" and p.message.startswith("model.path holds fp8 weights")
    cfg.model.quantize = "int8"
    assert not [p for p in run_check(cfg, tmp_path, estimate=False).problems
                if p.where.startswith("model.")]
