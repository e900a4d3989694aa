"""Tiny diffusers transformers written back in the layout of ComfyUI's diffusion-model
files (`model.diffusion_model.` + the model's original names), per family: the inverse
of the converter each family's file goes through (diffusers' convert_*_to_diffusers in
diffusers/loaders/single_file_utils.py, or the family's own mapping), and the fp8 /
fp8_scaled forms of such a file (ComfyUI's comfy/utils.py convert_old_quants names:
`<layer>.scale_weight`, `<layer>.scale_input`, the `scaled_fp8` marker).

Each layout is a table of (diffusers key regex, original key template, part): keys with
a part are stacked along dim 0 in part order into one fused original weight (q, k, v
into qkv)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

PREFIX = "model.diffusion_model."
FP8 = torch.float8_e4m3fn
Rule = tuple[str, str, int | None]


def remap(state: dict[str, torch.Tensor], rules: list[Rule],
          keep: bool = False) -> dict[str, torch.Tensor]:
    """`state` renamed by `rules` (the first full match wins); a key no rule matches is
    kept as it is when `keep`, else an error (the table is incomplete)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        for pattern, template, part in rules:
            match = re.fullmatch(pattern, key)
            if match:
                name = match.expand(template)
                if part is None:
                    out[name] = value
                else:
                    parts.setdefault(name, {})[part] = value
                break
        else:
            assert keep, f"no rule for {key}"
            out[key] = value
    for name, pieces in parts.items():
        out[name] = torch.cat([pieces[i] for i in sorted(pieces)])
    return out


def swap_halves(value: torch.Tensor) -> torch.Tensor:
    """diffusers' (scale, shift) <-> the originals' (shift, scale)."""
    first, second = value.chunk(2, dim=0)
    return torch.cat([second, first])


P = r"\.(weight|bias)"
T, S = r"transformer_blocks\.(\d+)\.", r"single_transformer_blocks\.(\d+)\."
D, SB = r"double_blocks.\1.", r"single_blocks.\1."

FLUX_COMMON: list[Rule] = [
    (r"context_embedder" + P, r"txt_in.\1", None),
    (r"x_embedder" + P, r"img_in.\1", None),
    (r"proj_out" + P, r"final_layer.linear.\1", None),
    *[(T + rf"attn\.to_{x}" + P, D + r"img_attn.qkv.\2", i) for i, x in enumerate("qkv")],
    *[(T + rf"attn\.add_{x}_proj" + P, D + r"txt_attn.qkv.\2", i)
      for i, x in enumerate("qkv")],
    (T + r"attn\.norm_q\.weight", D + "img_attn.norm.query_norm.scale", None),
    (T + r"attn\.norm_k\.weight", D + "img_attn.norm.key_norm.scale", None),
    (T + r"attn\.norm_added_q\.weight", D + "txt_attn.norm.query_norm.scale", None),
    (T + r"attn\.norm_added_k\.weight", D + "txt_attn.norm.key_norm.scale", None),
    (T + r"ff\.net\.0\.proj" + P, D + r"img_mlp.0.\2", None),
    (T + r"ff\.net\.2" + P, D + r"img_mlp.2.\2", None),
    (T + r"ff_context\.net\.0\.proj" + P, D + r"txt_mlp.0.\2", None),
    (T + r"ff_context\.net\.2" + P, D + r"txt_mlp.2.\2", None),
    (T + r"attn\.to_out\.0" + P, D + r"img_attn.proj.\2", None),
    (T + r"attn\.to_add_out" + P, D + r"txt_attn.proj.\2", None),
    *[(S + rf"attn\.to_{x}" + P, SB + r"linear1.\2", i) for i, x in enumerate("qkv")],
    (S + r"proj_mlp" + P, SB + r"linear1.\2", 3),
    (S + r"attn\.norm_q\.weight", SB + "norm.query_norm.scale", None),
    (S + r"attn\.norm_k\.weight", SB + "norm.key_norm.scale", None),
    (S + r"proj_out" + P, SB + r"linear2.\2", None),
]
FLUX: list[Rule] = [
    *[(rf"time_text_embed\.{d}\.linear_{n}" + P, rf"{o}.{layer}.\1", None)
      for d, o in (("timestep_embedder", "time_in"), ("text_embedder", "vector_in"),
                   ("guidance_embedder", "guidance_in"))
      for n, layer in ((1, "in_layer"), (2, "out_layer"))],
    (r"norm_out\.linear" + P, r"final_layer.adaLN_modulation.1.\1", None),
    (T + r"norm1\.linear" + P, D + r"img_mod.lin.\2", None),
    (T + r"norm1_context\.linear" + P, D + r"txt_mod.lin.\2", None),
    (S + r"norm\.linear" + P, SB + r"modulation.lin.\2", None),
    *FLUX_COMMON,
]
G = r"distilled_guidance_layer\."
CHROMA: list[Rule] = [
    (G + r"((in|out)_proj" + P + ")", r"distilled_guidance_layer.\1", None),
    (G + r"layers\.(\d+)\.linear_1" + P, r"distilled_guidance_layer.layers.\1.in_layer.\2",
     None),
    (G + r"layers\.(\d+)\.linear_2" + P, r"distilled_guidance_layer.layers.\1.out_layer.\2",
     None),
    (G + r"norms\.(\d+)\.weight", r"distilled_guidance_layer.norms.\1.scale", None),
    *FLUX_COMMON,
]
J = r"joint_blocks.\1."
SD3: list[Rule] = [
    (r"pos_embed\.pos_embed", "pos_embed", None),
    (r"pos_embed\.proj" + P, r"x_embedder.proj.\1", None),
    *[(rf"time_text_embed\.{d}\.linear_{n}" + P, rf"{o}.mlp.{m}.\1", None)
      for d, o in (("timestep_embedder", "t_embedder"), ("text_embedder", "y_embedder"))
      for n, m in ((1, 0), (2, 2))],
    (r"context_embedder" + P, r"context_embedder.\1", None),
    (r"proj_out" + P, r"final_layer.linear.\1", None),
    (r"norm_out\.linear" + P, r"final_layer.adaLN_modulation.1.\1", None),
    *[(T + rf"attn\.to_{x}" + P, J + r"x_block.attn.qkv.\2", i) for i, x in enumerate("qkv")],
    *[(T + rf"attn2\.to_{x}" + P, J + r"x_block.attn2.qkv.\2", i)
      for i, x in enumerate("qkv")],
    *[(T + rf"attn\.add_{x}_proj" + P, J + r"context_block.attn.qkv.\2", i)
      for i, x in enumerate("qkv")],
    *[(T + rf"{a}\.norm_{x}\.weight", J + rf"x_block.{a}.ln_{x}.weight", None)
      for a in ("attn", "attn2") for x in "qk"],
    *[(T + rf"attn\.norm_added_{x}\.weight", J + rf"context_block.attn.ln_{x}.weight", None)
      for x in "qk"],
    (T + r"attn\.to_out\.0" + P, J + r"x_block.attn.proj.\2", None),
    (T + r"attn2\.to_out\.0" + P, J + r"x_block.attn2.proj.\2", None),
    (T + r"attn\.to_add_out" + P, J + r"context_block.attn.proj.\2", None),
    (T + r"norm1\.linear" + P, J + r"x_block.adaLN_modulation.1.\2", None),
    (T + r"norm1_context\.linear" + P, J + r"context_block.adaLN_modulation.1.\2", None),
    *[(T + rf"{f}\.net\.{n}{proj}" + P, J + rf"{b}.mlp.fc{m}.\2", None)
      for f, b in (("ff", "x_block"), ("ff_context", "context_block"))
      for n, proj, m in ((0, r"\.proj", 1), (2, "", 2))],
]
# convert_krea2_transformer_checkpoint_to_diffusers' renames, original -> diffusers.
KREA2_TOP = {"first.": "img_in.", "tmlp.0.": "time_embed.linear_1.",
             "tmlp.2.": "time_embed.linear_2.", "tproj.1.": "time_mod_proj.",
             "txtmlp.0.scale": "txt_in.norm.weight", "txtmlp.1.": "txt_in.linear_1.",
             "txtmlp.3.": "txt_in.linear_2.", "txtfusion.": "text_fusion.",
             "last.linear.": "final_layer.linear.", "last.norm.scale": "final_layer.norm.weight",
             "last.modulation.lin": "final_layer.scale_shift_table"}
KREA2_BLOCK = {".attn.wq.": ".attn.to_q.", ".attn.wk.": ".attn.to_k.",
               ".attn.wv.": ".attn.to_v.", ".attn.wo.": ".attn.to_out.0.",
               ".attn.gate.": ".attn.to_gate.", ".attn.qknorm.qnorm.scale": ".attn.norm_q.weight",
               ".attn.qknorm.knorm.scale": ".attn.norm_k.weight", ".mlp.": ".ff.",
               ".prenorm.scale": ".norm1.weight", ".postnorm.scale": ".norm2.weight",
               ".mod.lin": ".scale_shift_table"}
# convert_ltx2_transformer_to_diffusers' renames, diffusers -> original (its own order
# makes "audio_patchify_proj" audio_proj_in through the "patchify_proj" rule).
LTX2 = (("audio_time_embed.", "audio_adaln_single."), ("time_embed.", "adaln_single."),
        ("proj_in", "patchify_proj"),
        ("av_cross_attn_video_scale_shift", "av_ca_video_scale_shift_adaln_single"),
        ("av_cross_attn_video_a2v_gate", "av_ca_a2v_gate_adaln_single"),
        ("av_cross_attn_audio_scale_shift", "av_ca_audio_scale_shift_adaln_single"),
        ("av_cross_attn_audio_v2a_gate", "av_ca_v2a_gate_adaln_single"),
        ("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
        ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
        ("norm_q", "q_norm"), ("norm_k", "k_norm"))


R, RB = r"context_embedder\.token_refiner\.refiner_blocks\.(\d+)\.", \
    r"txt_in.individual_token_refiner.blocks.\1."
C = r"context_embedder\.time_text_embed\."
# diffusers' scripts/convert_hunyuan_video1_5_to_diffusers.py backwards, double blocks'
# q, k and v fused as ComfyUI's file holds them (comfy/ldm/hunyuan_video/model.py).
HUNYUAN_VIDEO15: list[Rule] = [
    (r"x_embedder\.proj" + P, r"img_in.proj.\1", None),
    *[(rf"time_embed\.timestep_embedder\.linear_{n}" + P, rf"time_in.mlp.{m}.\1", None)
      for n, m in ((1, 0), (2, 2))],
    (r"context_embedder\.proj_in" + P, r"txt_in.input_embedder.\1", None),
    *[(C + rf"timestep_embedder\.linear_{n}" + P, rf"txt_in.t_embedder.mlp.{m}.\1", None)
      for n, m in ((1, 0), (2, 2))],
    *[(C + rf"text_embedder\.linear_{n}" + P, rf"txt_in.c_embedder.linear_{n}.\1", None)
      for n in (1, 2)],
    *[(R + rf"attn\.to_{x}" + P, RB + r"self_attn_qkv.\2", i) for i, x in enumerate("qkv")],
    *[(R + old + P, RB + new + r".\2", None) for old, new in (
        (r"norm1", "norm1"), (r"norm2", "norm2"), (r"attn\.to_out\.0", "self_attn_proj"),
        (r"ff\.net\.0\.proj", "mlp.fc1"), (r"ff\.net\.2", "mlp.fc2"),
        (r"norm_out\.linear", "adaLN_modulation.1"))],
    *[(rf"context_embedder_2\.{old}" + P, rf"byt5_in.{new}.\1", None) for old, new in (
        ("norm", "layernorm"), ("linear_1", "fc1"), ("linear_2", "fc2"), ("linear_3", "fc3"))],
    *[(rf"image_embedder\.{old}" + P, rf"vision_in.proj.{n}.\1", None) for old, n in (
        ("norm_in", 0), ("linear_1", 1), ("linear_2", 3), ("norm_out", 4))],
    (r"cond_type_embed\.weight", "cond_type_embedding.weight", None),
    *[(T + rf"attn\.to_{x}" + P, D + r"img_attn_qkv.\2", i) for i, x in enumerate("qkv")],
    *[(T + rf"attn\.add_{x}_proj" + P, D + r"txt_attn_qkv.\2", i)
      for i, x in enumerate("qkv")],
    *[(T + rf"attn\.norm_{a}{x}\.weight", D + rf"{s}_attn_{x}_norm.weight", None)
      for a, s in (("", "img"), ("added_", "txt")) for x in "qk"],
    *[(T + old + P, D + new + r".\2", None) for old, new in (
        (r"attn\.to_out\.0", "img_attn_proj"), (r"attn\.to_add_out", "txt_attn_proj"),
        (r"ff\.net\.0\.proj", "img_mlp.fc1"), (r"ff\.net\.2", "img_mlp.fc2"),
        (r"ff_context\.net\.0\.proj", "txt_mlp.fc1"), (r"ff_context\.net\.2", "txt_mlp.fc2"),
        (r"norm1\.linear", "img_mod.linear"), (r"norm1_context\.linear", "txt_mod.linear"))],
    (r"norm_out\.linear" + P, r"final_layer.adaLN_modulation.1.\1", None),
    (r"proj_out" + P, r"final_layer.linear.\1", None),
]


def flux(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = remap(state, FLUX)
    for key in [k for k in out if k.startswith("final_layer.adaLN_modulation")]:
        out[key] = swap_halves(out[key])
    return out


def sd3(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SD3's MMDiT names; the last block's context modulation and the final layer's are
    (shift, scale) in the original."""
    out = remap(state, SD3)
    last = max(int(k.split(".")[1]) for k in out if k.startswith("joint_blocks."))
    for key in [k for k in out if k.startswith(("final_layer.adaLN", f"joint_blocks.{last}."
                                                "context_block.adaLN"))]:
        out[key] = swap_halves(out[key])
    return out


def krea2(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        if key.startswith("transformer_blocks."):
            for old, new in KREA2_BLOCK.items():
                key = key.replace(new, old)
            key = "blocks." + key.removeprefix("transformer_blocks.")
            value = value.flatten() if key.endswith(".mod.lin") else value
        else:
            old = next((o for o, n in KREA2_TOP.items() if key.startswith(n)), "")
            key = old + key[len(KREA2_TOP[old]):] if old else key
        out[key] = value
    return out


def ltx2(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for new, old in LTX2:
            key = key.replace(new, old)
        out[key] = value
    return out


def ideogram4(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """q, k, v fused into attention.qkv, to_out.0 as attention.o (ComfyUI's model)."""
    return remap(state, [
        *[(rf"(layers\.\d+)\.attention\.to_{x}\.weight", r"\1.attention.qkv.weight", i)
          for i, x in enumerate("qkv")],
        (r"(layers\.\d+)\.attention\.to_out\.0\.weight", r"\1.attention.o.weight", None)],
        keep=True)


def hunyuan_video15(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tencent's names; the final layer's modulation is (shift, scale) there."""
    out = remap(state, HUNYUAN_VIDEO15)
    key = "final_layer.adaLN_modulation.1."
    for k in (key + "weight", key + "bias"):
        out[k] = swap_halves(out[k])
    return out


def same_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's model holds diffusers' names (Qwen-Image, ERNIE-Image)."""
    return dict(state)


def flux2(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from test_family_flux2 import bfl_transformer

    return bfl_transformer(state)


def z_image(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from test_comfy_base_file import comfy_layout

    return {k.removeprefix(PREFIX): v for k, v in comfy_layout(state).items()}


LAYOUTS: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "flux": flux, "flux_kontext": flux, "chroma": lambda s: remap(s, CHROMA), "sd3": sd3,
    "flux2": flux2, "krea2": krea2, "ltx2": ltx2, "qwen_image": same_names,
    "qwen_image_edit": same_names, "ernie_image": same_names, "z_image": z_image,
    "ideogram4": ideogram4, "hunyuan_video15": hunyuan_video15,
}


def comfy_file(family: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The diffusion-model file of `family` in bf16, as ComfyUI saves it."""
    return {PREFIX + k: v.to(torch.bfloat16).contiguous()
            for k, v in LAYOUTS[family](state).items()}


def fp8_file(sd: dict[str, torch.Tensor], scaled: bool) -> dict[str, torch.Tensor]:
    """`sd` with every 2-D weight in float8_e4m3fn (ComfyUI's fp8 files keep norms,
    biases and embeddings of other shapes in bf16); scaled: each with its float32
    `scale_weight` (the weight is fp8 * scale), a `scale_input` and the marker."""
    out = dict(sd)
    for key, value in sd.items():
        if value.dim() != 2 or not key.endswith(".weight") or "embed" in key:
            continue
        layer = key.removesuffix(".weight")
        scale = value.float().abs().max() / 448.0 if scaled else torch.tensor(1.0)
        out[key] = (value.float() / scale).to(FP8)
        if scaled:
            out[layer + ".scale_weight"] = scale.reshape(()).float()
            out[layer + ".scale_input"] = torch.tensor(1.0)
    if scaled:
        out[PREFIX + "scaled_fp8"] = torch.empty(0, dtype=FP8)
    return out


def at_tiny_width(monkeypatch, class_name: str) -> None:
    """diffusers' Flux and Chroma converters cut a single block's fused linear1 at FLUX.1's
    width (3072, written into the converter); for a tiny model its rows are padded to
    that cut for the call and cut at the tiny width afterwards, so the rest of diffusers'
    own converter runs on the tiny file."""
    from diffusers.loaders import single_file_model

    table = single_file_model.SINGLE_FILE_LOADABLE_CLASSES
    real = table[class_name]["checkpoint_mapping_fn"]

    def convert(checkpoint: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        fused = {k: checkpoint[k] for k in checkpoint if ".linear1." in k}
        for key, value in fused.items():
            checkpoint[key] = value.new_zeros((7 * 3072, *value.shape[1:]))
        out = real(checkpoint, **kwargs)
        for key, value in fused.items():
            index, param = key.split("single_blocks.")[1].split(".")[0], key.rsplit(".", 1)[1]
            width = value.shape[0] // 7  # q, k, v and the 4x MLP input
            for name, part in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
                                  value.split((width, width, width, 4 * width)), strict=True):
                out[f"single_transformer_blocks.{index}.{name}.{param}"] = part
        return out

    monkeypatch.setitem(table, class_name, {**table[class_name], "checkpoint_mapping_fn": convert})
