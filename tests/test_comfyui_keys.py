"""Every family's ComfyUI LoRA file (lora_comfyui; sd15, sd2 and sdxl: lora_kohya) held to
ComfyUI's key layout (core/models/comfyui_layout.py; the names, read from ComfyUI 0.29.0's
comfy/lora.py and comfy/utils.py, in each family's comfyui_keys.py): each key of a tiny
model's file is a name ComfyUI's loader maps for that model with a suffix it reads, and
each module patches the weight change the diffusers file makes (a fused module: its
parts' changes stacked), with no diffusers module left out or carried twice. Tiny models,
no training: a LoRA with random non-zero up weights on every target ("all", the text
encoders' too where a family trains them), saved by the family (CPU, about a second a
family).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from core.models.adapters import adapter_config
from core.models.comfyui_layout import PLACEHOLDER, Layout, split_suffix
from core.models.registry import get_family, list_families
from core.models.tiny import resolve_model_path, tiny_family

# Every family ComfyUI has (each writes a file for it: a comfyui_keys.py in its folder), and
# the tiny variants whose files differ: Wan 2.2's two experts (a file each), I2V's
# cross-attention, HunyuanVideo 1.5 I2V. A family ComfyUI 0.29.0 does not have (FLUX.3,
# Qwen-Image 2.1) has no comfyui_keys.py and writes no such file.
WITHOUT_COMFYUI = [f for f in list_families()
                   if importlib.util.find_spec(f"core.models.families.{f}.comfyui_keys") is None]
FAMILIES = [f for f in list_families() if f not in WITHOUT_COMFYUI]
TINIES = [*FAMILIES, "wan22", "wan_i2v", "hunyuan_video15_i2v"]
RANK, ALPHA = 4, 8.0  # alpha != rank: a scale lost on the way shows
# (down, up) in diffusers files: peft's names, and the UNet's and text encoders' in sd15's
DIFFUSERS_SUFFIXES = ((".lora_A.weight", ".lora_B.weight"),
                      (".lora.down.weight", ".lora.up.weight"),
                      (".lora_linear_layer.down.weight", ".lora_linear_layer.up.weight"))


def layout_of(family: str) -> Layout:
    return importlib.import_module(f"core.models.families.{family}.comfyui_keys").LAYOUT


def adapted(tiny: str, workspace: Path, kind: str = "lora") -> tuple[object, object]:
    """The tiny model with a `kind` adapter on every target, its weights non-trivial."""
    fam = get_family(tiny_family(tiny))
    c = fam.load(resolve_model_path(f"tiny:{tiny}", workspace))
    c.denoiser.add_adapter(adapter_config(kind, RANK, ALPHA, fam.lora_target_modules("all")))
    encoders = [e for e in c.text_encoders if e is not None and fam.text_encoder_lora_targets]
    for encoder in encoders:
        encoder.add_adapter(adapter_config(kind, RANK, ALPHA, fam.text_encoder_lora_targets))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model in (c.denoiser, *encoders):
            for name, p in model.named_parameters():
                if p.requires_grad and "magnitude" not in name:
                    p.normal_(0, 0.2, generator=g)
    return fam, c


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def modules_of(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module: {suffix: tensor}}; a key without a suffix ComfyUI reads under ""."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        module, suffix = split_suffix(key) or ("", key)
        out.setdefault(module, {})[suffix] = value
    return out


def comfy_delta(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The change ComfyUI's LoRA adapter makes at strength 1: up @ down, times alpha / rank
    where `.alpha` is written (1 without it)."""
    up = t.get("lora_B.weight", t.get("lora_up.weight")).float().flatten(1)
    down = t.get("lora_A.weight", t.get("lora_down.weight")).float().flatten(1)
    scale = float(t["alpha"]) / down.shape[0] if "alpha" in t else 1.0
    return up @ down * scale  # a convolution's change flattened, as the diffusers one


def diffusers_deltas(path: Path) -> dict[str, torch.Tensor]:
    """{diffusers module: its change} from a diffusers file, scaled by the adapter config
    it carries as metadata (lora_alpha / r), as load_lora_weights applies it; the
    denoiser's modules without their "transformer." / "unet.", the text encoders' with
    "text_encoder." / "text_encoder_2."."""
    tensors, meta = read(path)
    # {"transformer.r": 4, "transformer.lora_alpha": 8.0, ...}: one model's config
    config = {k.split(".", 1)[1]: v for k, v in
              json.loads(meta["lora_adapter_metadata"]).items()}
    assert not config["alpha_pattern"] and not config["rank_pattern"]
    scale = config["lora_alpha"] / config["r"]
    out = {}
    for key in tensors:
        for down, up in DIFFUSERS_SUFFIXES:
            if key.endswith(down):
                module = key.removesuffix(down)
                change = tensors[module + up].float().flatten(1) @ tensors[key].float().flatten(1)
                out[module.removeprefix("transformer.").removeprefix("unet.")] = change * scale
    return out


def file_pairs(files: dict[str, Path]) -> list[tuple[Path, Path | None]]:
    """(ComfyUI file, its diffusers file) of each trained denoiser."""
    return [(path, files.get(name.replace("comfyui", "diffusers").replace("kohya", "diffusers")))
            for name, path in files.items() if name.startswith(("comfyui", "kohya"))]


def unmapped_keys(layout: Layout, tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k in tensors if split_suffix(k) is None
                  or layout.match(split_suffix(k)[0]) is None)


def test_every_family_declares_comfyuis_names() -> None:
    assert {"sd15", "flux", "wan", "hunyuan_video15", "ltx2"} <= set(FAMILIES)
    for family in FAMILIES:
        layout = layout_of(family)
        assert layout.names, family
        # the same block indices in the file's name and in each diffusers module
        assert all({PLACEHOLDER.findall(d) == PLACEHOLDER.findall(n.lora)
                    for d in n.diffusers} == {True} for n in layout.names)
        # a slice of a fused weight carries one module; a fused LoRA the whole weight
        assert all(n.part is None or (len(n.diffusers) == 1 and
                                      0 <= n.part[0] < n.part[1] <= n.part[2])
                   for n in layout.names)


@pytest.mark.parametrize("tiny", TINIES)
def test_comfyui_file_keys_are_names_comfyui_maps_with_the_diffusers_change(
        tiny: str, tmp_path: Path, tiny_workspace: Path) -> None:
    fam, c = adapted(tiny, tiny_workspace)
    layout = layout_of(fam.name)
    pairs = file_pairs(fam.save_lora(c, tmp_path))
    assert pairs
    for comfy_path, diffusers_path in pairs:
        tensors, _ = read(comfy_path)
        assert unmapped_keys(layout, tensors) == [], comfy_path.name
        want = diffusers_deltas(diffusers_path)
        carried: list[str] = []
        for module, t in modules_of(tensors).items():
            parts = layout.diffusers_of(module)
            carried += parts
            torch.testing.assert_close(comfy_delta(t), torch.cat([want[p] for p in parts]),
                                       msg=f"{comfy_path.name}: {module}")
        assert sorted(carried) == sorted(want)  # every module once, none left out


@pytest.mark.parametrize("family", WITHOUT_COMFYUI)
def test_a_family_comfyui_lacks_writes_no_comfyui_file(family: str, tmp_path: Path,
                                                       tiny_workspace: Path) -> None:
    fam, c = adapted(family, tiny_workspace)
    assert set(fam.save_lora(c, tmp_path)) == {"diffusers"}


def test_hunyuan_video15_fuses_qkv_as_comfyuis_model_holds_it(tmp_path: Path,
                                                              tiny_workspace: Path) -> None:
    fam, c = adapted("hunyuan_video15", tiny_workspace)
    tensors, _ = read(fam.save_lora(c, tmp_path)["comfyui"])
    fused = {layout_of("hunyuan_video15").match(split_suffix(k)[0])[0].weight
             for k in tensors if "qkv" in k}
    assert fused == {"double_blocks.{i}.img_attn.qkv", "double_blocks.{i}.txt_attn.qkv"}
    assert tensors["diffusion_model.double_blocks.0.img_attn_qkv.lora_A.weight"].shape[0] == \
        3 * RANK


# DoRA, LoKr and LoHa keep one module per diffusers module. ComfyUI takes them whole
# where it maps q, k and v apart or as slices of a fused weight; HunyuanVideo 1.5's map has
# neither, so there it drops their q/k/v (the check warns: below).
@pytest.mark.parametrize("tiny,kind", [("sdxl", "loha"), ("flux", "dora"), ("flux2", "lokr"),
                                       ("wan", "loha"), ("ltx2", "dora"),
                                       ("hunyuan_video15", "lokr")])
def test_other_kinds_keys_are_names_comfyui_maps(tiny: str, kind: str, tmp_path: Path,
                                                 tiny_workspace: Path) -> None:
    fam, c = adapted(tiny, tiny_workspace, kind)
    [(path, _)] = file_pairs(fam.save_lora(c, tmp_path))
    tensors, _ = read(path)
    dropped = {split_suffix(k)[0].rsplit(".", 1)[1]
               for k in unmapped_keys(layout_of(fam.name), tensors)}
    assert dropped == ({"img_attn_q", "img_attn_k", "img_attn_v", "txt_attn_q", "txt_attn_k",
                        "txt_attn_v"} if tiny == "hunyuan_video15" else set())


def test_hunyuan_video15_check_warns_a_kind_comfyui_takes_in_part() -> None:
    from core.config import Config

    cfg = Config()
    cfg.model.family, cfg.model.path = "hunyuan_video15", "tiny:hunyuan_video15"
    assert get_family("hunyuan_video15").config_problems(cfg) == []
    cfg.train.lora_kind = "loha"
    [problem] = get_family("hunyuan_video15").config_problems(cfg)
    assert (problem.level, problem.where) == ("warning", "train.lora_kind")
    assert "ComfyUI drops" in problem.message
