"""Tiny random FLUX.1 Kontext [dev]: tiny FLUX.1-dev's parts (core/models/families/flux/
tiny.py: one double and one single block with guidance embeddings, a calibrated 16-channel
VAE, CLIP-L and a one-layer T5) saved as a FluxKontextPipeline, whose transformer reads
the control image's tokens beside the target's."""

from __future__ import annotations

from pathlib import Path


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random FLUX.1-Kontext-shaped model as a diffusers folder."""
    from diffusers import FluxKontextPipeline, FluxPipeline

    from core.models.families.flux.tiny import build as build_flux

    out_dir = Path(out_dir)
    build_flux(out_dir, seed)
    flux = FluxPipeline.from_pretrained(str(out_dir), local_files_only=True)
    pipe = FluxKontextPipeline(**{name: getattr(flux, name) for name in (
        "transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2",
        "tokenizer_2")})
    pipe.save_pretrained(str(out_dir), safe_serialization=True)
