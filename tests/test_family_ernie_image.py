"""ERNIE-Image on its tiny random model (CPU, seconds each): the training loss against the
objective written out as ErnieImagePipeline samples it (its encode_prompt and _pad_text,
the FLUX.2 VAE's patchified latents normalised as the pipeline's decode undoes them, the
scheduler's timestep scale), the sigma draw under the scheduler's static shift, a LoRA
that reloads with ErnieImagePipeline.load_lora_weights and changes the image, a merged
folder ErnieImagePipeline loads, a single transformer file, the check's Turbo /
wrong-family / missing-component problems, and short real training runs."""

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

from core.models.families.ernie_image.checks import model_problems
from core.models.families.ernie_image.family import FAMILY as E
from core.models.tiny import resolve_model_path

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tiny_workspace: Path) -> Path:
    """tiny:ernie_image, built once for the session (the tests copy it, never change it)."""
    return Path(resolve_model_path("tiny:ernie_image", tiny_workspace))


def pipeline(folder: Path):
    from diffusers import ErnieImagePipeline

    pipe = ErnieImagePipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------- the reference loss


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's model call written out for a training step: encode_prompt's
    per-prompt hidden states padded by _pad_text, the VAE's mode patchified and
    normalised with the batch-norm statistics at eps 1e-5 (the inverse of the pipeline's
    decode), (1 - s) x + s n, timestep s * 1000, target n - x, MSE."""
    pipe = pipeline(folder)
    vae = pipe.vae
    with torch.no_grad():
        hiddens = pipe.encode_prompt(prompts, torch.device("cpu"))
        text, lens = pipe._pad_text(hiddens, torch.device("cpu"), torch.float32,
                                    pipe.transformer.config.text_in_dim)
        patches = pipe._patchify_latents(vae.encode(px).latent_dist.mode())
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + 1e-5)
        model_input = (patches - mean) / std
    assert len(set(lens.tolist())) == 2, "the prompts have lengths of their own"
    s = sigmas.view(-1, 1, 1, 1)
    noisy = (1.0 - s) * model_input + s * noise
    with torch.no_grad():
        pred = pipe.transformer(hidden_states=noisy, timestep=sigmas * 1000, text_bth=text,
                                text_lens=lens, return_dict=False)[0]
    target = noise - model_input
    loss = ((pred.float() - target.float()) ** 2).reshape(len(px), -1).mean(1).mean()
    return loss, pred


def test_training_loss_matches_the_pipelines_objective(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(folder, PROMPTS, px, noise, sigmas)

    c = E.load(str(folder))
    texts = E.encode_prompts(c, PROMPTS)
    assert texts[0]["prompt_embeds"].shape[1] == 32 and texts[0]["prompt_mask"].all()
    latents = E.encode_images(c, px)
    sample = E.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = E.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want_pred, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(E.loss(c, pred, sample), want_loss, rtol=1e-4, atol=1e-6)


def test_training_sigmas_are_uniform_under_the_schedulers_static_shift(folder: Path) -> None:
    """u ~ U(0, 1) bent by the shift the pipeline's sampling applies: the scheduler
    config's (3.0 here), read from the loaded model."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    c = E.load(str(folder))
    settings = E.flow_settings(c)
    assert (settings.timestep_sampling, settings.shift) == ("uniform", 3.0)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(c.noise_scheduler.config)
    scheduler.set_timesteps(sigmas=torch.linspace(1.0, 0.0, 5)[:-1].numpy())
    u = torch.linspace(1.0, 0.0, 5)[:-1]
    torch.testing.assert_close(scheduler.sigmas[:-1], 3 * u / (1 + 2 * u))
    latents = torch.zeros(4000, 32, 2, 2)
    sample = E.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                noise=torch.zeros_like(latents))
    # the median of a uniform u bent by shift 3: 3 * 0.5 / (1 + 2 * 0.5) = 0.75
    assert abs(float((sample.timesteps / 1000).median()) - 0.75) < 0.02


# ---------------------------------------------------------------- LoRA, merge


def generate(pipe, embeds: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt_embeds=[embeds], num_inference_steps=2, height=64, width=64,
                    guidance_scale=1.0, generator=torch.Generator().manual_seed(0),
                    output_type="pt").images


def test_lora_trains_and_reloads_with_load_lora_weights(folder: Path, tmp_path: Path) -> None:
    trained = E.load(str(folder))
    add_lora(trained, E)
    texts = E.encode_prompts(trained, PROMPTS)
    latents = E.encode_images(trained, pixels(2))
    s = E.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    E.loss(trained, E.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert any("layers.1.self_attention.to_out.0" in n for n in lora)
    assert all(p.grad is not None for p in lora.values())

    paths = E.save_lora(trained, tmp_path / "lora")
    embeds = texts[0]["prompt_embeds"].detach()
    want = generate(E.validation_pipeline(trained), embeds)
    pipe = pipeline(folder)
    base = generate(pipe, embeds)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe, embeds)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with safe_open(str(paths["comfyui"]), "pt") as f:
        keys = list(f.keys())
    assert "transformer.layers.0.self_attention.to_q.lora_A.weight" in keys
    assert "transformer.layers.0.self_attention.to_q.alpha" in keys


def test_validation_guides_above_one_with_the_negative(folder: Path) -> None:
    c = E.load(str(folder))
    pos, neg = (t["prompt_embeds"] for t in E.encode_prompts(c, [PROMPTS[0], ""]))
    pipe = E.validation_pipeline(c)
    common = {"num_inference_steps": 2, "height": 64, "width": 64, "output_type": "pt"}

    def draw(scale: float) -> torch.Tensor:
        with torch.no_grad():
            return pipe(prompt_embeds=[pos], negative_prompt_embeds=[neg],
                        guidance_scale=scale, generator=torch.Generator().manual_seed(0),
                        **common).images

    a, b = draw(4.0), draw(1.0)
    assert a.shape == (1, 3, 64, 64) and not torch.allclose(a, b)


def test_merge_writes_a_folder_ernieimagepipeline_loads(tmp_path: Path,
                                                        tiny_workspace: Path) -> None:
    from core import ops
    from core.config import save_config
    from core.models.adapters import adapter_config

    cfg = small_config(tmp_path, family="ernie_image", images=2)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    base_folder = Path(resolve_model_path("tiny:ernie_image", tiny_workspace))
    c = E.load(str(base_folder))
    c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, E.lora_target_modules()))
    with torch.no_grad():
        for p in c.denoiser.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    E.save_lora(c, run / "lora")
    merged = ops.merge_run(run, tiny_workspace)
    embeds = E.encode_prompts(E.load(str(merged)), ["a red circle"])[0]["prompt_embeds"]
    base = pipeline(base_folder)
    base.load_lora_weights(str(run / "lora"))
    torch.testing.assert_close(generate(pipeline(merged), embeds), generate(base, embeds),
                               atol=2e-4, rtol=1e-3)


def test_a_single_transformer_file_loads_with_model_config(folder: Path,
                                                           tmp_path: Path) -> None:
    """ComfyUI's diffusion-model file (diffusers' names under model.diffusion_model.):
    recognised by its marker, the transformer read from it, the rest from model.config."""
    from safetensors.torch import load_file, save_file

    from core.models import loading

    weights = load_file(str(next((folder / "transformer").glob("*.safetensors"))))
    ckpt = tmp_path / "ernie_image.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in weights.items()}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == \
        "ernie_image"
    c = E.load(str(ckpt), config=str(folder))
    want = E.load(str(folder)).denoiser.state_dict()
    assert all(torch.equal(t, want[k]) for k, t in c.denoiser.state_dict().items())


# ---------------------------------------------------------------- the check


def test_turbo_is_warned_about_naming_model_path(folder: Path, tmp_path: Path) -> None:
    turbo = tmp_path / "ERNIE-Image-Turbo"
    shutil.copytree(folder, turbo)
    problems = model_problems(str(turbo))
    assert [(p.level, p.where) for p in problems] == [("warning", "model.path")]
    assert str(turbo) in problems[0].message and "baidu/ERNIE-Image" in problems[0].message
    assert model_problems(str(folder)) == []
    assert model_problems("baidu/ERNIE-Image-Turbo")[0].level == "warning"
    assert model_problems("baidu/ERNIE-Image") == []
    assert E.load(str(turbo)).is_distilled and not E.load(str(folder)).is_distilled


def test_missing_component_and_other_family_are_named(folder: Path, tmp_path: Path) -> None:
    from core.models.loading import check_model_source

    broken = tmp_path / "ernie-broken"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("text_encoder"))
    problems = model_problems(str(broken))
    assert len(problems) == 1 and "text_encoder/" in problems[0].message
    assert str(broken) in problems[0].message
    index = json.loads((folder / "model_index.json").read_text())
    assert index["pe"] == [None, None]  # the optional prompt enhancer: no problem absent
    other = tmp_path / "qwen"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    [problem] = check_model_source(str(other), "ernie_image")
    assert "QwenImagePipeline" in problem.message and 'model.family = "qwen_image"' in \
        problem.message
    [problem] = check_model_source(str(folder), "qwen_image")
    assert "ErnieImagePipeline" in problem.message and "ernie_image" in problem.message


def test_the_config_check_reaches_the_family_and_random_ernie_estimates() -> None:
    from core.config import Config, validate_config
    from core.models.full_size.meta import parameter_counts

    cfg = Config()
    cfg.model.family, cfg.model.path = "ernie_image", "baidu/ERNIE-Image-Turbo"
    found = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert found and found[0].level == "warning" and "ERNIE-Image-Turbo" in found[0].message
    counts = parameter_counts("ernie_image")  # the shipped configs, offline, no weights
    assert counts["transformer"] == 8_033_490_048
    assert counts["text_encoder"] == 3_849_090_048  # Ministral 3 3B, vision tower included


# ---------------------------------------------------------------- real runs


def test_trains_a_few_steps_and_saves_a_lora(tmp_path: Path, tiny_workspace: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="ernie_image")
    cfg.train.max_steps = 2
    cfg.validation.every = 2
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "lora/lora_comfyui.safetensors").is_file()
    assert (run / "validation/step_000002/00.png").is_file()


@pytest.mark.slow
def test_a_swapped_block_trains_as_in_place(tmp_path: Path, tiny_workspace: Path) -> None:
    """model.blocks_to_swap = 1 (block_lists: layers): the same losses and LoRA as
    unswapped, through an eval and a validation round."""
    from test_block_swap import assert_one_swapped_block_trains_as_in_place

    assert_one_swapped_block_trains_as_in_place(tmp_path, tiny_workspace, "ernie_image")


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" compiles the layers (aot_eager on the CPU, as
    tests/test_hot_loop.py): the same step losses as uncompiled."""
    from conftest import assert_compiled_blocks_train_alike

    assert_compiled_blocks_train_alike(tmp_path, tiny_workspace, "ernie_image", monkeypatch)
