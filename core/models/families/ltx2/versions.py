"""Which LTX-2.x a model is, read from its configs (no torch, no weights): the family
trains LTX-2.0 and LTX-2.3 through the same diffusers classes and refuses LTX-2.5 at
`--stage check` (and at load) with the reason.

- LTX-2.0 (Lightricks/LTX-2): the connectors project every Gemma 3 layer once
  (`per_modality_projections` false) and the transformer's caption projections map
  their 3840-wide output to each stream (`use_prompt_embeddings`).
- LTX-2.3 (Lightricks/LTX-2.3): per-modality projections in the connectors (8 gated
  layers each) whose outputs are the streams' own widths, a transformer with gated
  attention, prompt modulation that reads sigma (`cross_attn_mod`), no caption
  projection and perturbable attention (STG); a 2.3 VAE layout and a vocoder with
  bandwidth extension (48 kHz). Its validation uses the guidance LTX2Pipeline's
  docstring and diffusers' modular LTX-2 guiders suggest for it (`GUIDANCE_23`).
- LTX-2.5 (Lightricks/LTX-2.5): a Gemma 4 text encoder, a video feed-forward without
  bias (`ff_bias` false) and a keyframe position embedding; its `transformer/` is the
  distilled 8-step model and `transformer_full/` the dev one, beside a diffusion
  decoder and a duration head (a modular_model_index.json routes it to
  LTX25ModularPipeline). Not trained here (`refusal`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.source import model_source

V20, V23, V25 = "2.0", "2.3", "2.5"
TINY_23 = "ltx23"  # tiny:ltx23 (tiny23/)

# The guidance LTX2Pipeline's docstring suggests for LTX-2.3 beside its video CFG of 3.0
# (audio CFG 7.0, STG 1.0 at block 28, modality guidance 3.0), with the 0.7 rescale of
# diffusers' modular LTX-2 guiders; validation.guidance_scale stays the video CFG.
GUIDANCE_23 = {"audio_guidance_scale": 7.0, "stg_scale": 1.0, "audio_stg_scale": 1.0,
               "modality_scale": 3.0, "audio_modality_scale": 3.0, "guidance_rescale": 0.7}
STG_BLOCK_23 = 28
VIDEO_GUIDANCE_23 = 3.0


def transformer_version(config: Any) -> str:
    """The version an LTX2VideoTransformer3DModel config (a dict or a FrozenDict) says."""
    get = config.get
    if get("use_keyframes_abs_pos_embedding") or get("ff_bias", True) is False:
        return V25
    if get("cross_attn_mod") or get("use_prompt_embeddings", True) is False:
        return V23
    return V20


def suggested_guidance(config: Any, guidance_scale: float | None) -> dict[str, Any]:
    """LTX2Pipeline keywords an LTX-2.3 transformer is validated with beside
    validation.guidance_scale (`GUIDANCE_23`; STG at block 28, or the last block of a
    shallower model). None for LTX-2.0, and for a draw without CFG (guidance 1.0, as a
    distilled checkpoint samples), which runs without them as its model card says."""
    if transformer_version(config) != V23 or (guidance_scale is not None
                                              and guidance_scale <= 1):
        return {}
    out: dict[str, Any] = dict(GUIDANCE_23)
    if config.get("perturbed_attn"):
        block = min(STG_BLOCK_23, int(config.get("num_layers", 48)) - 1)
        out["spatio_temporal_guidance_blocks"] = [block]
    else:  # STG perturbs attention the transformer was built to skip
        out.pop("stg_scale"), out.pop("audio_stg_scale")
    return out


def video_text_width(config: Any) -> int:
    """The width of the video connector's output, which the transformer reads: LTX-2.0's
    caption projection takes `caption_channels`; from LTX-2.3 on the connectors project to
    the stream's own `cross_attention_dim`. The cached text is split there (text.py)."""
    if config.get("use_prompt_embeddings", True):
        return int(config["caption_channels"])
    return int(config["cross_attention_dim"])


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def folder_version(folder: Path) -> str | None:
    """The version of a diffusers folder (None: no transformer config to read)."""
    index = _json(folder / "model_index.json")
    modular = _json(folder / "modular_model_index.json")  # routes 2.5 to its own blocks
    text = _json(folder / "text_encoder" / "config.json")
    extra = [n for n in ("diffusion_decoder", "duration_head")
             if isinstance(index.get(n), list) and index[n] and index[n][0]]
    if (folder / "transformer_full").is_dir() or extra or str(
            modular.get("_class_name", "")).startswith("LTX25") or str(
            text.get("model_type", "")).startswith("gemma4"):
        return V25
    config = _json(folder / "transformer" / "config.json")
    return transformer_version(config) if config else None


def source_version(path: str) -> str | None:
    """The version of model.path where known without loading: tiny and random names,
    a local folder's configs, a hub id's name (Lightricks/LTX-2.3); None where unknown."""
    source = model_source(path)
    if source.kind == "tiny":
        return V23 if source.name == TINY_23 else V20
    if source.kind == "random":
        return V23 if source.name.endswith(":2.3") else V20
    if source.kind == "folder":
        return folder_version(Path(path).expanduser())
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    return V25 if "ltx-2.5" in name else V23 if "ltx-2.3" in name else None


def refusal(path: str, version: str | None) -> str | None:
    """Why `path` is not trained here, or None (see the module docstring)."""
    if version != V25:
        return None
    return (f"{path} is LTX-2.5 (a Gemma 4 text encoder, "
            "transformer_full/ holding the dev model beside the distilled 8-step "
            "transformer/, a diffusion decoder and a duration head): ltx2 trains LTX-2.0 "
            "and LTX-2.3 folders only; LTX-2.5's Gemma 4 text path and its dev transformer "
            "(transformer_full/, which LTX2Pipeline does not load) are not supported here "
            "yet. Use Lightricks/LTX-2.3 or Lightricks/LTX-2")


def model_problems(path: str) -> list[Any]:
    """The check's error for an LTX-2.5 model.path (no torch, no weights)."""
    from core.problems import error

    found = refusal(path, source_version(path))
    return [error("model.path", found)] if found else []
