"""FLUX.3 on its tiny random model (CPU, seconds each): the training loss against the
objective written out from the modular pipeline's own steps (its text step's padded
windows, FLUX.2's normalised latents, token packing and ids, sigma as the timestep,
target noise - latents), windows of two lengths in one batch, the pipeline's constant
shift, a LoRA that loads with Flux3ModularPipeline.load_lora_weights and changes the
image, a merged folder the modular pipeline loads, the distilled (flow-map) checkpoint,
the check's distilled / no-index / missing-component / wrong-family problems, and a short
real training run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process
from test_family_qwen_image import batch_of, pixels  # the same images and collate
from test_models_flow import add_lora

from core.models.families.flux3.checks import model_problems
from core.models.families.flux3.family import FAMILY as F
from core.models.families.flux3.folder import TextProcessor, blocks_for
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles " * 2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-flux3")
    build_tiny_folder("flux3", out, seed=0)
    return out


def stock_pipeline(folder: Path):
    """The stock blocks, less the prompt upsampler and text step (the embeddings are
    given), loaded from `folder` as diffusers documents: init_pipeline + load_components."""
    blocks = blocks_for(False)
    blocks.sub_blocks.pop("text_encoder")
    pipe = blocks.init_pipeline(str(folder))
    pipe.load_components(pretrained_model_name_or_path=str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, embeds: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt_embeds=embeds, negative_prompt_embeds=negative,
                    num_inference_steps=2, height=64, width=64,
                    generator=torch.Generator().manual_seed(0), output="images",
                    output_type="pt")


# ---------------------------------------------------------------- the reference loss


def reference(folder: Path, prompt: str, px: torch.Tensor, noise: torch.Tensor,
              sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample's step written out from the modular pipeline's steps: its text step,
    its VAE step's patchify and batch-norm normalisation, (1 - s) x + s n, tokens and
    ids as its prepare steps make them, target n - x. Returns (prediction, target)."""
    from diffusers.modular_pipelines.flux3.before_denoise import (
        Flux3TextRoPEInputsStep,
        _prepare_image_ids,
    )
    from diffusers.modular_pipelines.flux3.encoders import (
        Flux3TextEncoderStep,
        Flux3VaeEncoderStep,
    )

    from core.models.families.flux3.folder import load_parts

    parts = load_parts(str(folder), None, True)
    vae = parts["vae"]
    with torch.no_grad():
        embeds = Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
            parts["text_encoder"], TextProcessor(parts["tokenizer"]), prompt, device="cpu")
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        x = (Flux3VaeEncoderStep._patchify_latents(vae.encode(px).latent_dist.mode())
             - mean) / std
        noisy = (1 - sigma) * x + sigma * noise
        _, c, h, w = x.shape
        pred = parts["transformer"](
            hidden_states=noisy.flatten(2).transpose(1, 2), encoder_hidden_states=embeds,
            timestep=torch.tensor([sigma]), img_ids=_prepare_image_ids(h, w, 0.5),
            txt_ids=Flux3TextRoPEInputsStep._prepare_text_ids(embeds), return_dict=False)[0]
    return pred.transpose(1, 2).reshape(1, c, h, w), noise - x


def test_training_loss_matches_the_pipelines_objective(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want = [reference(folder, p, px[i:i + 1], noise[i:i + 1], float(sigmas[i]))
            for i, p in enumerate(PROMPTS)]

    c = F.load(str(folder))
    texts = F.encode_prompts(c, PROMPTS)
    assert [t["prompt_embeds"].shape for t in texts] == [(80, 8 * 32), (160, 8 * 32)]
    latents = F.encode_images(c, px)
    sample = F.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = F.predict(c, sample, batch_of(texts, latents))  # two window lengths
    torch.testing.assert_close(pred, torch.cat([p for p, _ in want]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sample.target, torch.cat([t for _, t in want]), rtol=1e-4,
                               atol=1e-5)
    loss = torch.stack([((p - t) ** 2).mean() for p, t in want]).mean()
    torch.testing.assert_close(F.loss(c, pred, sample), loss, rtol=1e-4, atol=1e-6)


def test_training_shift_is_the_pipelines_constant_shift(folder: Path) -> None:
    from diffusers.modular_pipelines.flux3.before_denoise import Flux3SetTimestepsStep

    c = F.load(str(folder))
    assert not (folder / "scheduler").exists()  # built from the blocks' config, as diffusers
    assert F.train_shift(c) == Flux3SetTimestepsStep().shift == 6.93
    assert F.flow_settings(c).timestep_sampling == "logit_normal"


# ---------------------------------------------------------------- LoRA, merge, validation


def test_lora_trains_and_loads_with_the_modular_pipelines_load_lora_weights(
        folder: Path, tmp_path: Path) -> None:
    trained = F.load(str(folder))
    add_lora(trained, F)
    texts = F.encode_prompts(trained, PROMPTS)
    latents = F.encode_images(trained, pixels(2))
    s = F.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    F.loss(trained, F.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert any("txt_mode_blocks.0.attn.to_q" in n for n in lora)
    assert any("single_transformer_blocks.0.attn.to_out.0" in n for n in lora)
    # the reference-image blocks never run in text-to-image training: their LoRA stays 0
    assert all(p.grad is not None for n, p in lora.items() if "image_cond" not in n)

    paths = F.save_lora(trained, tmp_path / "lora")
    assert set(paths) == {"diffusers"}  # ComfyUI 0.29.0 has no FLUX.3
    embeds = texts[0]["prompt_embeds"][None].detach()
    negative = F.encode_prompts(trained, [""])[0]["prompt_embeds"][None]
    want = F.validation_pipeline(trained)(
        prompt_embeds=embeds, negative_prompt_embeds=negative, num_inference_steps=2,
        height=64, width=64, guidance_scale=3.5, generator=torch.Generator().manual_seed(0),
        output_type="pt").images
    pipe = stock_pipeline(folder)
    base = generate(pipe, embeds, negative)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe, embeds, negative)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_validation_guides_with_the_negative(folder: Path) -> None:
    c = F.load(str(folder))
    pos, neg = (t["prompt_embeds"][None] for t in F.encode_prompts(c, [PROMPTS[0], ""]))
    pipe = F.validation_pipeline(c)
    common = {"num_inference_steps": 2, "height": 64, "width": 64, "output_type": "pt"}
    with torch.no_grad():
        a = pipe(prompt_embeds=pos, negative_prompt_embeds=neg, guidance_scale=4.5,
                 generator=torch.Generator().manual_seed(0), **common).images
        b = pipe(prompt_embeds=pos, negative_prompt_embeds=neg, guidance_scale=1.0,
                 generator=torch.Generator().manual_seed(0), **common).images
    assert a.shape == (1, 3, 64, 64) and not torch.allclose(a, b)


def test_merge_writes_a_folder_the_modular_pipeline_loads(tmp_path: Path,
                                                          tiny_workspace: Path) -> None:
    from core import ops
    from core.config import save_config
    from core.models.adapters import adapter_config
    from core.models.tiny import resolve_model_path

    cfg = small_config(tmp_path, family="flux3", images=2)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    source = resolve_model_path("tiny:flux3", tiny_workspace)
    c = F.load(source)
    c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, F.lora_target_modules()))
    with torch.no_grad():
        for p in c.denoiser.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    F.save_lora(c, run / "lora")
    merged = ops.merge_run(run, tiny_workspace)
    index = json.loads((merged / "modular_model_index.json").read_text())
    assert index["_class_name"] == "Flux3ModularPipeline"
    assert {"transformer", "vae", "text_encoder", "tokenizer"} <= set(index)
    texts = F.encode_prompts(F.load(str(merged)), ["a red circle", ""])
    embeds, negative = (t["prompt_embeds"][None] for t in texts)
    base = stock_pipeline(Path(source))
    base.load_lora_weights(str(run / "lora"))
    torch.testing.assert_close(generate(stock_pipeline(merged), embeds, negative),
                               generate(base, embeds, negative), atol=2e-4, rtol=1e-3)


def test_the_distilled_checkpoint_predicts_and_samples_as_a_flow_map(tmp_path: Path) -> None:
    from core.models.families.flux3.tiny import build

    build(tmp_path / "distilled", seed=0, flow_map=True)
    c = F.load(str(tmp_path / "distilled"))
    assert c.is_distilled
    texts = F.encode_prompts(c, PROMPTS[:1])
    latents = F.encode_images(c, pixels(1))
    s = F.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert F.predict(c, s, batch_of(texts, latents)).shape == latents.shape
    pipe = F.validation_pipeline(c)
    assert type(pipe).__name__ == "Flux3DistilledModularPipeline"
    image = pipe(prompt_embeds=texts[0]["prompt_embeds"][None], num_inference_steps=2,
                 guidance_scale=1.0, height=64, width=64,
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (64, 64)
    assert [p.level for p in model_problems(str(tmp_path / "distilled"))] == ["warning"]


# ---------------------------------------------------------------- the check


def test_distilled_is_warned_about_naming_model_path(folder: Path, tmp_path: Path) -> None:
    distilled = tmp_path / "flux3-fast"
    shutil.copytree(folder, distilled)
    index = json.loads((distilled / "modular_model_index.json").read_text())
    (distilled / "modular_model_index.json").write_text(json.dumps(
        {**index, "_class_name": "Flux3DistilledModularPipeline"}))
    problems = model_problems(str(distilled))
    assert [(p.level, p.where) for p in problems] == [("warning", "model.path")]
    assert str(distilled) in problems[0].message and "base" in problems[0].message
    assert model_problems(str(folder)) == []
    assert model_problems("black-forest-labs/FLUX.3-distilled")[0].level == "warning"


def test_missing_index_component_and_other_family_are_named(folder: Path,
                                                            tmp_path: Path) -> None:
    from core.models.loading import check_model_source

    broken = tmp_path / "flux3-broken"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("transformer"))
    [problem] = model_problems(str(broken))
    assert "transformer/" in problem.message and str(broken) in problem.message
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns("modular_model_index.json"))
    [problem] = model_problems(str(bare))
    assert "modular_model_index.json" in problem.message and str(bare) in problem.message
    [problem] = check_model_source(str(bare), "flux3")  # the shared check, no traceback
    assert "modular_model_index.json" in problem.message
    other = tmp_path / "flux2"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline"}))
    [problem] = check_model_source(str(other), "flux3")
    assert "Flux2KleinPipeline" in problem.message and 'model.family = "flux2"' in \
        problem.message
    [problem] = check_model_source(str(folder), "flux2")
    assert "Flux3ModularPipeline" in problem.message and "flux3" in problem.message
    assert check_model_source(str(folder), "flux3") == []


def test_the_config_check_reaches_the_family_and_random_flux3_estimates() -> None:
    from core.config import Config, validate_config
    from core.models.full_size.meta import parameter_counts

    cfg = Config()
    cfg.model.family, cfg.model.path = "flux3", "someone/FLUX.3-distilled"
    found = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert found and found[0].level == "warning" and "FLUX.3-distilled" in found[0].message
    counts = parameter_counts("flux3")  # the shipped configs, offline, no weights
    assert counts["transformer"] == 5_538_458_368  # Flux3Transformer2DModel's defaults
    assert counts["text_encoder"] == 4_437_815_808  # Qwen3-VL-4B, vision tower included


def test_a_single_file_is_recognised_and_refused_with_what_to_use(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from core.models import loading

    ckpt = tmp_path / "flux3.safetensors"
    save_file({"early_stream_modulations.image.lin.weight": torch.ones(2, 2),
               "single_blocks.0.q_proj.weight": torch.zeros(2, 2)}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == "flux3"
    with pytest.raises(loading.ModelLoadError) as info:
        F.load(str(ckpt))
    assert str(ckpt) in str(info.value) and "diffusers folder" in str(info.value)


# ---------------------------------------------------------------- a real run


def test_trains_a_few_steps_and_saves_a_lora(tmp_path: Path, tiny_workspace: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="flux3")
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
    """model.blocks_to_swap = 1 (the text's, the image's per-mode blocks, then the joint
    ones): the same losses and LoRA as unswapped."""
    from test_block_swap import assert_one_swapped_block_trains_as_in_place

    assert_one_swapped_block_trains_as_in_place(tmp_path, tiny_workspace, "flux3")


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" (aot_eager on the CPU): the same step losses."""
    from conftest import assert_compiled_blocks_train_alike

    assert_compiled_blocks_train_alike(tmp_path, tiny_workspace, "flux3", monkeypatch)
