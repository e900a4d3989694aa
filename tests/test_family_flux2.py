"""FLUX.2 (klein) on its tiny random model: the loss agrees with a written-out use of the
diffusers classes as train_dreambooth_lora_flux2_klein.py / Flux2KleinPipeline do it;
a trained LoRA reloads with load_lora_weights (both files) and changes the image; the
preset's check gives a memory estimate that fits 24 GB; a BFL-layout single transformer
file loads through model.config.

FLUX.2-dev: a tiny Mistral3 builds offline, but its pipeline's tokenizer (a
PixtralProcessor) needs torchvision, which is not installed, so there is no tiny:flux2
dev folder; its text path, guidance and validation run with a plain tokenizer carrying
Mistral's chat template in the processor's place.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.models import loading
from core.models.families.flux2.family import FAMILY as FLUX2
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle", "a much longer prompt about blue squares"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-flux2")
    build_tiny_folder("flux2", out, seed=0)
    return out


def pixels(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ---------------------------------------------------------------- the reference


def reference_text(folder: Path, prompts: list[str]) -> torch.Tensor:
    """Flux2KleinPipeline._get_qwen3_prompt_embeds, written out: chat template, 512
    tokens, hidden states 9, 18, 27 stacked along features."""
    from transformers import Qwen2TokenizerFast, Qwen3ForCausalLM

    tok = Qwen2TokenizerFast.from_pretrained(folder / "tokenizer")
    encoder = Qwen3ForCausalLM.from_pretrained(folder / "text_encoder").eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False)
             for p in prompts]
    assert texts[0] == ("<|im_start|>user\na red circle<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n\n</think>\n\n")
    inputs = tok(texts, return_tensors="pt", padding="max_length", truncation=True,
                 max_length=512)
    with torch.no_grad():
        states = encoder(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                         output_hidden_states=True, use_cache=False).hidden_states
    out = torch.stack([states[k] for k in (9, 18, 27)], dim=1)  # [B, 3, L, D]
    b, n, length, d = out.shape
    return out.permute(0, 2, 1, 3).reshape(b, length, n * d)


def reference_loss(folder: Path, px: torch.Tensor, embeds: torch.Tensor,
                   noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """The training script's step: VAE mode, patchify 2x2, batch-norm normalise, flow
    noise, pack, ids, transformer (no guidance: klein), unpack, MSE with noise - x."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    vae = AutoencoderKLFlux2.from_pretrained(folder / "vae").eval()
    transformer = Flux2Transformer2DModel.from_pretrained(folder / "transformer").eval()
    with torch.no_grad():
        x = vae.encode(px).latent_dist.mode()
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, 4 * c, h // 2,
                                                                              w // 2)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    x = (x - mean) / std
    s = sigmas.view(-1, 1, 1, 1)
    noisy = (1 - s) * x + s * noise
    _, ch, hh, ww = noisy.shape
    packed = noisy.reshape(b, ch, hh * ww).permute(0, 2, 1)
    # (t, h, w, l) ids: image tokens row-major, text tokens along l
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(hh), torch.arange(ww),
                                torch.arange(1))
    img_ids = grid.unsqueeze(0).expand(b, -1, -1)
    txt = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                               torch.arange(embeds.shape[1]))
    txt_ids = txt.unsqueeze(0).expand(b, -1, -1)
    assert transformer.config.guidance_embeds is False
    with torch.no_grad():
        out = transformer(hidden_states=packed, timestep=sigmas * 1000 / 1000, guidance=None,
                          encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=img_ids,
                          return_dict=False)[0]
    pred = out.permute(0, 2, 1).reshape(b, ch, hh, ww)
    target = noise - x
    return ((pred.float() - target.float()) ** 2).reshape(b, -1).mean(dim=1).mean()


def test_loss_matches_the_written_out_diffusers_reference(folder: Path) -> None:
    c = FLUX2.load(str(folder))
    assert c.pipeline_class == "Flux2KleinPipeline" and not c.is_distilled
    px = pixels(2)
    texts = FLUX2.encode_prompts(c, PROMPTS)
    embeds = torch.stack([t["prompt_embeds"] for t in texts])
    ref_embeds = reference_text(folder, PROMPTS)
    torch.testing.assert_close(embeds, ref_embeds, rtol=1e-5, atol=1e-6)
    assert [int(t["prompt_mask"].sum()) for t in texts] == [37, 64]  # 25 template + 1 a byte

    latents = FLUX2.encode_images(c, px)
    assert latents.shape == (2, 32, 4, 4)  # 8 VAE channels x 2x2 patches, 64 px / 16
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(3))
    sigmas = torch.tensor([0.3, 0.8])
    sample = FLUX2.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        loss = FLUX2.loss(c, FLUX2.predict(c, sample, {"prompt_embeds": embeds}), sample)
    expected = reference_loss(folder, px, ref_embeds, noise, sigmas)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    # The normalisation is not the identity: the calibrated statistics move the latents.
    assert 0.5 < float(latents.std()) < 2.0


def test_training_sigmas_are_unshifted_like_the_script(folder: Path) -> None:
    """FLUX.2 shifts dynamically at inference only; the scripts train on the scheduler's
    unshifted sigmas."""
    c = FLUX2.load(str(folder))
    assert c.noise_scheduler.config.use_dynamic_shifting and FLUX2.train_shift(c) == 1.0
    t = FLUX2.noise_and_target(c, torch.zeros(512, 32, 2, 2),
                               generator=torch.Generator().manual_seed(0)).timesteps
    assert t.median() == pytest.approx(500, abs=60)


def test_folder_is_told_apart_from_flux1(folder: Path) -> None:
    assert loading.folder_families(str(folder)) == ("flux2",)
    from core.models.families.flux.family import FAMILY as FLUX

    with pytest.raises(loading.ModelLoadError, match='model.family = "flux2"'):
        FLUX.load(str(folder))
    keys = ["double_blocks.0.img_attn.qkv.weight", "single_stream_modulation.lin.weight"]
    assert loading.detect_checkpoint_family(keys) == "flux2"


# ---------------------------------------------------------------- LoRA files


def _image(pipe, embeds: torch.Tensor) -> torch.Tensor:
    """Two steps from fixed embeddings (encoding 512 tokens through 28 layers each time
    would dominate the test), without classifier-free guidance."""
    out = pipe(prompt_embeds=embeds, num_inference_steps=2, height=64, width=64,
               output_type="np", guidance_scale=1.0, generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


def test_lora_trains_saves_and_both_files_reload_in_diffusers(folder: Path, tmp_path: Path
                                                              ) -> None:
    from diffusers import Flux2KleinPipeline
    from peft import LoraConfig

    c = FLUX2.load(str(folder))
    c.denoiser.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                      target_modules=FLUX2.lora_target_modules("all")))
    lora = [p for n, p in c.denoiser.named_parameters() if "lora_" in n]
    # 1 double block: q, k, v, out + 8 "all" extras; 1 single block: qkv_mlp, out; proj_out
    assert len(lora) == 2 * (4 + 8 + 2 + 1)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    text = {"prompt_embeds": torch.stack([t["prompt_embeds"]
                                          for t in FLUX2.encode_prompts(c, PROMPTS)])}
    embeds = text["prompt_embeds"][:1]
    s = FLUX2.noise_and_target(c, FLUX2.encode_images(c, pixels(2)),
                               generator=torch.Generator().manual_seed(0))
    FLUX2.loss(c, FLUX2.predict(c, s, text), s).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora)

    trained = _image(FLUX2.validation_pipeline(c), embeds)
    files = FLUX2.save_lora(c, tmp_path / "lora")
    assert set(files) == {"diffusers", "comfyui"}
    from safetensors import safe_open

    with safe_open(str(files["comfyui"]), "pt") as fh:
        keys = set(fh.keys())
    assert "diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight" in keys
    assert "diffusion_model.single_blocks.0.linear1.lora_B.weight" in keys

    base = Flux2KleinPipeline.from_pretrained(str(folder), local_files_only=True)
    base.set_progress_bar_config(disable=True)
    before = _image(base, embeds)
    base.load_lora_weights(str(files["diffusers"]))
    with_diffusers = _image(base, embeds)
    assert (with_diffusers - before).abs().max() > 1e-3, "the LoRA changes the image"
    torch.testing.assert_close(with_diffusers, trained, atol=2e-4, rtol=0)
    base.unload_lora_weights()
    torch.testing.assert_close(_image(base, embeds), before)
    base.load_lora_weights(str(files["comfyui"]))  # BFL layout, as ComfyUI reads it
    torch.testing.assert_close(_image(base, embeds), trained, atol=2e-4, rtol=0)


# ---------------------------------------------------------------- single files

BFL_TOP = {"x_embedder": "img_in", "context_embedder": "txt_in", "proj_out": "final_layer.linear",
           "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
           "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
           "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
           "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
           "single_stream_modulation.linear": "single_stream_modulation.lin"}
BFL_DOUBLE = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale",
              "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
              "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
              "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
              "attn.to_out.0.weight": "img_attn.proj.weight",
              "attn.to_add_out.weight": "txt_attn.proj.weight",
              "ff.linear_in.weight": "img_mlp.0.weight", "ff.linear_out.weight": "img_mlp.2.weight",
              "ff_context.linear_in.weight": "txt_mlp.0.weight",
              "ff_context.linear_out.weight": "txt_mlp.2.weight"}
BFL_SINGLE = {"attn.to_qkv_mlp_proj.weight": "linear1.weight",
              "attn.to_out.weight": "linear2.weight",
              "attn.norm_q.weight": "norm.query_norm.scale",
              "attn.norm_k.weight": "norm.key_norm.scale"}


def bfl_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers Flux2Transformer2DModel state dict in BFL's file layout (the inverse of
    diffusers' convert_flux2_transformer_checkpoint_to_diffusers), as flux2-*.safetensors."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        module, _, param = key.rpartition(".")
        head, _, rest = key.partition(".")
        index, _, leaf = rest.partition(".")
        if module in BFL_TOP:
            out[f"{BFL_TOP[module]}.{param}"] = value
        elif module == "norm_out.linear":  # diffusers (scale, shift) -> BFL (shift, scale)
            scale, shift = value.chunk(2, dim=0)
            out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale])
        elif head == "single_transformer_blocks":
            out[f"single_blocks.{index}.{BFL_SINGLE[leaf]}"] = value
        elif leaf in BFL_DOUBLE:
            out[f"double_blocks.{index}.{BFL_DOUBLE[leaf]}"] = value
    for index in {k.split(".")[1] for k in state if k.startswith("transformer_blocks.")}:
        for fused, parts in (("img_attn", ("to_q", "to_k", "to_v")),
                             ("txt_attn", ("add_q_proj", "add_k_proj", "add_v_proj"))):
            out[f"double_blocks.{index}.{fused}.qkv.weight"] = torch.cat(
                [state[f"transformer_blocks.{index}.attn.{p}.weight"] for p in parts])
    return out


def test_single_transformer_file_loads_with_model_config(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    reference = FLUX2.load(str(folder))
    state = {k: v.to(torch.bfloat16) for k, v in reference.denoiser.state_dict().items()}
    file = tmp_path / "flux2-klein-tiny.safetensors"
    save_file({k: v.contiguous() for k, v in bfl_transformer(state).items()}, str(file))
    assert loading.detect_checkpoint_family(loading.safetensors_keys(str(file))) == "flux2"

    with pytest.raises(loading.ModelLoadError, match="set model.config"):
        FLUX2.load(str(file))
    c = FLUX2.load(str(file), config=str(folder))
    assert c.source == str(file) and c.pipeline_class == "Flux2KleinPipeline"
    got = c.denoiser.state_dict()
    assert got.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(got[key].to(torch.bfloat16), value), key


# ---------------------------------------------------------------- FLUX.2-dev's text path

MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                    "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Mistral Small 3.1's template for what Flux2Pipeline sends (system + user text blocks).
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' }}"
    "{%- for block in message['content'] %}{{- block['text'] }}{%- endfor %}"
    "{{- '[/INST]' }}{%- endif %}{%- endfor %}")


def tiny_dev_text() -> tuple:
    """A tiny Mistral3ForConditionalGeneration (31 text layers, so (10, 20, 30) exist) and
    a byte-level tokenizer with Mistral's chat template. The real pipeline's tokenizer is
    a PixtralProcessor, which needs torchvision (not installed here); the tokenizer
    stands in for it, with the same apply_chat_template call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralVisionConfig,
        PreTrainedTokenizerFast,
    )

    from core.models.tiny.clip import byte_symbols

    vocab = {s: i for i, s in enumerate(MISTRAL_SPECIALS)}
    for s in byte_symbols():
        vocab[s] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(MISTRAL_SPECIALS)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>")
    tok.chat_template = MISTRAL_TEMPLATE
    config = Mistral3Config(
        vision_config=PixtralVisionConfig(hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          image_size=64, patch_size=16, head_dim=8),
        text_config=MistralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=31,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                  vocab_size=len(vocab), max_position_embeddings=1024),
        image_token_index=vocab["[IMG]"], spatial_merge_size=1)
    torch.manual_seed(0)
    return Mistral3ForConditionalGeneration(config).eval(), tok


def test_dev_text_guidance_and_validation_follow_flux2pipeline(folder: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel

    from core.models.families.flux2.family import Flux2Components

    encoder, tok = tiny_dev_text()
    klein = FLUX2.load(str(folder))
    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(  # dev is guidance-distilled
        patch_size=1, in_channels=32, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=True).eval()
    c = Flux2Components(
        family="flux2", source="dev", fingerprint="dev", vae=klein.vae, denoiser=transformer,
        text_encoders=[encoder], tokenizers=[tok],
        noise_scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        guidance=1.0, pipeline_class="Flux2Pipeline")
    texts = FLUX2.encode_prompts(c, PROMPTS)
    with torch.no_grad():
        expected = Flux2Pipeline._get_mistral_3_small_prompt_embeds(encoder, tok, PROMPTS)
    embeds = torch.stack([t["prompt_embeds"] for t in texts])
    torch.testing.assert_close(embeds, expected)  # hidden states (10, 20, 30), system message
    masks = [int(t["prompt_mask"].sum()) for t in texts]
    assert masks[1] - masks[0] == len(PROMPTS[1]) - len(PROMPTS[0])

    s = FLUX2.noise_and_target(c, torch.randn(1, 32, 4, 4), timesteps=500.0)
    with torch.no_grad():
        base = FLUX2.predict(c, s, {"prompt_embeds": embeds[:1]})
        c.guidance = 4.0
        other = FLUX2.predict(c, s, {"prompt_embeds": embeds[:1]})
    assert not torch.allclose(base, other), "the guidance value reaches the transformer"
    pipe = FLUX2.validation_pipeline(c)  # drops the negative embeddings dev cannot take
    image = pipe(prompt_embeds=embeds[:1], negative_prompt_embeds=embeds[1:],
                 num_inference_steps=2, height=64, width=64, guidance_scale=4.0).images[0]
    assert image.size == (64, 64)
