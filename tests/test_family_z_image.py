"""Z-Image on its tiny random model (CPU, seconds each): the loss against a written-out
use of the diffusers classes as train_dreambooth_lora_z_image.py and ZImagePipeline use
them, the variable-length text, a LoRA that reloads with `load_lora_weights` and in
ComfyUI's names, ComfyUI-layout single files, and the preset's `--stage check`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ks_distance
from safetensors import safe_open
from safetensors.torch import save_file

from core.data.collate import collate
from core.models import loading
from core.models.families.z_image.family import FAMILY as Z
from core.models.registry import get_family
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-z-image")
    build_tiny_folder("z_image", out, seed=0)
    return out


def pixels(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def batch_of(texts: list[dict], latents: torch.Tensor) -> dict:
    """The trainer's collate over cache-like items: pads the text to the longest."""
    return collate([{**t, "latents": lat, "path": f"img{i}.png", "caption": "c"}
                    for i, (t, lat) in enumerate(zip(texts, latents, strict=True))])


def add_lora(c, rank: int = 4, alpha: int = 8, scope: str = "attention") -> None:
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                      target_modules=Z.lora_target_modules(scope)))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   t: torch.Tensor) -> torch.Tensor:
    """The loss written out with the diffusers/transformers classes, as
    ZImagePipeline._encode_prompt encodes text and train_dreambooth_lora_z_image.py
    noises, calls the transformer and compares."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3Model

    tok = Qwen2Tokenizer.from_pretrained(str(folder / "tokenizer"))
    encoder = Qwen3Model.from_pretrained(str(folder / "text_encoder")).eval()
    vae = AutoencoderKL.from_pretrained(str(folder / "vae")).eval()
    transformer = ZImageTransformer2DModel.from_pretrained(str(folder / "transformer")).eval()
    with torch.no_grad():
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)
                 for p in prompts]
        ids = tok(texts, padding="max_length", max_length=512, truncation=True,
                  return_tensors="pt")
        mask = ids.attention_mask.bool()
        hidden = encoder(input_ids=ids.input_ids, attention_mask=mask,
                         output_hidden_states=True).hidden_states[-2]
        embeds = [hidden[i][mask[i]] for i in range(len(prompts))]
        z = vae.encode(px).latent_dist.mode()
        x = (z - vae.config.shift_factor) * vae.config.scaling_factor
        sigmas = (t / 1000).view(-1, 1, 1, 1)
        noisy = (1.0 - sigmas) * x + sigmas * noise
        out = transformer(list(noisy.unsqueeze(2).unbind(0)), (1000 - t) / 1000, embeds,
                          return_dict=False)[0]
        pred = -torch.stack(out, dim=0).squeeze(2)
        return torch.mean((pred.float() - (noise - x).float()) ** 2)


def test_loss_matches_the_written_out_diffusers_reference(folder: Path) -> None:
    c = Z.load(str(folder))
    px = pixels(2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([300.0, 850.0])
    with torch.no_grad():
        latents = Z.encode_images(c, px)
        batch = batch_of(Z.encode_prompts(c, PROMPTS), latents)
        sample = Z.noise_and_target(c, latents, timesteps=t, noise=noise)
        ours = Z.loss(c, Z.predict(c, sample, batch), sample)
    want = reference_loss(folder, PROMPTS, px, noise, t)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)
    # The comparison can tell a wrong convention: the timestep in the other direction.
    flipped = reference_loss(folder, PROMPTS, px, noise, 1000 - t)
    assert not torch.allclose(ours, flipped, rtol=1e-3)


def test_text_is_variable_length_real_tokens_and_batch_independent(folder: Path) -> None:
    c = Z.load(str(folder))
    both = Z.encode_prompts(c, PROMPTS)
    alone = Z.encode_prompts(c, [PROMPTS[1]])[0]
    tok = c.tokenizers[0]
    for prompt, item in zip(PROMPTS, both, strict=True):
        templated = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                            tokenize=False, add_generation_prompt=True,
                                            enable_thinking=True)
        assert templated.startswith("<|im_start|>user\n" + prompt + "<|im_end|>")
        assert item["prompt_embeds"].shape == (len(tok(templated).input_ids), 32)
        assert item["prompt_mask"].all() and item["prompt_mask"].dtype == torch.bool
    torch.testing.assert_close(both[1]["prompt_embeds"], alone["prompt_embeds"],
                               atol=1e-5, rtol=1e-5)
    assert PROMPTS == ["a red circle", PROMPTS[1]]  # the caller's list is left alone


def test_predict_gives_each_item_only_its_real_tokens(folder: Path) -> None:
    """Collate pads the short prompt; its prediction must equal the one made alone
    (the transformer never sees the padding) and differ when the padding is counted."""
    c = Z.load(str(folder))
    texts = Z.encode_prompts(c, PROMPTS)
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    s = Z.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    batch = batch_of(texts, latents)
    assert batch["prompt_embeds"].shape[1] == texts[1]["prompt_embeds"].shape[0]
    with torch.no_grad():
        pred = Z.predict(c, s, batch)
        one = type(s)(noisy=s.noisy[:1], timesteps=s.timesteps[:1], target=s.target[:1])
        single = Z.predict(c, one, batch_of(texts[:1], latents[:1]))
        padded = dict(batch, prompt_mask=torch.ones_like(batch["prompt_mask"]))
        counted = Z.predict(c, s, padded)
    assert pred.shape == latents.shape
    torch.testing.assert_close(pred[:1], single, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(counted[:1], single, atol=1e-4)


def test_trains_on_uniform_sigmas_with_the_schedulers_static_shift(folder: Path) -> None:
    c = Z.load(str(folder))
    assert Z.train_shift(c) == 6.0  # Z-Image base's scheduler_config.json
    s = Z.noise_and_target(c, torch.zeros(5000, 1, 2, 2),
                           generator=torch.Generator().manual_seed(0))
    sigmas = s.timesteps / 1000
    # The distribution, not the median (uniform and logit-normal share it): KS distances.
    assert ks_distance(sigmas, "uniform", 6.0) < 0.03
    assert ks_distance(sigmas, "logit_normal", 6.0) > 0.08
    assert ks_distance(sigmas, "uniform", 1.0) > 0.08  # shifted


def test_lora_backward_reaches_every_adapter_of_every_block(folder: Path) -> None:
    c = Z.load(str(folder))
    add_lora(c, scope="all")
    modules = {n.rsplit(".lora_", 1)[0] for n, _ in c.denoiser.named_parameters()
               if "lora_" in n}
    # 1 main layer + 1 noise refiner + 1 context refiner, each 4 attention + 3 FF.
    assert len(modules) == 3 * 7
    latents = Z.encode_images(c, pixels(2))
    s = Z.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    loss = Z.loss(c, Z.predict(c, s, batch_of(Z.encode_prompts(c, PROMPTS), latents)), s)
    loss.backward()
    named = dict(c.denoiser.named_parameters())
    dead = [n for n, p in named.items() if "lora_" in n
            and (p.grad is None or torch.count_nonzero(p.grad) == 0)]
    assert dead == []
    assert [n for n, p in named.items() if "lora_" not in n and p.grad is not None] == []


def generate(pipe, guidance: float = 0.0):
    out = pipe(PROMPTS[0], num_inference_steps=2, height=64, width=64, output_type="np",
               guidance_scale=guidance, generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


def test_saved_lora_reloads_with_load_lora_weights_and_names_comfyui_reads(
        folder: Path, tmp_path: Path) -> None:
    trained = Z.load(str(folder))
    add_lora(trained, rank=4, alpha=8)  # alpha != rank: the scale must survive
    paths = Z.save_lora(trained, tmp_path / "lora")
    with torch.no_grad():
        want = generate(Z.validation_pipeline(trained), guidance=4.0)
    fresh = Z.load(str(folder))
    pipe = Z.validation_pipeline(fresh)
    with torch.no_grad():
        base = generate(pipe, guidance=4.0)
        pipe.load_lora_weights(str(tmp_path / "lora"))
        got = generate(pipe, guidance=4.0)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    with safe_open(str(paths["comfyui"]), "pt") as f:
        comfy = {k: f.get_tensor(k) for k in f.keys()}
    # ComfyUI's Lumina2 branch (comfy.utils.z_image_to_diffusers) maps these diffusers
    # names, "transformer."-prefixed, onto its fused qkv and out weights.
    expected = {f"transformer.{block}.attention.{p}"
                for block in ("layers.0", "noise_refiner.0", "context_refiner.0")
                for p in ("to_q", "to_k", "to_v", "to_out.0")}
    assert {k.rsplit(".", 2)[0] if "lora_" in k else k.rsplit(".", 1)[0]
            for k in comfy} == expected
    assert {float(comfy[f"{m}.alpha"]) for m in expected} == {8.0}


def comfy_checkpoint(folder: Path, path: Path) -> Path:
    """The tiny transformer in ComfyUI's z_image_*.safetensors layout (the inverse of
    diffusers' convert_z_image_transformer_checkpoint_to_diffusers), in bf16."""
    from diffusers import ZImageTransformer2DModel

    sd = ZImageTransformer2DModel.from_pretrained(str(folder / "transformer")).state_dict()
    renames = ((".attention.to_out.0.", ".attention.out."), (".norm_q.", ".q_norm."),
               (".norm_k.", ".k_norm."), ("all_x_embedder.2-1.", "x_embedder."),
               ("all_final_layer.2-1.", "final_layer."))
    out = {}
    for key, value in sd.items():
        if ".attention.to_k." in key or ".attention.to_v." in key:
            continue
        if ".attention.to_q." in key:
            value = torch.cat([value, sd[key.replace("to_q", "to_k")],
                               sd[key.replace("to_q", "to_v")]])
            key = key.replace(".to_q.", ".qkv.")
        for old, new in renames:
            key = key.replace(old, new)
        out[f"model.diffusion_model.{key}"] = value.to(torch.bfloat16).contiguous()
    save_file(out, str(path))
    return path


def test_comfyui_single_file_loads_through_model_config(folder: Path, tmp_path: Path) -> None:
    file = comfy_checkpoint(folder, tmp_path / "z_image_turbo_bf16.safetensors")
    keys = loading.safetensors_keys(str(file))
    assert loading.detect_checkpoint_family(keys) == "z_image"
    with pytest.raises(loading.ModelLoadError, match="looks like a z_image checkpoint"):
        get_family("flux").load(str(file))
    reference, c = Z.load(str(folder)), Z.load(str(file), config=str(folder))
    assert c.source == str(file)
    expected, got = reference.denoiser.state_dict(), c.denoiser.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key].float(), value.to(torch.bfloat16).float()), key
    assert type(c.text_encoders[0]).__name__ == "Qwen3Model"


def test_random_full_size_tokenizer_fits_qwen3_and_has_the_chat_template() -> None:
    from core.models.full_size.build import _tokenizers
    from core.models.full_size.spec import component_config

    (tok,) = _tokenizers("z_image")
    vocab = component_config("z_image", "text_encoder")["vocab_size"]
    text = tok.apply_chat_template([{"role": "user", "content": "A café at 9:30, ✓"}],
                                   tokenize=False, add_generation_prompt=True,
                                   enable_thinking=True)
    ids = tok([text], padding="max_length", max_length=512, truncation=True).input_ids[0]
    assert 0 <= min(ids) and max(ids) < vocab
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_turbo_with_validation_guidance_is_warned_about() -> None:
    from core.config import load_config, validate_config
    from core.presets import preset_path

    cfg = load_config(preset_path("z-image-lora"))
    assert validate_config(cfg) == []  # the base model samples with guidance 4
    cfg.model.path = "Tongyi-MAI/Z-Image-Turbo"
    (problem,) = validate_config(cfg)
    assert problem.level == "warning" and problem.where == "validation.guidance_scale"
    assert "set it to 0" in problem.message
    cfg.validation.guidance_scale = 0.0
    assert validate_config(cfg) == []
