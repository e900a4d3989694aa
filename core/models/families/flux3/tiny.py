"""Tiny random FLUX.3: a Flux3Transformer2DModel with one per-mode block per token mode and
one joint block (flow_map off: the base), FLUX.2's AutoencoderKLFlux2 with calibrated
batch-norm statistics (flux2/tiny.py: 8 latent channels, 32 after the 2x2 patchify; the
real ones 32 and 128), and a 36-layer 32-wide Qwen3-VL text encoder
(Qwen3VLForConditionalGeneration, krea2/tiny.py's text model: the pipeline's default taps
4, 8, ..., 32 exist) with the tiny byte-level Qwen tokenizer and Qwen's chat template
(core/models/tiny/qwen3.py).

Written as diffusers writes a modular pipeline: the blocks' pipeline
(Flux3AutoBlocks().init_pipeline()) given the components and saved with
ModularPipeline.save_pretrained, so the folder holds modular_model_index.json and no
model_index.json, as a FLUX.3 repository does. The scheduler and guider are created from
the blocks' configs (default_creation_method "from_config"), so no scheduler/ is written.
The tokenizer is the text tokenizer alone: FLUX.3's real `tokenizer` component is a
Qwen3-VL processor, which transformers builds only with torchvision (its video part); the
family reads its text tokenizer (folder.py)."""

from __future__ import annotations

from pathlib import Path

from core.models.families.flux2.tiny import LATENT_CHANNELS, tiny_flux2_vae
from core.models.families.krea2.tiny import TEXT_DIM, tiny_qwen3_vl
from core.models.tiny.qwen3 import qwen_tokenizer

TAPS = 8  # the pipeline stacks hidden states (4, 8, ..., 32)


def build(out_dir: Path, seed: int = 0, flow_map: bool = False) -> None:
    """Write a tiny random FLUX.3-shaped model as a modular diffusers folder
    (`flow_map`: the step-distilled transformer, with Flux3DistilledAutoBlocks)."""
    import torch
    from diffusers import Flux3Transformer2DModel
    from transformers import Qwen3VLForConditionalGeneration

    from core.models.families.flux3.folder import blocks_for

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = Flux3Transformer2DModel(
        in_channels=4 * LATENT_CHANNELS, cond_in_channels=4 * LATENT_CHANNELS, num_layers=1,
        num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=TAPS * TEXT_DIM, axes_dims_rope=(4, 4, 4, 4), flow_map=flow_map)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    text_model = tiny_qwen3_vl(tokenizer, seed + 2)
    encoder = Qwen3VLForConditionalGeneration(text_model.config).eval()
    encoder.model.load_state_dict(text_model.state_dict())
    pipe = blocks_for(flow_map).init_pipeline()
    pipe.update_components(transformer=transformer, vae=tiny_flux2_vae(seed + 1),
                           text_encoder=encoder, tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True, overwrite_modular_index=True)
