"""FLUX.1 Kontext on its tiny random model (issue 24): the training prediction is the one
FluxKontextPipeline's denoising loop makes (control tokens after the target's, their ids
marked 1, the output cut back), a trained LoRA reloads with the pipeline's own
load_lora_weights and draws the same edit, and validation edits at the size asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_models_flow import add_lora, batch_text, pixels

from core.models.capabilities import control_latents
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

KONTEXT = get_family("flux_kontext")
PROMPTS = ["make it blue", "turn the circle into a square"]


@pytest.fixture(scope="module")
def folder(tiny_workspace: Path) -> Path:
    return Path(resolve_model_path("tiny:flux_kontext", tiny_workspace))


def _batch(c, controls: torch.Tensor) -> dict:
    batch = batch_text(KONTEXT.encode_prompts(c, PROMPTS))
    batch["control_latents"] = list(control_latents(KONTEXT, c, [controls])["control_latents"])
    return batch


def test_prediction_is_the_pipeline_loop_written_out(folder: Path) -> None:
    from diffusers import FluxKontextPipeline

    c = KONTEXT.load(str(folder))
    pipe = FluxKontextPipeline.from_pretrained(str(folder), local_files_only=True)
    target, control = pixels(2, seed=1), pixels(2, seed=2)
    sample = KONTEXT.noise_and_target(c, KONTEXT.encode_images(c, target),
                                      generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = KONTEXT.predict(c, sample, _batch(c, control))
        # The pipeline's own preparation: it encodes the control (mode, shift, scale),
        # packs it, and marks its ids; then its loop's transformer call.
        _, image_latents, latent_ids, image_ids = pipe.prepare_latents(
            control, 2, 16, 64, 64, torch.float32, "cpu", None, latents=None)
        embeds, pooled, text_ids = pipe.encode_prompt(PROMPTS, None, max_sequence_length=512)
        noisy = pipe._pack_latents(sample.noisy, 2, 16, 8, 8)
        out = pipe.transformer(
            hidden_states=torch.cat([noisy, image_latents], dim=1),
            timestep=sample.timesteps / 1000, guidance=torch.full((2,), 1.0),
            pooled_projections=pooled, encoder_hidden_states=embeds, txt_ids=text_ids,
            img_ids=torch.cat([latent_ids, image_ids], dim=0), return_dict=False)[0]
        want = pipe._unpack_latents(out[:, :noisy.shape[1]], 64, 64, 8)
    assert image_ids[:, 0].eq(1).all() and latent_ids[:, 0].eq(0).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # The control changes the prediction: it is read, not ignored.
    with torch.no_grad():
        other = KONTEXT.predict(c, sample, _batch(c, pixels(2, seed=3)))
    assert (other - got).abs().max() > 1e-3


def test_lora_reloads_in_the_kontext_pipeline_and_draws_the_same_edit(folder: Path,
                                                                       tmp_path: Path) -> None:
    from diffusers import FluxKontextPipeline
    from PIL import Image

    c = KONTEXT.load(str(folder))
    add_lora(c, KONTEXT)
    paths = KONTEXT.save_lora(c, tmp_path / "lora")
    assert set(paths) == {"diffusers", "comfyui"}
    control = [Image.new("RGB", (96, 64), (200, 30, 30))]
    kwargs = KONTEXT.edit.validation_kwargs(control, 64)
    assert kwargs["image"].size == (64, 48) and kwargs["_auto_resize"] is False

    def draw(pipe) -> torch.Tensor:
        out = pipe(prompt=PROMPTS[0], num_inference_steps=2, height=64, width=64, output_type="np",
                   generator=torch.Generator().manual_seed(0), **kwargs)
        return torch.from_numpy(out.images[0])

    with torch.no_grad():
        want = draw(KONTEXT.validation_pipeline(c))
        fresh = FluxKontextPipeline.from_pretrained(str(folder), local_files_only=True)
        base = draw(fresh)
        fresh.load_lora_weights(str(paths["diffusers"].parent))
        got = draw(fresh)
    assert want.shape == (64, 64, 3), "validation draws at the asked size, not 1024 px"
    assert (want - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_a_batch_without_cached_controls_names_the_fix(folder: Path) -> None:
    c = KONTEXT.load(str(folder))
    sample = KONTEXT.noise_and_target(c, KONTEXT.encode_images(c, pixels(2)),
                                      generator=torch.Generator().manual_seed(0))
    batch = batch_text(KONTEXT.encode_prompts(c, PROMPTS))
    with pytest.raises(ValueError, match="built without datasets.N.control; delete it"):
        KONTEXT.predict(c, sample, batch)


def test_a_flux1_layout_single_file_is_taken_not_refused_as_flux(folder: Path,
                                                                 tmp_path: Path) -> None:
    """flux1-kontext-dev.safetensors has FLUX.1's key names: flux_kontext loads it (this
    fake one then fails to load, naming the file), where sd3 refuses it as a flux file."""
    from test_models_flow import write_fake_checkpoint

    from core.models import loading

    ckpt = write_fake_checkpoint(tmp_path / "flux1-kontext-dev.safetensors", "double_blocks")
    with pytest.raises(loading.ModelLoadError) as info:
        KONTEXT.load(str(ckpt), config=str(folder))
    assert "looks like a flux checkpoint" not in str(info.value)
    assert "cannot load this flux_kontext single-file transformer" in str(info.value)
