"""SD3 and Flux families on their tiny random models (CPU, seconds each).

Each test asserts what a user of the family would notice: shapes the cache stores,
that batching never changes an embedding or a prediction, the flow-matching maths,
that a trained LoRA reloads with diffusers' own `load_lora_weights` and reproduces the
trained model's images, and the messages for wrong inputs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from core.models import loading
from core.models.families.flux.family import FAMILY as FLUX
from core.models.families.sd3.family import FAMILY as SD3
from core.models.registry import get_family
from core.models.tiny import build_tiny_folder

FAMILIES = {"sd3": SD3, "flux": FLUX}
# LoRA-wrapped modules in the tiny models: SD3 2 joint blocks (the last has no context
# output projection) = 8 + 7; Flux 1 double block (12) + 1 single block (to_q/k/v: 3).
LORA_MODULES = {"sd3": 15, "flux": 15}
# The last SD3 block keeps no text output (context_pre_only), so the text queries of its
# attention get no gradient: a property of the model, trained anyway by diffusers' script.
DEAD_LORA = {"sd3": ["transformer_blocks.1.attn.add_q_proj.lora_A.default.weight",
                     "transformer_blocks.1.attn.add_q_proj.lora_B.default.weight"],
             "flux": []}


def tree_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in FAMILIES:
        folder = tmp_path_factory.mktemp(f"tiny-{name}")
        build_tiny_folder(name, folder, seed=0)
        out[name] = folder
    return out


def add_lora(c, fam, rank: int = 4, alpha: int = 8, seed: int = 0) -> list[torch.nn.Parameter]:
    """A LoRA on the family's targets with lora_B non-zero, so it changes the output."""
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                      target_modules=fam.lora_target_modules()))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return [p for n, p in c.denoiser.named_parameters() if "lora_" in n]


def batch_text(items: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def pixels(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def generate(pipe, c, prompt: str = "a red circle"):
    kwargs = {"max_sequence_length": FAMILIES[c.family].sequence_length(c)}
    out = pipe(prompt, num_inference_steps=2, height=64, width=64, output_type="np",
               generator=torch.Generator().manual_seed(0), **kwargs)
    return torch.from_numpy(out.images[0])


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_registry_finds_family(name: str) -> None:
    fam = get_family(name)
    assert fam is FAMILIES[name]
    assert fam.prediction == "flow_matching"


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_tiny_build_is_deterministic(built, tmp_path: Path, name: str) -> None:
    build_tiny_folder(name, tmp_path / "again", seed=0)
    first, second = tree_hashes(built[name]), tree_hashes(tmp_path / "again")
    assert any(k.endswith(".safetensors") for k in first)
    assert first == second


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_encode_prompts_fixed_length_and_batch_independent(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    short, long = "a red circle", "a much longer prompt about blue squares and green triangles"
    both = fam.encode_prompts(c, [short, long])
    alone = fam.encode_prompts(c, [long])[0]
    expected_len = {"sd3": 77 + 256, "flux": 512}[name]
    for item in both:
        assert item["prompt_embeds"].shape[0] == expected_len
        assert item["prompt_mask"].shape == (expected_len,)
        assert item["prompt_mask"].dtype == torch.bool
        assert item["pooled_prompt_embeds"].ndim == 1
    # More words, more real tokens; padding is there but never counted as real.
    assert 0 < both[0]["prompt_mask"].sum() < both[1]["prompt_mask"].sum() < expected_len
    assert not torch.allclose(both[0]["prompt_embeds"], both[1]["prompt_embeds"])
    # A prompt's embedding does not depend on which prompts share its batch.
    for key in ("prompt_embeds", "pooled_prompt_embeds"):
        torch.testing.assert_close(both[1][key], alone[key], atol=1e-5, rtol=1e-5)


def test_sd3_prompt_embeds_layout(built) -> None:
    """CLIP-L|CLIP-G features zero-padded to T5's width, then T5 along the sequence."""
    c = SD3.load(str(built["sd3"]))
    item = SD3.encode_prompts(c, ["a red circle"])[0]
    clip_width = 16 + 32  # tiny CLIP-L + CLIP-G hidden sizes
    assert item["prompt_embeds"].shape[1] == c.denoiser.config.joint_attention_dim == 64
    assert torch.count_nonzero(item["prompt_embeds"][:77, clip_width:]) == 0
    assert torch.count_nonzero(item["prompt_embeds"][77:, clip_width:]) > 0
    assert item["pooled_prompt_embeds"].shape == (clip_width,)


def test_sd3_without_t5_loads_and_zeroes_t5_part(built, tmp_path: Path) -> None:
    folder = tmp_path / "no-t5"
    shutil.copytree(built["sd3"], folder)
    shutil.rmtree(folder / "text_encoder_3")
    shutil.rmtree(folder / "tokenizer_3")
    c = SD3.load(str(folder))
    assert len(c.text_encoders) == 2 and c.has_t5 is False
    item = SD3.encode_prompts(c, ["a red circle"])[0]
    assert item["prompt_embeds"].shape[0] == 77 + 256
    assert torch.count_nonzero(item["prompt_embeds"][77:]) == 0
    assert not item["prompt_mask"][77:].any()


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_encode_images_scales_and_shifts(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    px = pixels(2, 64)
    latents = fam.encode_images(c, px)
    assert latents.shape == (2, 16, 8, 8)
    with torch.no_grad():
        mean = c.vae.encode(px).latent_dist.mean
    cfg = c.vae.config
    torch.testing.assert_close(latents, (mean - cfg.shift_factor) * cfg.scaling_factor)
    torch.testing.assert_close(fam.encode_images(c, px), latents)  # cache-stable
    sampled = fam.encode_images(c, px, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(sampled, latents)


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_flow_noise_and_target(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    latents = torch.randn(8, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(1))
    sigmas = s.timesteps / 1000
    assert ((sigmas > 0) & (sigmas < 1)).all()
    assert len(set(sigmas.tolist())) == 8  # one sigma per item
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(s.target, noise - latents)
    sig = sigmas.reshape(-1, 1, 1, 1)
    torch.testing.assert_close(s.noisy, (1 - sig) * latents + sig * noise)
    again = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(again.noisy, s.noisy)
    # Fixed timesteps and noise: a deterministic evaluation point.
    fixed = fam.noise_and_target(c, latents, timesteps=250.0, noise=torch.zeros_like(latents))
    torch.testing.assert_close(fixed.noisy, 0.75 * latents)
    torch.testing.assert_close(fixed.timesteps, torch.full((8,), 250.0))


def test_sd3_trains_on_shifted_sigmas(built) -> None:
    """SD3's scheduler shift (3.0) pushes training towards high noise; Flux's is 1."""
    c_sd3, c_flux = SD3.load(str(built["sd3"])), FLUX.load(str(built["flux"]))
    latents = torch.zeros(512, 16, 2, 2)
    gen = torch.Generator
    sd3 = SD3.noise_and_target(c_sd3, latents, generator=gen().manual_seed(0)).timesteps
    flux = FLUX.noise_and_target(c_flux, latents, generator=gen().manual_seed(0)).timesteps
    assert SD3.train_shift(c_sd3) == 3.0 and FLUX.train_shift(c_flux) == 1.0
    assert flux.median() == pytest.approx(500, abs=60)  # logit-normal(0, 1): centred
    assert sd3.median() == pytest.approx(750, abs=60)  # 3s/(1+2s) at s=0.5


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_predict_is_batch_independent(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    texts = fam.encode_prompts(c, ["a red circle", "a much longer prompt about squares"])
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = fam.predict(c, s, batch_text(texts))
        one = type(s)(noisy=s.noisy[1:], timesteps=s.timesteps[1:], target=s.target[1:])
        single = fam.predict(c, one, batch_text(texts[1:]))
    assert pred.shape == latents.shape
    torch.testing.assert_close(pred[1:], single, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_predict_rejects_stale_text_length(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    text = batch_text(fam.encode_prompts(c, ["a red circle"]))
    text["prompt_embeds"] = text["prompt_embeds"][:, :100]
    text["prompt_mask"] = text["prompt_mask"][:, :100]
    s = fam.noise_and_target(c, torch.zeros(1, 16, 8, 8), timesteps=500.0)
    with pytest.raises(ValueError, match="delete the text cache"):
        fam.predict(c, s, text)


def test_flux_guidance_reaches_the_transformer(built) -> None:
    c = FLUX.load(str(built["flux"]))
    assert c.denoiser.config.guidance_embeds and c.guidance == 1.0
    text = batch_text(FLUX.encode_prompts(c, ["a red circle"]))
    s = FLUX.noise_and_target(c, torch.randn(1, 16, 8, 8), timesteps=500.0)
    with torch.no_grad():
        base = FLUX.predict(c, s, text)
        c.guidance = 3.5
        other = FLUX.predict(c, s, text)
    assert not torch.allclose(base, other)


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_lora_loss_backward_reaches_every_adapter(built, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    lora = add_lora(c, fam)
    assert len([p for p in lora if p.ndim == 2]) == 2 * LORA_MODULES[name]
    assert all(p.requires_grad for p in lora)
    text = batch_text(fam.encode_prompts(c, ["a red circle", "a blue square"]))
    latents = fam.encode_images(c, pixels(2, 64))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    loss = fam.loss(c, fam.predict(c, s, text), s)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    named = dict(c.denoiser.named_parameters())
    missing = [n for n, p in named.items() if "lora_" in n and
               (p.grad is None or torch.count_nonzero(p.grad) == 0)]
    assert missing == DEAD_LORA[name]
    frozen = [n for n, p in named.items() if "lora_" not in n and p.grad is not None]
    assert frozen == []


def test_loss_weighting_schemes(built) -> None:
    c = SD3.load(str(built["sd3"]))
    latents = torch.randn(4, 16, 8, 8)
    plain = SD3.noise_and_target(c, latents, timesteps=torch.tensor([100.0, 400, 600, 900]))
    assert plain.weights is None
    fam = type(SD3)()
    fam.loss_weighting = "sigma_sqrt"
    weighted = fam.noise_and_target(c, latents, timesteps=torch.tensor([100.0, 400, 600, 900]))
    torch.testing.assert_close(weighted.weights, torch.tensor([100.0, 6.25, 1 / 0.36, 1 / 0.81]))
    pred = torch.zeros_like(latents)
    per_item = (weighted.target ** 2).reshape(4, -1).mean(1)
    torch.testing.assert_close(fam.loss(c, pred, weighted), (per_item * weighted.weights).mean())


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_saved_lora_reloads_with_load_lora_weights(built, tmp_path: Path, name: str) -> None:
    fam = FAMILIES[name]
    trained = fam.load(str(built[name]))
    add_lora(trained, fam, rank=4, alpha=8)  # alpha != rank: the scale must survive
    paths = fam.save_lora(trained, tmp_path / "lora")
    assert paths["diffusers"] == tmp_path / "lora" / "pytorch_lora_weights.safetensors"
    with torch.no_grad():
        want = generate(fam.validation_pipeline(trained), trained)

    fresh = fam.load(str(built[name]))
    pipe = fam.validation_pipeline(fresh)
    with torch.no_grad():
        base = generate(pipe, fresh)
        pipe.load_lora_weights(str(tmp_path / "lora"))
        got = generate(pipe, fresh)
    assert (got - base).abs().max() > 1e-3  # the LoRA changes the image...
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # ...exactly as trained


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_comfyui_file_has_every_module_with_alpha(built, tmp_path: Path, name: str) -> None:
    fam = FAMILIES[name]
    c = fam.load(str(built[name]))
    add_lora(c, fam, rank=4, alpha=8)
    paths = fam.save_lora(c, tmp_path)
    with safe_open(str(paths["diffusers"]), "pt") as f:
        diffusers_keys = set(f.keys())
    with safe_open(str(paths["comfyui"]), "pt") as f:
        comfy = {k: f.get_tensor(k) for k in f.keys()}
    modules = {k.rsplit(".lora_", 1)[0] for k in diffusers_keys}
    assert len(modules) == LORA_MODULES[name]
    assert all(k.startswith("transformer.") for k in comfy)
    assert set(comfy) == diffusers_keys | {f"{m}.alpha" for m in modules}
    assert {float(comfy[f"{m}.alpha"]) for m in modules} == {8.0}


def test_save_lora_without_adapter_says_so(built, tmp_path: Path) -> None:
    c = FLUX.load(str(built["flux"]))
    with pytest.raises(ValueError, match="no LoRA adapter"):
        FLUX.save_lora(c, tmp_path)


def write_fake_checkpoint(path: Path, marker: str) -> Path:
    from safetensors.torch import save_file

    save_file({f"model.diffusion_model.{marker}.0.weight": torch.zeros(2, 2)}, str(path))
    return path


@pytest.mark.parametrize(("name", "other", "marker"), [("sd3", "flux", "double_blocks"),
                                                       ("flux", "sd3", "joint_blocks")])
def test_wrong_family_single_file(tmp_path: Path, name: str, other: str, marker: str) -> None:
    ckpt = write_fake_checkpoint(tmp_path / f"{other}_model.safetensors", marker)
    with pytest.raises(loading.ModelLoadError) as info:
        FAMILIES[name].load(str(ckpt))
    message = str(info.value)
    assert str(ckpt) in message
    assert f"looks like a {other} checkpoint, not {name}" in message
    assert f'model.family = "{other}"' in message


def test_single_file_that_cannot_load_names_the_file(built, tmp_path: Path) -> None:
    ckpt = write_fake_checkpoint(tmp_path / "broken_sd3.safetensors", "joint_blocks")
    with pytest.raises(loading.ModelLoadError) as info:
        SD3.load(str(ckpt), config=str(built["sd3"]))
    assert str(ckpt) in str(info.value)
    assert "cannot load this sd3 single-file transformer" in str(info.value)


def test_wrong_family_folder_and_missing_path(built, tmp_path: Path) -> None:
    with pytest.raises(loading.ModelLoadError, match='model.family = "flux"'):
        SD3.load(str(built["flux"]))
    with pytest.raises(loading.ModelLoadError, match="does not exist"):
        FLUX.load(str(tmp_path / "nowhere" / "model.safetensors"))


def test_model_index_names_all_sd3_parts(built) -> None:
    index = json.loads((built["sd3"] / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    assert index["text_encoder_3"] == ["transformers", "T5EncoderModel"]
    assert index["transformer"] == ["diffusers", "SD3Transformer2DModel"]
