"""HunyuanVideo 1.5 on its tiny random model (CPU, seconds each): the training loss against
a written-out use of diffusers' classes as HunyuanVideo15Pipeline runs them (its
encode_prompt with the full padding, the VAE's mode times scaling_factor, the zero
condition and image tokens, t = 1000 sigma), the shifted sigma draw, both text encoders'
tokens kept, latents of images and clips, LoRA files (the diffusers one loaded by
`load_lora_weights`, the ComfyUI one in the original names), validation frames, the
24 GB preset's estimate, the original file's names (original.py), and a headless run
from clips to a LoRA and a validation video."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import app_in_process, small_config
from test_family_wan import clip  # smooth random clips in [-1, 1]

from core.config import save_config
from core.data.collate import collate
from core.models.registry import get_family
from core.models.tiny import build_tiny_folder

HV = get_family("hunyuan_video15")
PROMPTS = ["a red circle moving left", 'a sign that says "OPEN" in blue']
GIB = 1024 ** 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-hunyuan_video15")
    build_tiny_folder("hunyuan_video15", out, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(folder: Path):
    return HV.load(str(folder))


def batch_of(texts: list[dict], latents: torch.Tensor) -> dict:
    return collate([{**t, "latents": latents[i], "path": f"{i}.mp4", "caption": ""}
                    for i, t in enumerate(texts)])


@torch.no_grad()
def reference(folder: Path, px: torch.Tensor, sigmas: torch.Tensor, noise_seed: int) -> dict:
    """The step written out from HunyuanVideo15Pipeline's own pieces: encode_prompt (Qwen
    at 1000 tokens, ByT5 at 256, both padded), the VAE's mode times scaling_factor (what
    the pipeline divides out), noisy = (1 - s) x + s noise, the transformer given [noisy,
    zero condition, zero mask] and 729 zero image tokens as __call__ builds them for
    text-to-video, t = 1000 s, and the velocity target noise - x."""
    from diffusers import HunyuanVideo15Pipeline

    pipe = HunyuanVideo15Pipeline.from_pretrained(str(folder), local_files_only=True)
    embeds, mask, glyph, glyph_mask = pipe.encode_prompt(PROMPTS, device="cpu",
                                                         batch_size=len(PROMPTS))
    assert embeds.shape[1] == 1000 and glyph.shape[1] == 256  # the pipeline's padding
    x = torch.cat([pipe.vae.encode(px[i:i + 1]).latent_dist.mode() for i in range(len(px))])
    x = x * pipe.vae.config.scaling_factor
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(noise_seed))
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x + s * noise
    cond, cond_mask = pipe.prepare_cond_latents_and_mask(noisy, noisy.dtype, "cpu")
    image = torch.zeros(len(PROMPTS), pipe.vision_num_semantic_tokens, pipe.vision_states_dim)
    pred = pipe.transformer(hidden_states=torch.cat([noisy, cond, cond_mask], dim=1),
                            image_embeds=image, timestep=(sigmas * 1000).to(noisy.dtype),
                            encoder_hidden_states=embeds, encoder_attention_mask=mask,
                            encoder_hidden_states_2=glyph, encoder_attention_mask_2=glyph_mask,
                            return_dict=False)[0]
    loss = ((pred - (noise - x)) ** 2).reshape(len(PROMPTS), -1).mean(1).mean()
    return {"latents": x, "noise": noise, "prediction": pred, "loss": loss, "mask": mask,
            "glyph_mask": glyph_mask}


def test_training_loss_matches_the_pipeline_written_out(folder: Path, loaded) -> None:
    px, sigmas = clip(2, 5), torch.tensor([0.3, 0.9])
    ref = reference(folder, px, sigmas, noise_seed=3)

    texts = HV.encode_prompts(loaded, PROMPTS)
    latents = HV.encode_images(loaded, px)
    assert latents.shape == (2, 32, 2, 4, 4)  # 5 frames -> 1 + 4 / 4, 64 px -> 4
    torch.testing.assert_close(latents, ref["latents"])
    sample = HV.noise_and_target(loaded, latents, timesteps=sigmas * 1000, noise=ref["noise"])
    with torch.no_grad():
        pred = HV.predict(loaded, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, ref["prediction"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(HV.loss(loaded, pred, sample), ref["loss"], rtol=1e-4,
                               atol=1e-6)


def test_each_prompt_keeps_the_real_tokens_of_both_encoders(folder: Path, loaded) -> None:
    """Quoted text reaches ByT5 (the pipeline's glyph text); a prompt without quotes has
    none; the packed rows hold each stream's real tokens, then zeros."""
    from core.models.families.hunyuan_video15.text import unpack

    ref = reference(folder, clip(2, 1), torch.tensor([0.5, 0.5]), noise_seed=0)
    plain, quoted = HV.encode_prompts(loaded, PROMPTS)
    config = loaded.denoiser.config
    for item, row in ((plain, 0), (quoted, 1)):
        parts = unpack(item["prompt_embeds"][None], config.text_embed_dim,
                       config.text_embed_2_dim)
        assert int(parts["encoder_attention_mask"].sum()) == int(ref["mask"][row].sum())
        assert int(parts["encoder_attention_mask_2"].sum()) == int(ref["glyph_mask"][row].sum())
        assert bool(item["prompt_mask"].all())  # every row is real in some stream
    assert int(ref["glyph_mask"][0].sum()) == 0 < int(ref["glyph_mask"][1].sum())
    assert plain["prompt_embeds"].shape[1] == config.text_embed_dim + config.text_embed_2_dim + 2


def test_images_are_one_frame_and_clips_compress_four_times_in_time(loaded) -> None:
    image = clip(2, 1)[:, :, 0]
    latents = HV.encode_images(loaded, image)
    assert latents.shape == (2, 32, 1, 4, 4)
    torch.testing.assert_close(HV.encode_images(loaded, image), latents)  # cache-stable
    assert HV.encode_images(loaded, clip(1, 9)).shape == (1, 32, 3, 4, 4)


def test_sigmas_are_uniform_shifted_by_the_schedulers_shift(loaded) -> None:
    assert loaded.noise_scheduler.config.shift == 5.0
    latents = torch.zeros(4000, 32, 1, 1, 1)
    sample = HV.noise_and_target(loaded, latents, generator=torch.Generator().manual_seed(0),
                                 noise=torch.zeros_like(latents))
    # shift 5: sigma' = 5u / (1 + 4u), whose median (u = 1/2) is 5/6, the schedule the
    # pipeline samples (np.linspace(1, 0) through the same shift)
    assert float((sample.timesteps / 1000).median()) == pytest.approx(5 / 6, abs=0.02)


def add_lora(c, rank: int = 4) -> None:
    """A LoRA on the family's targets with lora_B non-zero, so it changes the output."""
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian",
                                      target_modules=HV.lora_target_modules()))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_lora_files_load_in_diffusers_and_the_comfyui_one_fuses_qkv(
        folder: Path, tmp_path: Path) -> None:
    from diffusers import HunyuanVideo15Pipeline
    from safetensors.torch import load_file

    trained = HV.load(str(folder))
    add_lora(trained)
    texts = HV.encode_prompts(trained, PROMPTS)
    latents = HV.encode_images(trained, clip(2, 5))
    s = HV.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    HV.loss(trained, HV.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 8  # both streams' q/k/v/out of the one block, not the refiner
    assert not any("refiner" in n for n in lora)
    # The last block's text-token outputs are never read (the transformer returns the
    # video tokens), so what only they depend on learns nothing there: the text queries
    # and the text output projection of the only block here.
    assert {n for n, p in lora.items() if p.grad is None or not torch.count_nonzero(p.grad)
            } == {n for n in lora if "to_add_out" in n or "add_q_proj" in n}

    paths = HV.save_lora(trained, tmp_path / "lora")
    comfy, diffusers_sd = load_file(paths["comfyui"]), load_file(paths["diffusers"])
    # q, k and v as one LoRA of ComfyUI's fused qkv weight: rank 3r, alpha/r (2) folded
    # into the block-diagonal up, so no .alpha (tests/test_comfyui_keys.py checks every
    # family's file against ComfyUI's names and the diffusers file's weight change)
    qkv = "diffusion_model.double_blocks.0.txt_attn_qkv"
    assert comfy[f"{qkv}.lora_A.weight"].shape[0] == 3 * 4
    assert not any(k.endswith(".alpha") or "attn_q." in k for k in comfy)
    k_part = comfy[f"{qkv}.lora_B.weight"].chunk(3)[1][:, 4:8]
    torch.testing.assert_close(k_part, 2 * diffusers_sd["transformer.transformer_blocks.0.attn."
                                                        "add_k_proj.lora_B.weight"])

    embeds = texts[0]["prompt_embeds"][None].detach()
    negative = HV.encode_prompts(trained, [""])[0]["prompt_embeds"][None]

    def generate(pipe) -> torch.Tensor:
        out = pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, height=64, width=64,
                   num_frames=5, num_inference_steps=2, guidance_scale=6.0,
                   generator=torch.Generator().manual_seed(0))
        return torch.stack([torch.from_numpy(np.array(f)).float() for f in out.frames[0]])

    fresh = HV.load(str(folder))
    pipe = HV.validation_pipeline(fresh)
    base = generate(pipe)
    pipe.load_lora_weights(str(paths["diffusers"]))
    with_lora = generate(pipe)
    assert (with_lora - base).abs().max() > 1.0
    # diffusers' own HunyuanVideo converter splits the fused ComfyUI file back (B chunked
    # in three, A shared): the diffusers file's frames, to one 8-bit level
    comfy_pipe = HV.validation_pipeline(HV.load(str(folder)))
    comfy_pipe.load_lora_weights(str(paths["comfyui"]))
    torch.testing.assert_close(generate(comfy_pipe), with_lora, atol=1.0, rtol=0)  # 8-bit
    # A plain diffusers pipeline's transformer takes the same file (diffusers 0.42's
    # HunyuanVideo15Pipeline has no load_lora_weights of its own).
    plain = HunyuanVideo15Pipeline.from_pretrained(str(folder), local_files_only=True)
    plain.transformer.load_lora_adapter(str(paths["diffusers"]), prefix="transformer")
    loaded_keys = {n for n, _ in plain.transformer.named_parameters() if "lora_" in n}
    assert len(loaded_keys) == len(lora)


def test_validation_pipeline_gives_frames_and_the_first_as_the_image(loaded) -> None:
    texts = HV.encode_prompts(loaded, [PROMPTS[0], ""])
    out = HV.validation_pipeline(loaded)(
        prompt_embeds=texts[0]["prompt_embeds"][None],
        negative_prompt_embeds=texts[1]["prompt_embeds"][None], height=64, width=48,
        num_frames=9, num_inference_steps=2, guidance_scale=4.0,
        generator=torch.Generator().manual_seed(0))
    assert len(out.frames[0]) == 9 and out.frames[0][0].size == (48, 64)
    assert out.images[0] is out.frames[0][0]


def test_the_original_names_map_the_full_size_transformer_whole() -> None:
    """original.py on the 8.3B model's names and shapes (on the meta device): ComfyUI's
    file (fused q/k/v, tests/comfy_layouts.py) and Tencent's own (q, k and v apart) both
    come back as every tensor of HunyuanVideo15Transformer3DModel, each of its shape.
    tests/test_comfy_family_files.py loads the tiny model's files."""
    import json

    from accelerate import init_empty_weights
    from comfy_layouts import hunyuan_video15
    from diffusers import HunyuanVideo15Transformer3DModel

    from core.models.families.hunyuan_video15.original import diffusers_names

    config = Path(__file__).parents[1] / ("core/models/families/hunyuan_video15/full_size/"
                                          "transformer/config.json")
    with init_empty_weights():
        model = HunyuanVideo15Transformer3DModel.from_config(json.loads(config.read_text()))
    want = {k: v.shape for k, v in model.state_dict().items()}
    comfy = hunyuan_video15(model.state_dict())
    tencent = {}
    for key, value in comfy.items():
        stem, fused, param = key.partition("_attn_qkv.")
        if fused and stem.startswith("double_blocks."):
            for x, part in zip("qkv", value.chunk(3), strict=True):
                tencent[f"{stem}_attn_{x}.{param}"] = part
        else:
            tencent[key] = value
    assert len(tencent) > len(comfy) > 54 * 20
    for state in (comfy, tencent):
        assert {k: v.shape for k, v in diffusers_names(state).items()} == want


def test_a_frame_count_off_the_rule_is_refused_with_the_nearest_counts() -> None:
    from core.config import Config, DatasetConfig
    from core.config.checks import validate_config

    cfg = Config(datasets=[DatasetConfig(id="a", images="i", vae_cache="c", frames=31)])
    cfg.model.family = "hunyuan_video15"
    [problem] = [p for p in validate_config(cfg) if p.where == "datasets.0.frames"]
    assert "4k + 1" in problem.message and problem.message.endswith("use 29 or 33")


def test_the_24gb_preset_estimates_under_its_card(tmp_path: Path) -> None:
    """presets/hunyuan-video15-lora.toml on the real sizes (random:hunyuan_video15):
    clean, at least 1 GiB under 24, nothing left to advise, the swapped blocks' pinned
    host memory shown."""
    from conftest import write_shapes

    from core.check import run_check
    from core.config import apply_overrides, load_config
    from core.presets import preset_path

    write_shapes(tmp_path / "data/mydata", 2)
    cfg = apply_overrides(load_config(preset_path("hunyuan-video15-lora")), [
        "model.path=random:hunyuan_video15", "launch.gpu_memory_gib=24"])
    report = run_check(cfg, tmp_path)
    assert [p for p in report.problems if p.level == "error"] == []
    memory = report.memory
    assert memory is not None and memory.unknown is None
    assert memory.total_bytes <= 23 * GIB, memory.lines()
    assert memory.swap_fit is None and cfg.model.blocks_to_swap == 12
    assert any(line.startswith("  host memory: ") for line in memory.lines())


@pytest.mark.slow
def test_headless_run_trains_on_clips_and_writes_its_lora_and_videos(
        tmp_path: Path, tiny_workspace: Path) -> None:
    """`app.py --no-ui --stage all` on tiny:hunyuan_video15: two 9-frame clips checked,
    cached (clip latents keep their frames), trained 2 steps, a 5-frame validation video,
    both LoRA files; the tiny model is built under <workspace>/models."""
    from safetensors import safe_open

    from core.data.video import probe_clip, write_synthetic_clip

    cfg = small_config(tmp_path, images=1, family="hunyuan_video15")
    clips = tmp_path / "clips"
    clips.mkdir()
    for name, color, direction in (("a", "red", "right"), ("b", "blue", "left")):
        made = write_synthetic_clip(clips / f"{name}.mp4", color=color, direction=direction,
                                    frames=9, fps=16)
        (clips / f"{name}.txt").write_text(f"a {made.color} {made.shape} moving {direction}")
    ds = cfg.datasets[0]
    ds.images, ds.frames, ds.fps = str(clips), 5, 16.0  # the clips' own rate
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    cfg.validation.prompts, cfg.validation.frames = ["a red square moving right"], 5
    cfg.validation.steps = 2
    save_config(cfg, tmp_path / "run.toml")
    done = app_in_process("--no-ui", "--workspace", str(tiny_workspace), "--config",
                          str(tmp_path / "run.toml"), "--stage", "all")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tiny_workspace / "models/tiny-hunyuan_video15/text_encoder_2").is_dir()
    with safe_open(str(Path(ds.vae_cache) / "a.mp4.safetensors"), "pt") as fh:
        assert fh.get_slice("latents").get_shape() == [32, 2, 4, 4]
    run = Path(cfg.output.dir)
    assert {p.name for p in (run / "lora").glob("*.safetensors")} == {
        "pytorch_lora_weights.safetensors", "lora_comfyui.safetensors"}
    video = probe_clip(run / "validation/step_000002/00.mp4")
    assert (video.frames, video.width, video.height) == (5, 64, 64)


def test_random_models_tokenizers_fit_the_real_vocabularies() -> None:
    """random:hunyuan_video15's tokenizers (the tiny Qwen one with this template, ByT5's
    own) give ids inside the real encoders' vocabularies (full_size/)."""
    from core.models.full_size.build import _tokenizers
    from core.models.full_size.spec import component_config

    qwen, byt5 = _tokenizers("hunyuan_video15")
    for tok, name in ((qwen, "text_encoder"), (byt5, "text_encoder_2")):
        ids = tok(['A café "OPEN" at 9:30, ünïcode ✓']).input_ids[0]
        assert 0 <= min(ids) and max(ids) < component_config("hunyuan_video15", name)["vocab_size"]
    assert type(byt5).__name__ == "ByT5Tokenizer"
