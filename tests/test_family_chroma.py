"""Chroma on its tiny random model (CPU, seconds each): the training loss against a
written-out use of the diffusers classes as ChromaPipeline uses them, the text mask
(one padding token kept, and kept under gradient checkpointing), a LoRA that reloads
with ChromaPipeline.load_lora_weights, the ComfyUI file, validation's mask and the
single-file layout detection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_models_flow import add_lora

from core.config import ValidationConfig
from core.models import loading
from core.models.families.chroma.family import FAMILY as CHROMA
from core.models.families.flux.family import FAMILY as FLUX
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle on a white ground", "a"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-chroma")
    build_tiny_folder("chroma", out, seed=0)
    return out


def pixels(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def project_loss(c, images: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor):
    batch = collate(CHROMA.encode_prompts(c, PROMPTS))
    latents = CHROMA.encode_images(c, images)
    sample = CHROMA.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    return CHROMA.loss(c, CHROMA.predict(c, sample, batch), sample)


def reference_loss(folder: Path, images: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> torch.Tensor:
    """ChromaPipeline's text encoding, the FLUX.1 VAE normalisation, rectified-flow
    noising and its 2x2 packing, written out on the diffusers/transformers classes."""
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5EncoderModel, T5TokenizerFast

    tokenizer = T5TokenizerFast.from_pretrained(folder / "tokenizer")
    t5 = T5EncoderModel.from_pretrained(folder / "text_encoder").eval()
    vae = AutoencoderKL.from_pretrained(folder / "vae").eval()
    transformer = ChromaTransformer2DModel.from_pretrained(folder / "transformer").eval()
    with torch.no_grad():
        tokens = tokenizer(PROMPTS, padding="max_length", max_length=512, truncation=True,
                           return_tensors="pt")
        # _get_t5_prompt_embeds: T5 with the tokenizer's mask; the transformer's text mask
        # keeps every position <= the number of real tokens (one padding token more).
        embeds = t5(tokens.input_ids, attention_mask=tokens.attention_mask)[0]
        lengths = tokens.attention_mask.sum(dim=1, keepdim=True)
        text_mask = torch.arange(512).unsqueeze(0) <= lengths
        latents = vae.encode(images).latent_dist.mean
        latents = (latents - vae.config.shift_factor) * vae.config.scaling_factor
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1 - s) * latents + s * noise
        b, ch, h, w = noisy.shape
        packed = noisy.view(b, ch, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        packed = packed.reshape(b, (h // 2) * (w // 2), ch * 4)
        img_ids = torch.zeros(h // 2, w // 2, 3)
        img_ids[..., 1] += torch.arange(h // 2)[:, None]
        img_ids[..., 2] += torch.arange(w // 2)[None, :]
        mask = torch.cat([text_mask, torch.ones(b, packed.shape[1], dtype=torch.bool)], 1)
        out = transformer(hidden_states=packed, timestep=sigmas, encoder_hidden_states=embeds,
                          txt_ids=torch.zeros(512, 3), img_ids=img_ids.reshape(-1, 3),
                          attention_mask=mask, return_dict=False)[0]
        pred = out.view(b, h // 2, w // 2, ch, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, h, w)
        return ((pred - (noise - latents)) ** 2).mean()


def test_loss_matches_the_diffusers_reference(folder: Path) -> None:
    images = pixels(2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    sigmas = torch.tensor([0.3, 0.8])
    c = CHROMA.load(str(folder))
    ours = project_loss(c, images, noise, sigmas)
    torch.testing.assert_close(ours, reference_loss(folder, images, noise, sigmas),
                               rtol=1e-5, atol=1e-6)


def test_prompt_mask_keeps_one_padding_token_and_it_matters(folder: Path) -> None:
    c = CHROMA.load(str(folder))
    items = CHROMA.encode_prompts(c, PROMPTS)
    real = c.tokenizers[0](PROMPTS, padding="max_length", max_length=512,
                           return_tensors="pt").attention_mask.sum(dim=1)
    for item, n in zip(items, real.tolist(), strict=True):
        assert item["prompt_embeds"].shape == (512, 32) and item["prompt_mask"].dtype == torch.bool
        assert item["prompt_mask"][: n + 1].all() and not item["prompt_mask"][n + 1:].any()
    # Padding attended to (diffusers' float-mask behaviour) changes the prediction.
    batch = collate(items)
    sample = CHROMA.noise_and_target(c, CHROMA.encode_images(c, pixels(2)),
                                     generator=torch.Generator().manual_seed(0))
    masked = CHROMA.predict(c, sample, batch)
    unmasked = CHROMA.predict(c, sample, {**batch, "prompt_mask": torch.ones_like(
        batch["prompt_mask"])})
    assert (masked - unmasked).abs().max() > 1e-2


def test_gradient_checkpointing_keeps_the_mask(folder: Path) -> None:
    """diffusers' checkpointed single blocks get no mask; predict hands it to them."""
    c = CHROMA.load(str(folder))
    batch = collate(CHROMA.encode_prompts(c, PROMPTS))
    sample = CHROMA.noise_and_target(c, CHROMA.encode_images(c, pixels(2)),
                                     generator=torch.Generator().manual_seed(0))
    plain = CHROMA.predict(c, sample, batch)
    c.denoiser.enable_gradient_checkpointing()
    c.denoiser.train()
    with torch.enable_grad():
        checkpointed = CHROMA.predict(c, sample, batch)
    torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-6)
    c.denoiser.eval()
    c.denoiser.disable_gradient_checkpointing()




def generate(pipe, texts) -> torch.Tensor:
    out = pipe(**texts.pipeline_inputs(0, "cpu"), num_inference_steps=2, height=64, width=64,
               guidance_scale=4.0, output_type="np", generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


def test_lora_backpropagates_saves_and_reloads_in_chroma_pipeline(folder, tmp_path) -> None:
    from core.train.validation import encode_validation_prompts

    trained = CHROMA.load(str(folder))
    add_lora(trained, CHROMA)  # alpha != rank: the scale must survive the file
    batch = collate(CHROMA.encode_prompts(trained, PROMPTS))
    sample = CHROMA.noise_and_target(trained, CHROMA.encode_images(trained, pixels(2)),
                                     generator=torch.Generator().manual_seed(0))
    CHROMA.loss(trained, CHROMA.predict(trained, sample, batch), sample).backward()
    named = dict(trained.denoiser.named_parameters())
    lora = {n: p for n, p in named.items() if "lora_" in n}
    assert len(lora) == 2 * 15  # 12 modules in the double block, to_q/k/v in the single
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora.values())
    assert all(p.grad is None for n, p in named.items() if "lora_" not in n)

    paths = CHROMA.save_lora(trained, tmp_path / "lora")
    texts = encode_validation_prompts(CHROMA, trained,
                                      ValidationConfig(prompts=["a red circle"]))
    assert texts is not None
    assert texts.pipeline_inputs(0, "cpu")["prompt_attention_mask"].dtype == torch.bool
    with torch.no_grad():
        want = generate(CHROMA.validation_pipeline(trained), texts)
    fresh = CHROMA.load(str(folder))
    pipe = CHROMA.validation_pipeline(fresh)
    with torch.no_grad():
        base = generate(pipe, texts)
        pipe.load_lora_weights(str(paths["diffusers"].parent))
        got = generate(pipe, texts)
    assert (got - base).abs().max() > 1e-3  # the LoRA changes the image...
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # ...exactly as trained


def test_comfyui_file_uses_the_flux_branch_names(folder, tmp_path) -> None:
    """ComfyUI's Chroma subclasses its Flux model, whose LoRA keys are
    "transformer.<diffusers module>" (comfy/lora.py, flux_to_diffusers)."""
    c = CHROMA.load(str(folder))
    add_lora(c, CHROMA)
    paths = CHROMA.save_lora(c, tmp_path)
    with safe_open(str(paths["comfyui"]), "pt") as f:
        comfy = {k: f.get_tensor(k) for k in f.keys()}
    modules = {k.rsplit(".", 1)[0] for k in comfy if k.endswith(".alpha")}
    assert len(modules) == 15 and {float(comfy[f"{m}.alpha"]) for m in modules} == {8.0}
    assert all(m.startswith(("transformer.transformer_blocks.0.",
                             "transformer.single_transformer_blocks.0.attn.to_"))
               for m in modules)
    assert set(comfy) == {f"{m}.{part}" for m in modules
                          for part in ("alpha", "lora_A.weight", "lora_B.weight")}


def test_single_file_layout_is_told_apart_from_flux(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    chroma = tmp_path / "chroma.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(1),
               "distilled_guidance_layer.in_proj.bias": torch.zeros(1)}, str(chroma))
    flux = tmp_path / "flux.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(1),
               "guidance_in.in_layer.bias": torch.zeros(1)}, str(flux))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(chroma))) == "chroma"
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(flux))) == "flux"
    with pytest.raises(loading.ModelLoadError, match='model.family = "chroma"'):
        FLUX.load(str(chroma))
    with pytest.raises(loading.ModelLoadError, match='model.family = "flux"'):
        CHROMA.load(str(flux))


def test_a_flux_folder_is_refused_naming_the_family(folder, tmp_path) -> None:
    flux = tmp_path / "flux"
    build_tiny_folder("flux", flux)
    with pytest.raises(loading.ModelLoadError, match='model.family = "flux"'):
        CHROMA.load(str(flux))
    with pytest.raises(loading.ModelLoadError, match='model.family = "chroma"'):
        FLUX.load(str(folder))
