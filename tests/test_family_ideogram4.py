"""Ideogram 4 on its tiny random model (CPU, seconds each): the loss against a
written-out use of the diffusers classes as train_dreambooth_lora_ideogram4.py uses them
(its text, latent packing, resolution-aware sigmas and target), validation with cached
text drawing what Ideogram4Pipeline draws from the prompt, a LoRA that reloads with
`load_lora_weights`, a short real run, `--stage merge`, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process
from test_family_z_image import batch_of, pixels  # the same images and collate
from test_models_flow import add_lora

from core.config import save_config
from core.models import loading
from core.models.families.ideogram4.family import FAMILY as I4
from core.models.families.ideogram4.text import patchify, to_tokens
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares and green triangles"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ideogram4")
    build_tiny_folder("ideogram4", out, seed=0)
    return out


def script_patchify(z: torch.Tensor) -> torch.Tensor:
    """train_dreambooth_lora_ideogram4.py's patchify_latents, written out."""
    b, c, h, w = z.shape
    z = z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 3, 5, 1)
    return z.reshape(b, (h // 2) * (w // 2), 4 * c)


def reference_loss(folder: Path, prompts: list[str], px: torch.Tensor, noise: torch.Tensor,
                   sigmas: torch.Tensor, msl: int = 96) -> torch.Tensor:
    """The script's loss: the pipeline's encode_prompt at max_sequence_length `msl`, the
    VAE mode patchified and bn-normalised, zt = (1 - s) x + s n behind zeroed text rows,
    model time 1 - s, target x - n, the image rows' MSE."""
    from diffusers import Ideogram4Pipeline

    pipe = Ideogram4Pipeline.from_pretrained(str(folder), local_files_only=True)
    vae = pipe.vae
    with torch.no_grad():
        x = script_patchify(vae.encode(px).latent_dist.mode())
        mean = vae.bn.running_mean.view(1, 1, -1)
        std = torch.sqrt(vae.bn.running_var + vae.config.batch_norm_eps).view(1, 1, -1)
        x = (x - mean) / std
        grid = px.shape[-1] // 16
        embeds, pos, seg, ind = pipe.encode_prompt(prompts, grid, grid, msl, torch.device("cpu"))
        s = sigmas.view(-1, 1, 1)
        noisy = (1 - s) * x + s * noise
        hidden = torch.cat([torch.zeros(len(prompts), msl, x.shape[-1]), noisy], dim=1)
        pred = pipe.transformer(hidden_states=hidden, timestep=(1 - sigmas),
                                encoder_hidden_states=embeds, position_ids=pos,
                                segment_ids=seg, indicator=ind, return_dict=False)[0][:, msl:]
        return torch.mean((pred - (x - noise)) ** 2)


def test_loss_matches_the_reference_trainers(folder: Path) -> None:
    c = I4.load(str(folder))
    px = pixels(2)
    noise4 = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.3, 0.85])
    with torch.no_grad():
        latents = I4.encode_images(c, px)
        batch = batch_of(I4.encode_prompts(c, PROMPTS), latents)
        sample = I4.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise4)
        ours = I4.loss(c, I4.predict(c, sample, batch), sample)
    want = reference_loss(folder, PROMPTS, px, to_tokens(noise4), sigmas)
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)
    # the padding length does not matter (only the real tokens are cached) ...
    torch.testing.assert_close(reference_loss(folder, PROMPTS, px, to_tokens(noise4), sigmas,
                                              msl=200), want, rtol=1e-4, atol=1e-5)
    # ... and the comparison tells a wrong convention: model time the other way round
    flipped = reference_loss(folder, PROMPTS, px, to_tokens(noise4), 1 - sigmas)
    assert not torch.allclose(ours, flipped, rtol=1e-3)


def test_packing_is_the_scripts_channel_order() -> None:
    z = torch.randn(2, 8, 6, 4)
    torch.testing.assert_close(to_tokens(patchify(z)), script_patchify(z))


@pytest.mark.parametrize("side", [64, 1024])
def test_sigmas_are_the_scripts_resolution_aware_logit_normal_draw(folder: Path,
                                                                   side: int) -> None:
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import _resolution_aware_mu
    from diffusers.training_utils import compute_density_for_timestep_sampling

    c = I4.load(str(folder))
    latents = torch.zeros(4000, 1, side // 16, side // 16)
    s = I4.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    want = compute_density_for_timestep_sampling(
        "logit_normal", 4000, logit_mean=_resolution_aware_mu(side, side, base_mu=0.0),
        logit_std=1.5, mode_scale=None, generator=torch.Generator().manual_seed(0))
    from core.models.objectives import SIGMA_EPS

    torch.testing.assert_close(s.timesteps / 1000, want.clamp(SIGMA_EPS, 1 - SIGMA_EPS),
                               rtol=1e-4, atol=1e-4)


def test_validation_with_cached_text_draws_what_the_pipeline_draws(folder: Path) -> None:
    from diffusers import Ideogram4Pipeline

    kw = dict(num_inference_steps=3, height=64, width=64, guidance_scale=4.0,
              guidance_schedule=None, output_type="np")
    pipe = Ideogram4Pipeline.from_pretrained(str(folder), local_files_only=True)
    want = pipe(PROMPTS[1], max_sequence_length=128,
                generator=torch.Generator().manual_seed(0), **kw).images[0]
    c = I4.load(str(folder))
    embeds = I4.encode_prompts(c, [PROMPTS[1]])[0]["prompt_embeds"][None]
    val = I4.validation_pipeline(c)
    kw.pop("guidance_schedule")
    got = val(prompt_embeds=embeds, negative_prompt_embeds=embeds,
              generator=torch.Generator().manual_seed(0), **kw).images[0]
    assert val.unconditional_transformer is None  # registered for the call only
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want),
                               atol=1e-4, rtol=1e-4)




def draw(pipe) -> torch.Tensor:
    out = pipe(PROMPTS[0], num_inference_steps=2, height=64, width=64, output_type="np",
               guidance_scale=3.0, guidance_schedule=None, max_sequence_length=64,
               generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


def test_lora_on_every_block_reloads_with_load_lora_weights(folder: Path,
                                                           tmp_path: Path) -> None:
    from diffusers import Ideogram4Pipeline

    trained = I4.load(str(folder))
    add_lora(trained, I4)
    modules = {n.rsplit(".lora_", 1)[0] for n, _ in trained.denoiser.named_parameters()
               if "lora_" in n}
    assert len(modules) == 2 * 7  # 2 blocks x (q, k, v, out, w1, w2, w3)
    paths = I4.save_lora(trained, tmp_path / "lora")
    assert set(paths) == {"diffusers", "comfyui"}
    pipe = Ideogram4Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base = draw(pipe)
    reference = I4.validation_pipeline(trained)
    want = draw(reference)
    pipe.load_lora_weights(str(tmp_path / "lora"))
    got = draw(pipe)
    assert (got - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_short_run_trains_validates_and_merges(tmp_path: Path, tiny_workspace: Path) -> None:
    from diffusers import Ideogram4Pipeline

    from core import ops

    cfg = small_config(tmp_path, images=4, family="ideogram4")
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    cfg.train.logit_std = 1.5
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert {p.name for p in (run / "lora").glob("*.safetensors")} == {
        "pytorch_lora_weights.safetensors", "lora_comfyui.safetensors"}
    assert (run / "validation/step_000002/00.png").is_file()

    save_config(cfg, run / "config.toml")  # what the launcher writes beside the run
    merged = ops.merge_run(run, tiny_workspace)
    assert (merged / "unconditional_transformer").is_dir()
    base = tiny_workspace / "models/tiny-ideogram4"
    pipe = Ideogram4Pipeline.from_pretrained(str(base), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(run / "lora"))
    with_lora = draw(pipe)
    loaded = Ideogram4Pipeline.from_pretrained(str(merged), local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    torch.testing.assert_close(draw(loaded), with_lora, atol=2e-4, rtol=1e-3)


def test_another_familys_folder_and_a_missing_component_are_named(
        folder: Path, tmp_path: Path, tiny_workspace: Path) -> None:
    from core.models.registry import get_family
    from core.models.tiny import resolve_model_path

    assert loading.folder_families(str(folder)) == ("ideogram4",)
    with pytest.raises(loading.ModelLoadError, match='model.family = "ideogram4"'):
        get_family("flux2").load(str(folder))
    z_image = resolve_model_path("tiny:z_image", tiny_workspace)
    with pytest.raises(loading.ModelLoadError, match="z_image"):
        I4.load(z_image)
    broken = tmp_path / "no-transformer"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / "transformer")
    with pytest.raises(loading.ModelLoadError) as info:
        I4.load(str(broken))
    assert str(broken) in str(info.value) and "has no transformer/" in str(info.value)
    # --stage check names it too; without the unconditional transformer it warns
    cfg = small_config(tmp_path, images=1, family="ideogram4")
    cfg.model.path = str(broken)
    [problem] = I4.config_problems(cfg)
    assert problem.level == "error" and "has no transformer/" in problem.message
    shutil.copytree(folder / "transformer", broken / "transformer")
    shutil.rmtree(broken / "unconditional_transformer")
    [problem] = I4.config_problems(cfg)
    assert problem.level == "warning" and "unconditional_transformer/" in problem.message
    cfg.model.path = str(folder)
    assert I4.config_problems(cfg) == []


def test_swapped_blocks_train_as_the_unswapped_ones(tmp_path: Path,
                                                   tiny_workspace: Path) -> None:
    """block_lists = ("layers",): model.blocks_to_swap streams them, the same losses and
    LoRA as in place (int8 base: the swapped block quantized, kept on the host)."""
    from test_block_swap import swap_run

    plain, plain_lora, _, _ = swap_run(tmp_path / "a", tiny_workspace, "ideogram4", 0,
                                       quantize="int8")
    swapped, swapped_lora, _, [swap] = swap_run(tmp_path / "b", tiny_workspace, "ideogram4",
                                                1, quantize="int8")
    assert swapped == plain and swap["swapped"] == [1] * len(swap["blocks"])
    for key, tensor in plain_lora.items():
        assert torch.equal(swapped_lora[key], tensor), key


def test_a_single_files_configs_and_a_kind_comfyui_cannot_read_are_named(tmp_path: Path
                                                                        ) -> None:
    """A single file (tests/test_comfy_family_files.py loads real ones) takes the rest
    from model.config, whose missing components are named there."""
    cfg = small_config(tmp_path, images=1, family="ideogram4")
    cfg.model.path = str(tmp_path / "ideogram4.safetensors")
    assert I4.config_problems(cfg) == []
    config = tmp_path / "configs"
    config.mkdir()
    (config / "model_index.json").write_text('{"_class_name": "Ideogram4Pipeline"}')
    cfg.model.config = str(config)
    [problem] = I4.config_problems(cfg)
    assert (problem.level, problem.where) == ("error", "model.config")
    assert "has no transformer/" in problem.message
    cfg.model.path, cfg.train.lora_kind = "tiny:ideogram4", "dora"
    [problem] = I4.config_problems(cfg)
    assert problem.where == "train.lora_kind" and "ComfyUI" in problem.message
