"""Qwen-Image on its tiny random model (CPU, seconds each): the training loss against a
written-out use of diffusers' classes as train_dreambooth_lora_qwen_image.py uses them,
the prompt template and text mask, the script's sigma draw, a LoRA that reloads with
`load_lora_weights`, validation's true CFG, single files, and the preset's estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_models_flow import add_lora

from core.data.collate import collate
from core.models import loading
from core.models.families.qwen_image.family import FAMILY as QWEN
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-qwen_image")
    build_tiny_folder("qwen_image", out, seed=0)
    return out


def pixels(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def batch_of(texts: list[dict], latents: torch.Tensor) -> dict:
    return collate([{**t, "latents": latents[i], "path": f"{i}.png", "caption": ""}
                    for i, t in enumerate(texts)])




# ---------------------------------------------------------------- the reference loss


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss as the diffusers script computes it, written out from the classes (text
    as QwenImagePipeline._get_qwen_prompt_embeds builds it). Returns (loss, prediction)."""
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(folder), local_files_only=True)
    drop = 34
    template = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, "
                "texture, quantity, text, spatial relationships of the objects and background:"
                "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
    with torch.no_grad():
        tokens = pipe.tokenizer([template.format(p) for p in prompts], max_length=1024 + drop,
                                padding=True, truncation=True, return_tensors="pt")
        hidden = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                                   output_hidden_states=True).hidden_states[-1]
        kept = [h[m.bool()][drop:][:512] for h, m in zip(hidden, tokens.attention_mask,
                                                                strict=True)]
        longest = max(len(k) for k in kept)
        embeds = torch.stack([torch.cat([k, k.new_zeros(longest - len(k), k.shape[1])])
                              for k in kept])
        mask = torch.stack([torch.arange(longest) < len(k) for k in kept]).long()

        vae = pipe.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
        model_input = (vae.encode(px.unsqueeze(2)).latent_dist.mode() - mean) * inv_std

    noise5 = noise.unsqueeze(2)  # [B, C, 1, h, w], the frame axis of the VAE's latents
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = (1.0 - s) * model_input + s * noise5
    b, c, _, h, w = model_input.shape
    packed = QwenImagePipeline._pack_latents(noisy.permute(0, 2, 1, 3, 4), b, c, h, w)
    pred = pipe.transformer(hidden_states=packed, encoder_hidden_states=embeds,
                            encoder_hidden_states_mask=mask, timestep=sigmas * 1000 / 1000,
                            img_shapes=[(1, h // 2, w // 2)] * b, return_dict=False)[0]
    scale = 2 ** len(vae.temperal_downsample)
    pred = QwenImagePipeline._unpack_latents(pred, h * scale, w * scale, scale)
    target = noise5 - model_input
    loss = ((pred.float() - target.float()) ** 2).reshape(b, -1).mean(1).mean()
    return loss, pred[:, :, 0]


def test_training_loss_matches_the_diffusers_script(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(folder, PROMPTS, px, noise, sigmas)

    c = QWEN.load(str(folder))
    texts = QWEN.encode_prompts(c, PROMPTS)
    latents = QWEN.encode_images(c, px)
    sample = QWEN.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = QWEN.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want_pred.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(QWEN.loss(c, pred, sample), want_loss.detach(),
                               rtol=1e-5, atol=1e-6)


def test_training_sigmas_are_the_scripts_draw(folder: Path) -> None:
    """u ~ U(0, 1), then the scheduler's (unshifted: dynamic shifting) training sigmas at
    floor(u * 1000): multiples of 1/1000 up to 1, centred, not the shifted inference ones."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    c = QWEN.load(str(folder))
    latents = torch.zeros(4000, 16, 2, 2)
    sample = QWEN.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                   noise=torch.zeros_like(latents))  # only sigmas drawn
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(folder), subfolder="scheduler")
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    expected = scheduler.sigmas[(u * scheduler.config.num_train_timesteps).long()]
    torch.testing.assert_close(sample.timesteps / 1000, expected)
    assert scheduler.config.use_dynamic_shifting
    assert sample.timesteps.mean() == pytest.approx(500, abs=15)
    assert sample.weights is None


# ---------------------------------------------------------------- text


def test_prompt_template_is_dropped_and_lengths_vary(folder: Path) -> None:
    c = QWEN.load(str(folder))
    tok = c.tokenizers[0]
    prefix = tok("<|im_start|>system\nDescribe the image by detailing the color, shape, size, "
                 "texture, quantity, text, spatial relationships of the objects and background:"
                 "<|im_end|>\n<|im_start|>user\n").input_ids
    assert len(prefix) == 34  # as the real tokenizer: the pipeline drops exactly these
    both = QWEN.encode_prompts(c, PROMPTS)
    for prompt, item in zip(PROMPTS, both, strict=True):
        own = len(tok(prompt + "<|im_end|>\n<|im_start|>assistant\n").input_ids)
        assert item["prompt_embeds"].shape == (own, 32)
        assert item["prompt_mask"].all() and item["prompt_mask"].shape == (own,)
    alone = QWEN.encode_prompts(c, [PROMPTS[0]])[0]
    torch.testing.assert_close(both[0]["prompt_embeds"], alone["prompt_embeds"],
                               atol=1e-5, rtol=1e-5)


def test_text_mask_keeps_padding_out_of_the_prediction(folder: Path) -> None:
    """The short prompt's prediction is the same padded in a batch as alone: the padding
    is masked as the pipeline masks it (without the mask it would change)."""
    c = QWEN.load(str(folder))
    texts = QWEN.encode_prompts(c, PROMPTS)
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    s = QWEN.noise_and_target(c, latents, timesteps=torch.tensor([300.0, 700.0]),
                              noise=torch.randn_like(latents))
    batch = batch_of(texts, latents)
    assert not batch["prompt_mask"][0].all()
    with torch.no_grad():
        pred = QWEN.predict(c, s, batch)
        one = type(s)(noisy=s.noisy[:1], timesteps=s.timesteps[:1], target=s.target[:1])
        single = QWEN.predict(c, one, batch_of(texts[:1], latents[:1]))
        batch["prompt_mask"][:] = True
        unmasked = QWEN.predict(c, s, batch)
    torch.testing.assert_close(pred[:1], single, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(unmasked[:1], single, atol=1e-4)


def test_encode_images_normalises_per_channel_without_the_frame_axis(folder: Path) -> None:
    c = QWEN.load(str(folder))
    px = pixels(2)
    latents = QWEN.encode_images(c, px)
    assert latents.shape == (2, 16, 8, 8)
    assert 0.5 < float(latents.std()) < 2.0  # the tiny VAE's statistics are calibrated
    torch.testing.assert_close(QWEN.encode_images(c, px), latents)  # cache-stable
    sampled = QWEN.encode_images(c, px, generator=torch.Generator().manual_seed(1))
    assert sampled.shape == latents.shape and not torch.allclose(sampled, latents)


# ---------------------------------------------------------------- LoRA and validation


def test_lora_backward_then_reloads_with_load_lora_weights(folder: Path, tmp_path: Path) -> None:
    trained = QWEN.load(str(folder))
    add_lora(trained, QWEN)
    texts = QWEN.encode_prompts(trained, PROMPTS)
    latents = QWEN.encode_images(trained, pixels(2))
    s = QWEN.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    QWEN.loss(trained, QWEN.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 4  # to_q/k/v/out.0 of the one block
    assert all(p.grad is not None and torch.count_nonzero(p.grad) for p in lora.values())

    paths = QWEN.save_lora(trained, tmp_path / "lora")
    embeds = texts[0]["prompt_embeds"][None].detach()

    def generate(pipe):
        with torch.no_grad():
            return pipe(prompt_embeds=embeds, num_inference_steps=2, height=64, width=64,
                        generator=torch.Generator().manual_seed(0), output_type="pt").images

    want = generate(QWEN.validation_pipeline(trained))
    fresh = QWEN.load(str(folder))
    pipe = QWEN.validation_pipeline(fresh)
    base = generate(pipe)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with safe_open(str(paths["comfyui"]), "pt") as f:
        comfy = {k: f.get_tensor(k) for k in f.keys()}
    modules = {k.rsplit(".lora_", 1)[0] for k in comfy if ".lora_" in k}
    assert modules == {f"transformer.transformer_blocks.0.attn.{m}"
                       for m in ("to_q", "to_k", "to_v", "to_out.0")}
    assert {float(comfy[f"{m}.alpha"]) for m in modules} == {8.0}


def test_validation_guidance_scale_is_true_cfg(folder: Path) -> None:
    from diffusers import QwenImagePipeline

    c = QWEN.load(str(folder))
    pos, neg = (t["prompt_embeds"][None] for t in QWEN.encode_prompts(c, [PROMPTS[0], ""]))
    common = {"num_inference_steps": 2, "height": 64, "width": 64, "output_type": "pt"}

    def run(pipe, **kw):
        return pipe(prompt_embeds=pos, negative_prompt_embeds=neg,
                    generator=torch.Generator().manual_seed(0), **common, **kw).images

    ours = QWEN.validation_pipeline(c)
    plain = QwenImagePipeline(**{k: getattr(ours, k) for k in
                                 ("transformer", "scheduler", "vae", "text_encoder", "tokenizer")})
    torch.testing.assert_close(run(ours, guidance_scale=2.5), run(plain, true_cfg_scale=2.5))
    assert not torch.allclose(run(ours, guidance_scale=1.0), run(ours, guidance_scale=4.0))


# ---------------------------------------------------------------- files and the preset


def test_a_single_file_needs_model_config_offline_and_another_family_is_named(
        tmp_path: Path) -> None:
    """A Qwen-Image file (tests/test_comfy_family_files.py loads real ones) takes its text
    encoder, VAE and configs from model.config; offline without it, the error says so."""
    from safetensors.torch import save_file

    ckpt = tmp_path / "qwen_image_bf16.safetensors"
    save_file({"txt_norm.weight": torch.ones(2), "img_in.weight": torch.zeros(2, 2)}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == "qwen_image"
    with pytest.raises(loading.ModelLoadError, match="model.config"):
        QWEN.load(str(ckpt))
    flux = tmp_path / "flux.safetensors"
    save_file({"model.diffusion_model.double_blocks.0.weight": torch.zeros(2)}, str(flux))
    with pytest.raises(loading.ModelLoadError, match='model.family = "flux"'):
        QWEN.load(str(flux))
