"""Qwen-Image 2.1 on its tiny random model (CPU, seconds each): the training loss against
the objective written out as QwenImage21Pipeline's denoising step computes the velocity
(its encode_prompt, RGBA latents, the flat token layout, img_mask, timestep sigma), the
sigma draw, a LoRA that reloads with QwenImage21Pipeline.load_lora_weights and changes
the image, a merged folder the pipeline loads, the check's Turbo / wrong-family /
missing-component problems, a single file refused, random:qwen_image21's sizes, and
short real training runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process
from test_family_qwen_image import batch_of, pixels  # the same images and collate
from test_models_flow import add_lora

from core.models.families.qwen_image21.checks import model_problems
from core.models.families.qwen_image21.family import FAMILY as Q
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-qwen-image21")
    build_tiny_folder("qwen_image21", out, seed=0)
    return out


def pipeline(folder: Path | str) -> object:
    from diffusers import QwenImage21Pipeline

    from core.models.families.qwen_image21.processor import load_processor

    pipe = QwenImage21Pipeline.from_pretrained(str(folder), local_files_only=True,
                                               processor=load_processor(str(folder), True))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------- the reference loss


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's step written out: encode_prompt of the batch (right-padded, mask),
    RGBA pixels (alpha 1) through the VAE, (z - mean) / std, (1 - s) x + s n, latents
    flattened to one token per latent pixel, img_mask = the text's image_pad_mask plus one
    slot per 2x2 tokens, timestep = sigma, the last h*w output tokens; target n - x, MSE.
    Returns (loss, prediction)."""
    pipe = pipeline(folder)
    vae = pipe.vae
    with torch.no_grad():
        embeds, mask, pad_mask = pipe.encode_prompt(prompt=prompts)
        rgba = torch.cat([px, torch.ones_like(px[:, :1])], dim=1).unsqueeze(2)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        model_input = ((vae.encode(rgba).latent_dist.mode() - mean) / std)[:, :, 0]
    assert mask is not None and not mask.all()
    s = sigmas.view(-1, 1, 1, 1)
    noisy = (1.0 - s) * model_input + s * noise
    b, c, h, w = noisy.shape
    tokens = noisy.reshape(b, c, h * w).transpose(1, 2)
    img_mask = torch.cat([pad_mask, pad_mask.new_ones(b, h * w // 4)], dim=1)
    with torch.no_grad():
        out = pipe.transformer(hidden_states=tokens, timestep=sigmas * 1000 / 1000,
                               encoder_hidden_states=embeds, encoder_hidden_states_mask=mask,
                               img_shapes=[[(1, h, w)]] * b, img_mask=img_mask,
                               return_dict=False)[0]
    pred = out[:, -h * w:].transpose(1, 2).reshape(b, c, h, w)
    loss = ((pred.float() - (noise - model_input).float()) ** 2).reshape(b, -1).mean(1).mean()
    return loss, pred


def test_training_loss_matches_the_pipelines_step(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 64, 4, 4, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(folder, PROMPTS, px, noise, sigmas)

    c = Q.load(str(folder))
    texts = Q.encode_prompts(c, PROMPTS)
    assert texts[0]["prompt_embeds"].shape[0] < texts[1]["prompt_embeds"].shape[0]
    latents = Q.encode_images(c, px)
    assert latents.shape == (2, 64, 4, 4)  # 64 channels, 16x in space
    sample = Q.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = Q.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want_pred, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(Q.loss(c, pred, sample), want_loss, rtol=1e-4, atol=1e-6)


def test_training_sigmas_are_uniform_over_the_unshifted_table(folder: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    c = Q.load(str(folder))
    latents = torch.zeros(4000, 64, 2, 2)
    sample = Q.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                noise=torch.zeros_like(latents))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(folder),
                                                                subfolder="scheduler")
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample.timesteps / 1000, scheduler.sigmas[(u * 1000).long()])
    assert scheduler.config.use_dynamic_shifting


# ---------------------------------------------------------------- LoRA, merge


def generate(pipe, embeds: torch.Tensor, **kwargs: object) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt_embeds=embeds, prompt_embeds_mask=torch.ones(embeds.shape[:2]).bool(),
                    num_inference_steps=2, height=64, width=64,
                    generator=torch.Generator().manual_seed(0), output_type="pt",
                    **kwargs).images


def test_lora_trains_and_reloads_with_load_lora_weights(folder: Path, tmp_path: Path) -> None:
    trained = Q.load(str(folder))
    add_lora(trained, Q)
    texts = Q.encode_prompts(trained, PROMPTS)
    latents = Q.encode_images(trained, pixels(2))
    s = Q.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    Q.loss(trained, Q.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert any("transformer_blocks.1.attn.to_q" in n for n in lora)
    assert all(p.grad is not None for p in lora.values())

    paths = Q.save_lora(trained, tmp_path / "lora")
    assert set(paths) == {"diffusers"}  # ComfyUI 0.29.0 has no Qwen-Image 2.1
    embeds = texts[0]["prompt_embeds"][None].detach()
    want = generate(Q.validation_pipeline(trained), embeds)
    pipe = pipeline(folder)
    base = generate(pipe, embeds)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe, embeds)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_validation_guides_above_one_with_the_negative(folder: Path) -> None:
    c = Q.load(str(folder))
    pos, neg = (t["prompt_embeds"][None] for t in Q.encode_prompts(c, [PROMPTS[0], ""]))
    pipe = Q.validation_pipeline(c)
    a = generate(pipe, pos, negative_prompt_embeds=neg, guidance_scale=4.0)
    b = generate(pipe, pos, negative_prompt_embeds=neg, guidance_scale=1.0)
    assert a.shape == (1, 4, 64, 64) and not torch.allclose(a, b)  # RGBA out


def test_merge_writes_a_folder_the_pipeline_loads(tmp_path: Path, tiny_workspace: Path) -> None:
    from core import ops
    from core.config import save_config
    from core.models.adapters import adapter_config
    from core.models.tiny import resolve_model_path

    cfg = small_config(tmp_path, family="qwen_image21", images=2)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    c = Q.load(resolve_model_path("tiny:qwen_image21", tiny_workspace))
    c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, Q.lora_target_modules()))
    with torch.no_grad():
        for p in c.denoiser.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    Q.save_lora(c, run / "lora")
    merged = ops.merge_run(run, tiny_workspace)
    embeds = Q.encode_prompts(Q.load(str(merged)), ["a red circle"])[0]["prompt_embeds"][None]
    from_merged = generate(pipeline(merged), embeds)
    base = pipeline(resolve_model_path("tiny:qwen_image21", tiny_workspace))
    base.load_lora_weights(str(run / "lora"))
    torch.testing.assert_close(from_merged, generate(base, embeds), atol=2e-4, rtol=1e-3)


# ---------------------------------------------------------------- the check


def test_turbo_is_recognised_and_warned_about(folder: Path, tmp_path: Path) -> None:
    turbo = tmp_path / "qwen-image-21-distilled"
    shutil.copytree(folder, turbo)
    index = json.loads((turbo / "model_index.json").read_text())
    grid = [1.0, 0.9, 0.75, 0.5]
    (turbo / "model_index.json").write_text(json.dumps({**index, "sample_sigmas": grid}))
    problems = model_problems(str(turbo))
    assert [(p.level, p.where) for p in problems] == [("warning", "model.path")]
    assert str(turbo) in problems[0].message and "Qwen/Qwen-Image-2.1" in problems[0].message
    assert model_problems(str(folder)) == []
    assert model_problems("Qwen/Qwen-Image-2.1-Turbo")[0].level == "warning"
    c = Q.load(str(turbo))  # the loaded Turbo samples its own grid
    assert c.is_distilled and c.sample_sigmas == grid
    assert Q.validation_pipeline(c).config.sample_sigmas == grid
    modular = tmp_path / "modular"
    modular.mkdir()
    (modular / "modular_model_index.json").write_text(
        json.dumps({"_class_name": "QwenImage21ModularPipeline", "sample_sigmas": grid}))
    assert sorted(p.level for p in model_problems(str(modular))) == ["error", "warning"]


def test_missing_component_and_other_family_are_named(folder: Path, tmp_path: Path) -> None:
    from core.models.loading import check_model_source

    broken = tmp_path / "qwen21-broken"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("text_encoder"))
    [problem] = model_problems(str(broken))
    assert "text_encoder/" in problem.message and str(broken) in problem.message
    other = tmp_path / "qwen"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    [problem] = check_model_source(str(other), "qwen_image21")
    assert "QwenImagePipeline" in problem.message and 'model.family = "qwen_image"' in \
        problem.message
    [problem] = check_model_source(str(folder), "qwen_image")
    assert "QwenImage21Pipeline" in problem.message and "qwen_image21" in problem.message


def test_a_single_file_is_recognised_and_refused_with_what_to_use(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from core.models import loading

    ckpt = tmp_path / "qwen_image_2.1.safetensors"
    save_file({"txt_in.text_norm.weight": torch.ones(4),
               "transformer_blocks.0.attn.to_q.weight": torch.zeros(2, 2)}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == \
        "qwen_image21"
    with pytest.raises(loading.ModelLoadError) as info:
        Q.load(str(ckpt))
    assert str(ckpt) in str(info.value) and "diffusers folder" in str(info.value)


def test_the_config_check_reaches_the_family_and_random_sizes(tmp_path: Path) -> None:
    from core.config import Config, validate_config
    from core.models.full_size.meta import parameter_counts

    cfg = Config()
    cfg.model.family, cfg.model.path = "qwen_image21", "Qwen/Qwen-Image-2.1-Turbo"
    found = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert found and found[0].level == "warning" and "Turbo" in found[0].message
    counts = parameter_counts("qwen_image21")  # the shipped configs, offline, no weights
    assert counts["transformer"] == 7_115_124_736  # the class defaults
    assert counts["text_encoder"] == 8_767_123_696  # Qwen3-VL-8B, vision tower included


# ---------------------------------------------------------------- real runs


def test_trains_a_few_steps_and_saves_a_lora(tmp_path: Path, tiny_workspace: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="qwen_image21")
    cfg.train.max_steps = 2
    cfg.validation.every = 2
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert not (run / "lora/lora_comfyui.safetensors").exists()
    assert (run / "validation/step_000002/00.png").is_file()


def test_a_swapped_block_trains_as_in_place(tmp_path: Path, tiny_workspace: Path) -> None:
    """model.blocks_to_swap = 1 (block_lists: transformer_blocks): the same losses and
    LoRA as unswapped, through an eval and a validation round."""
    from test_block_swap import assert_one_swapped_block_trains_as_in_place

    assert_one_swapped_block_trains_as_in_place(tmp_path, tiny_workspace, "qwen_image21")


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" compiles the transformer_blocks (aot_eager on the CPU):
    the same step losses as uncompiled."""
    from conftest import assert_compiled_blocks_train_alike

    assert_compiled_blocks_train_alike(tmp_path, tiny_workspace, "qwen_image21", monkeypatch)
