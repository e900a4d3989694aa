"""Tiny random ERNIE-Image: an ErnieImageTransformer2DModel with two blocks at width 32
(its modulation and output layers, zero at init, made random so every block and the output
carry signal), FLUX.2's VAE at tiny size with calibrated batch-norm statistics
(flux2/tiny.py: 8 latent channels, so the patchified grid has 32), a two-layer Mistral3Model
(ministral3 text model, one-block Pixtral vision tower the pipeline never runs) and a
Mistral-like tokenizer: byte-level BPE without merges (every string tokenizes), `<unk>`,
`<s>`, `</s>`, `<pad>` as ids 0-3 (`<s>` prepended, as the real tokenizer's special tokens
do), saved as the real one is (transformers' TokenizersBackend). The scheduler is the real
static shift-3 FlowMatchEulerDiscreteScheduler config (full_size/scheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.families.flux2.tiny import LATENT_CHANNELS, tiny_flux2_vae
from core.models.tiny.clip import byte_symbols

TEXT_DIM = 32  # the tiny text model's width = the transformer's text_in_dim
TEXT_LAYERS = 2  # hidden_states[-2] is then the first layer's output
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # Mistral's first ids
# Ministral 3's YaRN rope, its attention temperature (llama_4_scaling_beta) included.
ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
        "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}


def mistral_tokenizer(out_dir: Path) -> Any:
    """Write the tiny tokenizer to `out_dir` and load it back from there."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for symbol in byte_symbols():
        vocab[symbol] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", model_max_length=131072)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)


def tiny_mistral3(vocab_size: int, seed: int) -> Any:
    """A Mistral3Model whose text model is TEXT_LAYERS deep and TEXT_DIM wide."""
    import torch
    from transformers import Mistral3Config, Mistral3Model

    config = Mistral3Config(
        text_config={"model_type": "ministral3", "vocab_size": vocab_size,
                     "hidden_size": TEXT_DIM, "intermediate_size": 2 * TEXT_DIM,
                     "num_hidden_layers": TEXT_LAYERS, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": TEXT_DIM // 2,
                     "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
                     "rope_parameters": ROPE,
                     "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3},
        vision_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "head_dim": 8, "image_size": 28,
                       "patch_size": 14},
        tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Mistral3Model(config).eval()


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random ERNIE-Image-shaped model as a diffusers folder."""
    import torch
    from diffusers import (
        ErnieImagePipeline,
        ErnieImageTransformer2DModel,
        FlowMatchEulerDiscreteScheduler,
    )

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = ErnieImageTransformer2DModel(
        hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64,
        in_channels=4 * LATENT_CHANNELS, out_channels=4 * LATENT_CHANNELS, patch_size=1,
        text_in_dim=TEXT_DIM, rope_theta=256, rope_axes_dim=(4, 6, 6))
    _randomize_zeroed(transformer, seed)
    tokenizer = mistral_tokenizer(out_dir / "tokenizer")
    pipe = ErnieImagePipeline(
        transformer=transformer, vae=tiny_flux2_vae(seed + 1),
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_mistral3(len(tokenizer), seed + 2), tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)


def _randomize_zeroed(transformer: Any, seed: int) -> None:
    """The modulation and the output projection start at zero (a trained model's are
    not): small random values, so every block's gates open and the output moves."""
    import torch

    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for module in (transformer.adaLN_modulation[-1], transformer.final_linear):
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
