"""Anima on its tiny random modular model (CPU, seconds each): the training loss against
the objective written out from diffusers' Anima classes as the reference trainer
(diffusion-pipe) computes it (its 512-token text; ours keeps the real tokens), its
sigma draw, a LoRA that loads with AnimaModularPipeline.load_lora_weights and changes the
image, a merged folder that ModularPipeline.from_pretrained loads, the modular folder's
recognition and the check's Turbo / wrong-family / missing-component / model_index.json
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

from core.models.families.anima.checks import model_problems
from core.models.families.anima.family import FAMILY as A
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-anima")
    build_tiny_folder("anima", out, seed=0)
    return out


def modular(folder: Path | str) -> object:
    """The folder as diffusers documents loading Anima (torchvision's resize stood in
    for, as this project does not install it: cosmos_shim.py)."""
    from diffusers import ModularPipeline

    from core.models.families.anima.cosmos_shim import ensure_padding_resize

    ensure_padding_resize()
    pipe = ModularPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.load_components(dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------- the reference loss


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference trainer's step written out: both tokenizers padded to 512, Qwen3's
    last hidden states with the padding zeroed, the conditioner on the T5 ids with both
    masks and its padded rows zeroed, (z - mean) / std latents of one frame,
    (1 - s) x + s n, the zero padding mask, timestep sigma, target n - x, MSE."""
    pipe = modular(folder)
    vae = pipe.vae
    qwen = pipe.tokenizer(prompts, padding="max_length", max_length=512, truncation=True,
                          return_tensors="pt")
    t5 = pipe.t5_tokenizer(prompts, padding="max_length", max_length=512, truncation=True,
                           return_tensors="pt")
    with torch.no_grad():
        hidden = pipe.text_encoder(input_ids=qwen.input_ids,
                                   attention_mask=qwen.attention_mask).last_hidden_state
        hidden[~qwen.attention_mask.bool()] = 0
        text = pipe.text_conditioner(source_hidden_states=hidden,
                                     target_input_ids=t5.input_ids,
                                     target_attention_mask=t5.attention_mask,
                                     source_attention_mask=qwen.attention_mask)
        text[~t5.attention_mask.bool()] = 0
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        x = (vae.encode(px.unsqueeze(2)).latent_dist.mode() - mean) / std
    assert text.shape[1] == 512
    n = noise.unsqueeze(2)
    s = sigmas.view(-1, 1, 1, 1, 1)
    padding = torch.zeros(1, 1, px.shape[-2], px.shape[-1])
    with torch.no_grad():
        pred = pipe.transformer(hidden_states=(1 - s) * x + s * n, timestep=sigmas,
                                encoder_hidden_states=text, padding_mask=padding,
                                return_dict=False)[0]
    loss = ((pred.float() - (n - x).float()) ** 2).reshape(len(prompts), -1).mean(1).mean()
    return loss, pred[:, :, 0]


def test_training_loss_matches_the_reference_trainer(folder: Path) -> None:
    px = pixels(2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(folder, PROMPTS, px, noise, sigmas)

    c = A.load(str(folder))
    texts = A.encode_prompts(c, PROMPTS)
    assert [t["prompt_embeds"].shape[0] for t in texts] == [11, 51]  # real T5 tokens only
    latents = A.encode_images(c, px)
    sample = A.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = A.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want_pred, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(A.loss(c, pred, sample), want_loss, rtol=1e-4, atol=1e-6)


def test_training_sigmas_are_the_reference_trainers_draw(folder: Path) -> None:
    """sigmoid(N(0, 1)), unshifted, although the scheduler samples with shift 3."""
    c = A.load(str(folder))
    latents = torch.zeros(4000, 16, 2, 2)
    sample = A.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                noise=torch.zeros_like(latents))
    sigmas = sample.timesteps / 1000
    assert c.noise_scheduler.config.shift == 3.0
    assert abs(float(sigmas.median()) - 0.5) < 0.03
    logits = torch.logit(sigmas.double())
    assert abs(float(logits.mean())) < 0.06 and abs(float(logits.std()) - 1.0) < 0.05


# ---------------------------------------------------------------- LoRA, validation, merge


def generate(pipe, embeds: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt_embeds=embeds, num_inference_steps=2, height=64, width=64,
                    generator=torch.Generator().manual_seed(0), output_type="pt",
                    **kwargs).images


def test_lora_trains_and_reloads_with_load_lora_weights(folder: Path, tmp_path: Path) -> None:
    trained = A.load(str(folder))
    add_lora(trained, A)
    texts = A.encode_prompts(trained, PROMPTS)
    latents = A.encode_images(trained, pixels(2))
    s = A.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    A.loss(trained, A.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert any("transformer_blocks.1.attn2.to_k" in n for n in lora)
    assert all(p.grad is not None for p in lora.values())

    paths = A.save_lora(trained, tmp_path / "lora")
    embeds = texts[0]["prompt_embeds"][None].detach()
    common = {"guidance_scale": 1.0}
    want = generate(A.validation_pipeline(trained), embeds, **common)
    pipe = A.validation_pipeline(A.load(str(folder)))
    base = generate(pipe, embeds, **common)
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    got = generate(pipe, embeds, **common)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with safe_open(str(paths["comfyui"]), "pt") as f:
        keys = list(f.keys())
    assert "diffusion_model.blocks.0.cross_attn.k_proj.lora_A.weight" in keys
    assert "diffusion_model.blocks.1.mlp.layer2.alpha" in keys


def test_validation_samples_as_the_pipeline_from_its_prompt(folder: Path) -> None:
    """The cached text through CachedTextBlocks draws what AnimaAutoBlocks draws from the
    prompt, with guidance (the empty prompt as negative) and without."""
    c = A.load(str(folder))
    pos, neg = (t["prompt_embeds"][None] for t in A.encode_prompts(c, [PROMPTS[0], ""]))
    ours = A.validation_pipeline(c)
    theirs = modular(folder)
    for scale in (4.5, 1.0):
        from diffusers.guiders import ClassifierFreeGuidance

        theirs.update_components(guider=ClassifierFreeGuidance(guidance_scale=scale))
        with torch.no_grad():
            want = theirs(prompt=PROMPTS[0], negative_prompt="", num_inference_steps=2,
                          height=64, width=64, generator=torch.Generator().manual_seed(0),
                          output_type="pt").images
        got = generate(ours, pos, negative_prompt_embeds=neg, guidance_scale=scale)
        assert got.shape == (1, 3, 64, 64)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_merge_writes_a_folder_the_modular_pipeline_loads(tmp_path: Path,
                                                          tiny_workspace: Path) -> None:
    from core import ops
    from core.config import save_config
    from core.models.adapters import adapter_config
    from core.models.tiny import resolve_model_path

    cfg = small_config(tmp_path, family="anima", images=2)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    c = A.load(resolve_model_path("tiny:anima", tiny_workspace))
    c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, A.lora_target_modules()))
    with torch.no_grad():
        for p in c.denoiser.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    A.save_lora(c, run / "lora")
    merged = ops.merge_run(run, tiny_workspace)
    index = json.loads((Path(merged) / "modular_model_index.json").read_text())
    assert index["_blocks_class_name"] == "AnimaAutoBlocks"
    loaded = modular(merged)
    base = modular(resolve_model_path("tiny:anima", tiny_workspace))
    base.load_lora_weights(str(run / "lora"))
    kwargs = {"prompt": "a red circle", "num_inference_steps": 2, "height": 64, "width": 64,
              "output_type": "pt"}
    with torch.no_grad():
        a = loaded(generator=torch.Generator().manual_seed(0), **kwargs).images
        b = base(generator=torch.Generator().manual_seed(0), **kwargs).images
    torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)


# ---------------------------------------------------------------- the check


def test_a_modular_folder_is_recognised_and_turbo_warned(folder: Path, tmp_path: Path) -> None:
    from core.models.loading import check_model_source, folder_families

    assert folder_families(str(folder)) == ("anima",)
    assert check_model_source(str(folder), "anima") == []
    assert model_problems(str(folder)) == []
    turbo = tmp_path / "anima-turbo-v1.0"
    shutil.copytree(folder, turbo)
    problems = model_problems(str(turbo))
    assert [(p.level, p.where) for p in problems] == [("warning", "model.path")]
    assert str(turbo) in problems[0].message and "base" in problems[0].message
    assert model_problems("someone/Anima-Turbo")[0].level == "warning"


def test_missing_component_other_family_and_plain_index_are_named(folder: Path,
                                                                  tmp_path: Path) -> None:
    from core.models.loading import ModelLoadError, check_model_source

    broken = tmp_path / "anima-broken"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("transformer"))
    index = broken / "modular_model_index.json"  # its components where it is, as saved there
    index.write_text(index.read_text().replace(str(folder), str(broken)))
    [problem] = model_problems(str(broken))
    assert "transformer/" in problem.message and str(broken) in problem.message
    with pytest.raises(ModelLoadError) as info:
        A.load(str(broken))
    assert str(broken) in str(info.value) and "transformer" in str(info.value)
    other = tmp_path / "qwen"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    [problem] = check_model_source(str(other), "anima")
    assert "QwenImagePipeline" in problem.message and 'model.family = "qwen_image"' in \
        problem.message
    [problem] = check_model_source(str(folder), "qwen_image")
    assert "AnimaModularPipeline" in problem.message and "anima" in problem.message
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model_index.json").write_text(json.dumps({"_class_name": "AnimaPipeline"}))
    [problem] = model_problems(str(plain))
    assert problem.level == "error" and "modular_model_index.json" in problem.message
    empty = tmp_path / "empty"
    empty.mkdir()
    [problem] = check_model_source(str(empty), "anima")
    assert "modular_model_index.json" in problem.message


def test_a_single_file_is_recognised_and_refused_with_what_to_use(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from core.models import loading

    ckpt = tmp_path / "anima-base-v1.0.safetensors"
    save_file({"net.llm_adapter.blocks.0.cross_attn.q_proj.weight": torch.ones(2, 2),
               "net.blocks.0.mlp.layer1.weight": torch.zeros(2, 2)}, str(ckpt))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(ckpt))) == "anima"
    with pytest.raises(loading.ModelLoadError) as info:
        A.load(str(ckpt))
    assert str(ckpt) in str(info.value) and "modular_model_index.json" in str(info.value)


def test_the_config_check_reaches_the_family_and_random_anima_estimates() -> None:
    from core.config import Config, validate_config
    from core.models.full_size.meta import parameter_counts

    cfg = Config()
    cfg.model.family, cfg.model.path = "anima", "circlestone-labs/Anima-Turbo"
    found = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert any(p.level == "warning" and "Turbo" in p.message for p in found)
    counts = parameter_counts("anima")  # the shipped configs, offline, no weights
    assert counts["transformer"] == 1_956_405_248  # Cosmos-Predict2 2B
    assert counts["text_encoder"] == 596_049_920  # Qwen3-0.6B, no LM head
    assert counts["text_encoder_2"] == 134_663_680  # the LLM adapter (AnimaTextConditioner)


# ---------------------------------------------------------------- a real run


def test_trains_a_few_steps_and_saves_a_lora(tmp_path: Path, tiny_workspace: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, images=2, family="anima")
    cfg.train.max_steps = 2
    cfg.validation.every = 2
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "lora/lora_comfyui.safetensors").is_file()
    assert (run / "validation/step_000002/00.png").is_file()


def test_a_swapped_block_trains_as_in_place(tmp_path: Path, tiny_workspace: Path) -> None:
    """model.blocks_to_swap = 1 (block_lists: transformer_blocks): the same losses and
    LoRA as unswapped, through an eval and a validation round."""
    from test_block_swap import assert_one_swapped_block_trains_as_in_place

    assert_one_swapped_block_trains_as_in_place(tmp_path, tiny_workspace, "anima")


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" compiles the transformer_blocks (aot_eager on the CPU, as
    tests/test_hot_loop.py): the same step losses as uncompiled."""
    from conftest import assert_compiled_blocks_train_alike

    assert_compiled_blocks_train_alike(tmp_path, tiny_workspace, "anima", monkeypatch)
