"""Qwen-Image-Edit on its tiny random models (tiny:qwen_image_edit, a QwenImageEditPipeline;
tiny:qwen_image_edit_plus, a 2511-shaped QwenImageEditPlusPipeline; CPU, seconds each):
the training loss against a written-out use of diffusers' classes as the pipelines' loop
feeds the transformer, the text read with the control images as the pipelines' __call__
encodes it, LoRA steps that reload with load_lora_weights, validation from embeddings,
and the one-reference model's refusals."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from test_family_qwen_image import batch_of, pixels

from core.models import loading
from core.models.families.qwen_image_edit.family import FAMILY as EDIT
from core.models.families.qwen_image_edit.processor import load_processor
from core.models.tiny import build_tiny_folder

PROMPTS = ["make it blue", "a much longer instruction: turn the red circle into a green square"]
DROP = 64  # QwenImageEditPipeline.prompt_template_encode_start_idx
SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, "
          "size, texture, objects, background), then explain how the user's text instruction "
          "should alter or modify the image. Generate a new image that meets the user's "
          "requirements while maintaining consistency with the original input where "
          "appropriate.<|im_end|>\n<|im_start|>user\n")
TEMPLATE = SYSTEM + "{}<|im_end|>\n<|im_start|>assistant\n"
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
TINY = {"edit": "qwen_image_edit", "plus": "qwen_image_edit_plus"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for variant, name in TINY.items():
        out[variant] = tmp_path_factory.mktemp(f"tiny-{name}")
        build_tiny_folder(name, out[variant], seed=0)
    return out


def pictures(n: int, seed: int = 0) -> list[Image.Image]:
    """n control images of different sizes and aspect ratios, each at its own size."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [(96, 64), (64, 80), (72, 72)]
    return [Image.fromarray((torch.rand(h, w, 3, generator=gen) * 255).to(torch.uint8).numpy())
            for w, h in (sizes[i % 3] for i in range(n))]


def pipeline(folder: Path, variant: str) -> Any:
    """The diffusers pipeline from the folder; its processor through processor.py, since
    transformers 5 loads the stock Qwen2VLProcessor only with torchvision."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    cls = QwenImageEditPlusPipeline if variant == "plus" else QwenImageEditPipeline
    return cls.from_pretrained(str(folder), processor=load_processor(str(folder), True),
                               local_files_only=True)


# ---------------------------------------------------------------- the reference loss


def area_size(image: Image.Image, area: int) -> tuple[int, int]:
    """(width, height) of `area` pixels at the image's aspect ratio, multiples of 32."""
    ratio = image.size[0] / image.size[1]
    width = math.sqrt(area * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


def reference_text(pipe: Any, variant: str, prompts: list[str], images: list[list]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded embeddings and mask, written out as _get_qwen_prompt_embeds builds them from
    the images __call__ gives it (plain: the first at ~1024^2; plus: each at ~384^2, each
    "Picture i: " with its vision tokens)."""
    kept = []
    for prompt, own in zip(prompts, images, strict=True):
        area = 384 * 384 if variant == "plus" else 1024 * 1024
        shown = [im.resize(area_size(im, area), Image.LANCZOS) for im in own]
        head = ("".join(f"Picture {i + 1}: {VISION}" for i in range(len(own)))
                if variant == "plus" else VISION)
        inputs = pipe.processor(text=[TEMPLATE.format(head + prompt)], images=shown,
                                padding=True, return_tensors="pt")
        hidden = pipe.text_encoder(
            input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
            pixel_values=inputs.pixel_values, image_grid_thw=inputs.image_grid_thw,
            output_hidden_states=True).hidden_states[-1]
        kept.append(hidden[0][DROP:])
    longest = max(len(k) for k in kept)
    embeds = torch.stack([torch.cat([k, k.new_zeros(longest - len(k), k.shape[1])])
                          for k in kept])
    return embeds, torch.stack([torch.arange(longest) < len(k) for k in kept]).long()


def reference_loss(pipe: Any, variant: str, images: list[list], px: torch.Tensor,
                   controls: list[torch.Tensor], noise: torch.Tensor,
                   sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss as the pipelines' denoising loop feeds the transformer and diffusers'
    qwen-image script compares it: references packed after the noisy target, img_shapes
    of each, the target's tokens of the output against noise - latents."""
    vae = pipe.vae
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape)
    std = torch.tensor(vae.config.latents_std).view(shape)

    def latents(x: torch.Tensor) -> torch.Tensor:  # _encode_vae_image: the mode, normalised
        return (vae.encode(x.unsqueeze(2)).latent_dist.mode() - mean) / std

    with torch.no_grad():
        embeds, mask = reference_text(pipe, variant, PROMPTS, images)
        model_input = latents(px)
        refs = [latents(x) for x in controls]
    b, c, _, h, w = model_input.shape
    noisy = (1.0 - sigmas.view(-1, 1, 1, 1, 1)) * model_input + sigmas.view(-1, 1, 1, 1, 1) * noise
    pack = pipe._pack_latents
    tokens = torch.cat([pack(noisy, b, c, h, w), *(pack(r, b, c, h, w) for r in refs)], dim=1)
    img_shapes = [[(1, h // 2, w // 2)] * (1 + len(refs))] * b
    out = pipe.transformer(hidden_states=tokens, timestep=sigmas * 1000 / 1000,
                           encoder_hidden_states=embeds, encoder_hidden_states_mask=mask,
                           img_shapes=img_shapes, return_dict=False)[0]
    pred = pipe._unpack_latents(out[:, :h * w // 4], h * 8, w * 8, 8)[:, :, 0]
    target = noise[:, :, 0] - model_input[:, :, 0]
    return ((pred - target) ** 2).reshape(b, -1).mean(1).mean(), pred


@pytest.mark.parametrize("variant", ["edit", "plus"])
def test_training_loss_matches_the_pipelines_loop(folders: dict, variant: str) -> None:
    k = 2 if variant == "plus" else 1
    images = [pictures(k, seed=i) for i in range(2)]
    px = pixels(2)
    controls = [pixels(2, seed=10 + i) for i in range(k)]
    noise = torch.randn(2, 16, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.25, 0.8])
    want_loss, want_pred = reference_loss(pipeline(folders[variant], variant), variant,
                                          images, px, controls, noise, sigmas)

    c = EDIT.load(str(folders[variant]))
    texts = EDIT.edit.encode_prompts_with_images(c, PROMPTS, images)
    latents = EDIT.encode_images(c, px)
    cached = EDIT.edit.encode_controls(c, controls)["control_latents"]
    assert cached.shape == (2, k, 16, 8, 8)
    sample = EDIT.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise[:, :, 0])
    batch = batch_of(texts, latents)
    assert not batch["prompt_mask"][0].all()  # the short prompt is padded and masked
    with torch.no_grad():
        batch["control_latents"] = list(cached)  # as the dataset hands them: per item
        pred = EDIT.predict(c, sample, batch)
        batch["control_latents"] = cached  # or stacked
        stacked = EDIT.predict(c, sample, batch)
    torch.testing.assert_close(pred, want_pred.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stacked, pred)
    torch.testing.assert_close(EDIT.loss(c, pred, sample), want_loss.detach(),
                               rtol=1e-4, atol=1e-5)


def test_items_with_other_references_run_apart(folders: dict) -> None:
    """A batch whose items have different numbers of references: each item's prediction
    is the one it gets alone (the transformer runs once per kind of item)."""
    c = EDIT.load(str(folders["plus"]))
    texts = EDIT.encode_prompts(c, PROMPTS)
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    refs = [torch.randn(k, 16, 8, 8, generator=torch.Generator().manual_seed(k)) for k in (1, 3)]
    s = EDIT.noise_and_target(c, latents, timesteps=torch.tensor([300.0, 700.0]),
                              noise=torch.randn_like(latents))
    batch = batch_of(texts, latents)
    batch["control_latents"] = refs
    with torch.no_grad():
        both = EDIT.predict(c, s, batch)
        for i in range(2):
            one = type(s)(noisy=s.noisy[i:i + 1], timesteps=s.timesteps[i:i + 1],
                          target=s.target[i:i + 1])
            alone = batch_of(texts[i:i + 1], latents[i:i + 1])
            alone["control_latents"] = refs[i:i + 1]
            torch.testing.assert_close(both[i:i + 1], EDIT.predict(c, one, alone),
                                       atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- text


@pytest.mark.parametrize("variant", ["edit", "plus"])
def test_text_with_images_is_what_the_pipeline_encodes(folders: dict, variant: str) -> None:
    """The prompt and the negative prompt, each read with the images as __call__ reads
    them (its own resize, then encode_prompt): captured from a real call."""
    class Stop(Exception):
        pass

    images = pictures(2 if variant == "plus" else 1)
    pipe = pipeline(folders[variant], variant)
    seen, encode = [], pipe.encode_prompt

    def spy(**kwargs: Any) -> Any:
        seen.append(encode(**kwargs))
        if len(seen) == 2:  # the prompt, then the negative prompt: enough
            raise Stop
        return seen[-1]

    pipe.encode_prompt = spy
    with pytest.raises(Stop):
        pipe(image=images if variant == "plus" else images[0], prompt=PROMPTS[1],
             negative_prompt="", true_cfg_scale=2.0, height=64, width=64)

    c = EDIT.load(str(folders[variant]))
    assert len(c.tokenizers[0](SYSTEM).input_ids) == DROP  # as the real tokenizer counts it
    ours = EDIT.edit.encode_prompts_with_images(c, [PROMPTS[1], ""], [images, images])
    for (embeds, mask), item in zip(seen, ours, strict=True):
        assert mask is None  # one prompt: all its tokens real
        torch.testing.assert_close(item["prompt_embeds"], embeds[0])
        assert item["prompt_mask"].all() and len(item["prompt_mask"]) == len(embeds[0])
    # The vision tower read the pictures: their tokens are in the text, and other pictures
    # give other embeddings.
    assert len(ours[0]["prompt_embeds"]) > len(EDIT.encode_prompts(c, [PROMPTS[1]])[0]
                                                ["prompt_embeds"]) + 10
    other = EDIT.edit.encode_prompts_with_images(c, [PROMPTS[1]], [pictures(len(images), 5)])[0]
    assert other["prompt_embeds"].shape == ours[0]["prompt_embeds"].shape
    assert not torch.allclose(other["prompt_embeds"], ours[0]["prompt_embeds"], atol=1e-4)


# ---------------------------------------------------------------- LoRA and validation


def test_lora_steps_change_the_prediction_and_reload(folders: dict, tmp_path: Path) -> None:
    from peft import LoraConfig

    c = EDIT.load(str(folders["edit"]))
    texts = EDIT.edit.encode_prompts_with_images(c, PROMPTS, [pictures(1), pictures(1, 1)])
    latents = EDIT.encode_images(c, pixels(2))
    batch = batch_of(texts, latents)
    batch["control_latents"] = list(EDIT.edit.encode_controls(c, [pixels(2, seed=4)])
                                    ["control_latents"])
    s = EDIT.noise_and_target(c, latents, timesteps=torch.tensor([300.0, 700.0]),
                              noise=torch.randn_like(latents))
    with torch.no_grad():
        base = EDIT.predict(c, s, batch)
    c.denoiser.add_adapter(LoraConfig(r=4, lora_alpha=8,
                                      target_modules=EDIT.lora_target_modules()))
    params = [p for p in c.denoiser.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        EDIT.loss(c, EDIT.predict(c, s, batch), s).backward()
        optimizer.step()
    with torch.no_grad():
        trained = EDIT.predict(c, s, batch)
    assert (trained - base).abs().max() > 1e-3

    paths = EDIT.save_lora(c, tmp_path / "lora")
    assert set(paths) == {"diffusers", "comfyui"}
    pipe = pipeline(folders["edit"], "edit")
    pipe.load_lora_weights(str(paths["diffusers"].parent))
    reloaded = dataclasses.replace(EDIT.load(str(folders["edit"])), denoiser=pipe.transformer)
    with torch.no_grad():
        torch.testing.assert_close(EDIT.predict(reloaded, s, batch), trained,
                                   atol=1e-5, rtol=1e-4)


def test_validation_runs_from_embeddings_with_an_image(folders: dict) -> None:
    c = EDIT.load(str(folders["edit"]))
    images = pictures(1)
    pos, neg = EDIT.edit.encode_prompts_with_images(c, [PROMPTS[0], ""], [images, images])
    without_text = dataclasses.replace(c, text_encoders=[None])  # as validation runs it
    pipe = EDIT.validation_pipeline(without_text)
    common = {"prompt_embeds": pos["prompt_embeds"][None],
              "negative_prompt_embeds": neg["prompt_embeds"][None], "guidance_scale": 2.5,
              "num_inference_steps": 2, "generator": torch.Generator().manual_seed(0)}
    with torch.no_grad():
        edited = pipe(**common, **EDIT.edit.validation_kwargs(images, 64), height=64,
                      width=96).images[0]
        plain = pipe(**common, height=32, width=48).images[0]  # no control: text-to-image
    assert edited.size == (96, 64) and plain.size == (48, 32)
    with pytest.raises(ValueError, match="takes 1"):
        pipe(**common, image=pictures(2), height=64, width=64)


# ---------------------------------------------------------------- the one-reference model


def test_plain_edit_refuses_a_second_reference(folders: dict) -> None:
    from core.config import Config, DatasetConfig

    c = EDIT.load(str(folders["edit"]))
    with pytest.raises(ValueError, match=r"datasets\.N\.control_2"):
        EDIT.edit.encode_controls(c, [pixels(1), pixels(1, seed=1)])
    plus = EDIT.load(str(folders["plus"]))
    assert EDIT.edit.encode_controls(plus, [pixels(1)] * 3)["control_latents"].shape[1] == 3
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c", control="p",
                                         control_2="q")])
    cfg.model.family, cfg.validation.control_images = "qwen_image_edit", ["a.png|b.png"]
    for path, count in (("tiny:qwen_image_edit", 2), (str(folders["edit"]), 2),
                        ("tiny:qwen_image_edit_plus", 0), (str(folders["plus"]), 0)):
        cfg.model.path = path
        problems = EDIT.config_problems(cfg)
        assert [p.where for p in problems] == ["datasets.0.control_2",
                                               "validation.control_images"][:count], path


def test_a_saved_pipeline_names_the_stock_processor_and_loads(folders: dict,
                                                             tmp_path: Path) -> None:
    """What tiny: and a merged model write (the processor's class as transformers' own,
    though without torchvision it is processor.py's) loads back as this family."""
    import json

    pipeline(folders["plus"], "plus").save_pretrained(str(tmp_path / "saved"))
    index = json.loads((tmp_path / "saved/model_index.json").read_text())
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    for folder in (folders["edit"], tmp_path / "saved"):
        assert json.loads((Path(folder) / "processor/processor_config.json").read_text()
                          )["processor_class"] == "Qwen2VLProcessor"
    c = EDIT.load(str(tmp_path / "saved"))
    assert c.pipeline_class == "QwenImageEditPlusPipeline" and c.processor is not None


def test_random_settings_let_the_encoder_find_the_images(folders: dict) -> None:
    """random:qwen_image_edit pairs the real encoder config (vision ids of the real
    vocabulary) with the tiny tokenizer and has no processor: its random.settings points
    the config at the tokenizer's ids, and the text is the loaded model's."""
    from core.models.base import Components

    loaded = EDIT.load(str(folders["edit"]))
    want = EDIT.edit.encode_prompts_with_images(loaded, PROMPTS[:1], [pictures(1)])[0]
    fresh = EDIT.load(str(folders["edit"]))
    plain = Components(**{k: getattr(fresh, k) for k in Components.__dataclass_fields__})
    config = plain.text_encoders[0].config
    config.image_token_id, config.vision_start_token_id = 151655, 151652  # the real ones
    c = EDIT.random.settings(plain)
    assert c.pipeline_class == "QwenImageEditPipeline"
    got = EDIT.edit.encode_prompts_with_images(c, PROMPTS[:1], [pictures(1)])[0]
    torch.testing.assert_close(got["prompt_embeds"], want["prompt_embeds"])


def test_qwen_image_folders_are_refused_and_files_need_model_config(folders: dict,
                                                                    tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ckpt = tmp_path / "qwen_image_edit_2509.safetensors"
    save_file({"txt_norm.weight": torch.ones(2), "img_in.weight": torch.zeros(2, 2)}, str(ckpt))
    with pytest.raises(loading.ModelLoadError, match="model.config"):
        EDIT.load(str(ckpt))  # offline, without the edit pipeline's configs
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "model_index.json").write_text('{"_class_name": "QwenImagePipeline"}')
    with pytest.raises(loading.ModelLoadError, match='model.family = "qwen_image"'):
        EDIT.load(str(qwen))
    assert loading.folder_families(str(folders["plus"])) == ("qwen_image_edit",)
