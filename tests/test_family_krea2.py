"""Krea 2 on its tiny random model (CPU, seconds each): the training loss against the
objective written out as diffusers' train_dreambooth_lora_krea2.py computes it (its
fixed-length, middle-padded text; ours keeps the real tokens), the trainer's sigma draw,
a LoRA that reloads with Krea2Pipeline.load_lora_weights and changes the image, a merged
folder Krea2Pipeline loads, the check's Turbo / wrong-family / missing-component
problems, and a short real training run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process
from safetensors import safe_open
from test_family_qwen_image import batch_of, pixels  # the same images and collate
from test_models_flow import add_lora

from core.models.families.krea2.checks import model_problems
from core.models.families.krea2.family import FAMILY as K
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-krea2")
    build_tiny_folder("krea2", out, seed=0)
    return out




# ---------------------------------------------------------------- the reference loss


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference trainer's step written out: the pipeline's encode_prompt (512 tokens,
    padded mid-template), (z - mean) * (1 / std) latents, (1 - s) x + s n, the 2x2 pack,
    position ids, timestep = sigma, target n - x, MSE. Returns (loss, prediction)."""
    from diffusers import Krea2Pipeline

    pipe = Krea2Pipeline.from_pretrained(str(folder), local_files_only=True)
    vae = pipe.vae
    with torch.no_grad():
        embeds, mask = pipe.encode_prompt(prompt=prompts, max_sequence_length=512)
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
        model_input = (vae.encode(px.unsqueeze(2)).latent_dist.mode() - mean) * inv_std
    assert embeds.shape[1] == 512 and not mask.all()
    noise5 = noise.unsqueeze(2)
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = ((1.0 - s) * model_input + s * noise5).permute(0, 2, 1, 3, 4)
    b, c, _, h, w = model_input.shape
    packed = noisy.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    packed = packed.reshape(b, (h // 2) * (w // 2), c * 4)
    ids = Krea2Pipeline.prepare_position_ids(embeds.shape[1], h // 2, w // 2, "cpu")
    with torch.no_grad():
        pred = pipe.transformer(hidden_states=packed, encoder_hidden_states=embeds,
                                timestep=sigmas * 1000 / 1000, position_ids=ids,
                                encoder_attention_mask=mask, return_dict=False)[0]
    pred = pred.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, 1, h, w)
    target = noise5 - model_input
    loss = ((pred.float() - target.float()) ** 2).reshape(b, -1).mean(1).mean()
    return loss, pred[:, :, 0]


def test_training_loss_matches_the_reference_trainer(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(folder, PROMPTS, px, noise, sigmas)

    c = K.load(str(folder))
    texts = K.encode_prompts(c, PROMPTS)
    assert texts[0]["prompt_embeds"].shape[1] == 12 * 32  # 12 taps, flattened
    latents = K.encode_images(c, px)
    sample = K.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = K.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want_pred, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(K.loss(c, pred, sample), want_loss, rtol=1e-4, atol=1e-6)


def test_training_sigmas_are_the_reference_trainers_draw(folder: Path) -> None:
    """u ~ U(0, 1), the scheduler's unshifted (dynamic shifting) training sigmas at
    floor(u * 1000)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    c = K.load(str(folder))
    latents = torch.zeros(4000, 16, 2, 2)
    sample = K.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                noise=torch.zeros_like(latents))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(folder), subfolder="scheduler")
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample.timesteps / 1000, scheduler.sigmas[(u * 1000).long()])
    assert scheduler.config.use_dynamic_shifting and scheduler.config.max_shift == 1.15


# ---------------------------------------------------------------- LoRA, merge


def generate(pipe, embeds: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt_embeds=embeds, prompt_embeds_mask=torch.ones(embeds.shape[:2]).bool(),
                    num_inference_steps=2, height=64, width=64, guidance_scale=0.0,
                    generator=torch.Generator().manual_seed(0), output_type="pt").images


def test_lora_trains_and_reloads_with_load_lora_weights(folder: Path, tmp_path: Path) -> None:
    from diffusers import Krea2Pipeline

    trained = K.load(str(folder))
    add_lora(trained, K)
    texts = K.encode_prompts(trained, PROMPTS)
    latents = K.encode_images(trained, pixels(2))
    s = K.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    K.loss(trained, K.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert any("text_fusion.refiner_blocks.0.attn.to_q" in n for n in lora)
    assert all(p.grad is not None for p in lora.values())

    paths = K.save_lora(trained, tmp_path / "lora")
    embeds = texts[0]["prompt_embeds"][None].unflatten(-1, (12, -1)).detach()
    want = generate(K.validation_pipeline(trained), embeds)
    pipe = Krea2Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe, embeds)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe, embeds)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with safe_open(str(paths["comfyui"]), "pt") as f:
        keys = list(f.keys())
    assert "transformer.transformer_blocks.0.attn.to_gate.lora_A.weight" in keys
    assert "transformer.img_in.alpha" in keys


def test_validation_takes_flat_embeddings_with_guidance(folder: Path) -> None:
    c = K.load(str(folder))
    pos, neg = (t["prompt_embeds"][None] for t in K.encode_prompts(c, [PROMPTS[0], ""]))
    pipe = K.validation_pipeline(c)
    common = {"num_inference_steps": 2, "height": 64, "width": 64, "output_type": "pt"}
    with torch.no_grad():
        a = pipe(prompt_embeds=pos, negative_prompt_embeds=neg, guidance_scale=4.5,
                 generator=torch.Generator().manual_seed(0), **common).images
        b = pipe(prompt_embeds=pos, negative_prompt_embeds=neg, guidance_scale=0.0,
                 generator=torch.Generator().manual_seed(0), **common).images
    assert a.shape == (1, 3, 64, 64) and not torch.allclose(a, b)


def test_merge_writes_a_folder_krea2pipeline_loads(tmp_path: Path, tiny_workspace: Path) -> None:
    from diffusers import Krea2Pipeline

    from core import ops
    from core.config import save_config
    from core.models.adapters import adapter_config
    from core.models.tiny import resolve_model_path

    cfg = small_config(tmp_path, family="krea2", images=2)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    c = K.load(resolve_model_path("tiny:krea2", tiny_workspace))
    c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, K.lora_target_modules()))
    with torch.no_grad():
        for p in c.denoiser.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    K.save_lora(c, run / "lora")
    merged = ops.merge_run(run, tiny_workspace)
    loaded = Krea2Pipeline.from_pretrained(str(merged), local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    base = Krea2Pipeline.from_pretrained(resolve_model_path("tiny:krea2", tiny_workspace),
                                         local_files_only=True)
    base.set_progress_bar_config(disable=True)
    embeds = K.encode_prompts(K.load(str(merged)), ["a red circle"])[0]["prompt_embeds"]
    embeds = embeds[None].unflatten(-1, (12, -1))
    from_merged = generate(loaded, embeds)
    base.load_lora_weights(str(run / "lora"))
    torch.testing.assert_close(from_merged, generate(base, embeds), atol=2e-4, rtol=1e-3)


# ---------------------------------------------------------------- the check


def test_turbo_is_warned_about_naming_model_path(folder: Path, tmp_path: Path) -> None:
    turbo = tmp_path / "krea2-distilled"
    shutil.copytree(folder, turbo)
    index = json.loads((turbo / "model_index.json").read_text())
    (turbo / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    problems = model_problems(str(turbo))
    assert [(p.level, p.where) for p in problems] == [("warning", "model.path")]
    assert str(turbo) in problems[0].message and "Raw" in problems[0].message
    assert model_problems(str(folder)) == []
    assert model_problems("krea/Krea-2-Turbo")[0].level == "warning"
    modular = tmp_path / "modular"
    modular.mkdir()
    (modular / "modular_model_index.json").write_text(
        json.dumps({"_class_name": "Krea2TurboModularPipeline"}))
    levels = sorted(p.level for p in model_problems(str(modular)))
    assert levels == ["error", "warning"]


def test_missing_component_and_other_family_are_named(folder: Path, tmp_path: Path) -> None:
    from core.models.loading import check_model_source

    broken = tmp_path / "krea2-broken"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("transformer"))
    problems = model_problems(str(broken))
    assert len(problems) == 1 and "transformer/" in problems[0].message
    assert str(broken) in problems[0].message
    other = tmp_path / "qwen"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    [problem] = check_model_source(str(other), "krea2")
    assert "QwenImagePipeline" in problem.message and 'model.family = "qwen_image"' in \
        problem.message
    [problem] = check_model_source(str(folder), "qwen_image")
    assert "Krea2Pipeline" in problem.message and "krea2" in problem.message


# ---------------------------------------------------------------- a real run


def test_trains_a_few_steps_and_saves_a_lora(tmp_path: Path, tiny_workspace: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="krea2")
    cfg.train.max_steps = 2
    cfg.validation.every = 2
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "lora/lora_comfyui.safetensors").is_file()
    assert (run / "validation/step_000002/00.png").is_file()


def test_the_config_check_reaches_the_family_and_random_krea2_estimates(tmp_path: Path) -> None:
    from core.config import Config, validate_config
    from core.models.full_size.meta import parameter_counts

    cfg = Config()
    cfg.model.family, cfg.model.path = "krea2", "krea/Krea-2-Turbo"
    found = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert found and found[0].level == "warning" and "krea/Krea-2-Turbo" in found[0].message
    counts = parameter_counts("krea2")  # the shipped configs, offline, no weights
    assert counts["transformer"] == 12_820_073_036  # Krea2Transformer2DModel's defaults
    assert counts["text_encoder"] == 4_437_815_808  # Qwen3-VL-4B, vision tower included


def test_a_swapped_block_trains_as_in_place(tmp_path: Path, tiny_workspace: Path) -> None:
    """model.blocks_to_swap = 1 (block_lists: transformer_blocks): the same losses and
    LoRA as unswapped, through an eval and a validation round."""
    from test_block_swap import assert_one_swapped_block_trains_as_in_place

    assert_one_swapped_block_trains_as_in_place(tmp_path, tiny_workspace, "krea2")


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" compiles the transformer_blocks (aot_eager on the CPU, as
    tests/test_hot_loop.py): the same step losses as uncompiled."""
    from conftest import assert_compiled_blocks_train_alike

    assert_compiled_blocks_train_alike(tmp_path, tiny_workspace, "krea2", monkeypatch)


def test_a_single_file_is_recognised_and_needs_model_config_offline(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from core.models import loading

    ckpt = tmp_path / "krea2_raw.safetensors"
    save_file({"txtfusion.projector.weight": torch.ones(1, 12),
               "blocks.0.attn.wq.weight": torch.zeros(2, 2)}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == "krea2"
    with pytest.raises(loading.ModelLoadError) as info:
        K.load(str(ckpt))
    assert str(ckpt) in str(info.value) and "model.config" in str(info.value)
