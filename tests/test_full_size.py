"""random:<family>: the real architectures from the shipped configs, with random weights.

The parameter counts are the real checkpoints' (on the meta device, no memory); one
real build (SD1.5 in bf16, about 2 GB) checks the weights, a forward, determinism and
the temporary tokenizer folder. The bigger families are checked through meta counts only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.models.full_size import RANDOM_PREFIX, full_size_dir
from core.models.registry import FAMILY_NAMES

# Parameters of the real checkpoints' components (tied parameters once).
CLIP_L = 123_060_480
SD_VAE = 83_653_863
T5_XXL = 4_762_310_656
EXPECTED = {
    "sd15": {"unet": 859_520_964, "vae": SD_VAE, "text_encoder": CLIP_L},
    "sd2": {"unet": 865_910_724, "vae": SD_VAE, "text_encoder": 340_387_840},
    "sdxl": {"unet": 2_567_463_684, "vae": SD_VAE, "text_encoder": CLIP_L,
             "text_encoder_2": 694_659_840},
    "flux": {"transformer": 11_901_408_320, "text_encoder": CLIP_L,
             "text_encoder_2": T5_XXL},
    # Z-Image: the "6B" S3-DiT (12.3 GB of bf16 shards), Qwen3-4B as Qwen3Model (no LM
    # head; its 8.05 GB of bf16 shards) and FLUX.1's VAE (no quant convs).
    "z_image": {"transformer": 6_154_908_736, "text_encoder": 4_022_468_096,
                "vae": 83_819_683},
    # Chroma1-HD: "8.9B" (its model card); the FLUX.1 VAE; T5-XXL alone.
    "chroma": {"transformer": 8_899_983_424, "vae": 83_819_683, "text_encoder": T5_XXL},
    # FLUX.2-klein-base-4B: Flux2Transformer2DModel as diffusers' convert_flux2_to_diffusers.py
    # builds klein-4b; Qwen3-4B (tied embeddings).
    "flux2": {"transformer": 3_875_544_576, "text_encoder": 4_022_468_096},
    # Wan2.1-T2V-1.3B: ComfyUI's wan2.1_t2v_1.3B_fp16 file is 2.84 GB; UMT5-XXL's encoder
    # alone (umt5-xxl-enc-bf16, 11.4 GB); the Wan 2.1 VAE (the same as Qwen-Image's).
    "wan": {"transformer": 1_418_996_800, "text_encoder": 5_680_910_336, "vae": 126_892_531},
}


# ---------------------------------------------------------------- configs (no weights)


@pytest.mark.parametrize("family", ["sd15", "sd2", "sdxl", "flux", "flux2", "z_image", "chroma",
                                    "wan"])
def test_parameter_counts_are_the_real_models(family):
    from core.models.full_size.meta import parameter_counts

    counts = parameter_counts(family)
    assert {k: counts[k] for k in EXPECTED[family]} == EXPECTED[family]


def test_sd35_medium_has_its_transformer_and_three_encoders():
    from core.models.full_size.meta import parameter_counts

    counts = parameter_counts("sd3")
    assert 2_240_000_000 <= counts["transformer"] <= 2_500_000_000
    assert counts["text_encoder_3"] == T5_XXL
    assert counts["text_encoder_2"] == EXPECTED["sdxl"]["text_encoder_2"]
    assert set(counts) == {"transformer", "vae", "text_encoder", "text_encoder_2",
                           "text_encoder_3"}


def test_flux_configs_are_flux1_dev():
    from core.models.full_size.spec import component_config, model_index

    transformer = component_config("flux", "transformer")
    assert (transformer["num_layers"], transformer["num_single_layers"]) == (19, 38)
    assert transformer["guidance_embeds"] is True
    vae = component_config("flux", "vae")
    assert (vae["scaling_factor"], vae["shift_factor"]) == (0.3611, 0.1159)
    assert vae["use_quant_conv"] is False and vae["use_post_quant_conv"] is False
    assert component_config("flux", "scheduler")["use_dynamic_shifting"] is True
    assert model_index("flux")["_class_name"] == "FluxPipeline"


def test_every_family_has_a_folder_the_pipeline_classes_match():
    from core.models.loading import folder_families

    for family in FAMILY_NAMES:
        assert family in folder_families(str(full_size_dir(family)))
        assert not list(full_size_dir(family).rglob("*.safetensors"))


def test_tokenizer_ids_fit_the_real_vocabularies():
    from core.models.full_size.build import _tokenizers
    from core.models.full_size.spec import component_config

    for family, t5_index in (("sd3", 2), ("flux", 1), ("chroma", 0)):
        tokenizers = _tokenizers(family)
        for i, tok in enumerate(tokenizers):
            name = "text_encoder" + (f"_{i + 1}" if i else "")
            vocab = component_config(family, name)["vocab_size"]
            ids = tok(["A café at 9:30, ünïcode ✓"], padding="max_length", max_length=77,
                      truncation=True).input_ids[0]
            assert 0 <= min(ids) and max(ids) < vocab, (family, name)
        assert type(tokenizers[t5_index]).__name__.startswith("T5Tokenizer")


# ---------------------------------------------------------------- check and config


def _preset(name: str):
    from core.config import load_config
    from core.presets import preset_path

    return load_config(preset_path(name))


def test_check_model_source_accepts_random_of_the_same_family():
    from core.models.loading import check_model_source

    assert check_model_source("random:flux", "flux") == []
    assert check_model_source("random:sd15", "sd15") == []


def test_check_model_source_refuses_another_or_an_unknown_family():
    from core.models.loading import check_model_source

    (problem,) = check_model_source("random:flux", "sdxl")
    assert problem.level == "error" and str(problem).startswith("error: model.path:")
    assert "random:flux" in problem.message and "random:sdxl" in problem.message
    (problem,) = check_model_source("random:sd9", "sd15")
    assert problem.where == "model.path" and "random:sd15" in problem.message


def test_classify_source_says_random_models_are_built():
    from core.models.loading import ModelLoadError, classify_source

    with pytest.raises(ModelLoadError, match="random weights.*build_random"):
        classify_source("random:sdxl")


def test_resolved_leaves_random_paths_alone(tmp_path):
    from core.config import resolved

    (tmp_path / "random:sd15").mkdir()  # even a folder of that name does not capture it
    cfg = _preset("sd15-lora")
    cfg.model.path = "random:sd15"
    assert resolved(cfg, tmp_path).model.path == "random:sd15"


def test_load_model_builds_random_models_on_the_given_device(monkeypatch):
    import core.models.full_size.build as build
    from core.models.loading import ModelLoadError
    from core.startup import load_model

    calls = []
    monkeypatch.setattr(build, "build_random",
                        lambda *a, stream_denoiser=False: calls.append(a) or "built")
    state = SimpleNamespace(device="cuda:3", main_process_first=None)  # never used
    cfg = _preset("sd15-lora")
    cfg.model.path = "random:sd15"
    family, built = load_model(cfg, Path("."), state, dtype="bf16")
    assert (family.name, built, calls) == ("sd15", "built", [("sd15", "bf16", "cuda:3")])
    load_model(cfg, Path("."), state, device="cpu")
    assert calls[-1] == ("sd15", None, "cpu")
    cfg.model.path = "random:flux"
    with pytest.raises(ModelLoadError, match="model.path"):
        load_model(cfg, Path("."), state)


# ---------------------------------------------------------------- one real build


# A full-size model in memory (4 GB, 15 CPU-s to fill): make test's, not test-fast's.
REAL_BUILD = pytest.mark.slow


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    """random:sd15 in float32 (a bf16 UNet forward takes 10 s on these CPUs, float32 3 s),
    built with the temporary folder pointed at an empty one."""
    import torch

    from core.models.full_size.build import build_random

    tmp = tmp_path_factory.mktemp("tmpdir")
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp)
    try:
        components = build_random("sd15", torch.float32)
    finally:
        tempfile.tempdir = saved
    return components, tmp


@REAL_BUILD
def test_the_build_leaves_no_temporary_files(sd15):
    _, tmp = sd15
    # torch makes its compile cache folder in the temporary folder the first time a
    # process asks for it (an import the build may be the first to trigger); it is
    # torch's, kept for the process, not a file the build left.
    assert [p for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []


@REAL_BUILD
def test_the_build_follows_the_components_contract(sd15):
    import torch

    c, _ = sd15
    assert (c.family, c.source, c.fingerprint) == ("sd15", "random:sd15", "random-sd15-0")
    assert type(c.noise_scheduler).__name__ == "DDPMScheduler"
    assert c.noise_scheduler.config.prediction_type == "epsilon"
    for module in (c.vae, c.denoiser, *c.text_encoders):
        assert not module.training
        for name, p in module.named_parameters():
            assert p.dtype == torch.float32 and not p.requires_grad, name
            assert p.device.type == "cpu", name
            # One pass, no mask the size of the UNet: NaN fails both comparisons. Every
            # draw is within sqrt(3) (the embeddings' bound; the rest are tighter).
            low, high = torch.aminmax(p)
            assert -(3 ** 0.5) <= low.item() and high.item() <= 3 ** 0.5, name
    assert sum(p.numel() for p in c.denoiser.parameters()) == EXPECTED["sd15"]["unet"]


@REAL_BUILD
def test_text_and_one_unet_forward_are_finite(sd15):
    import torch

    from core.models.registry import get_family

    c, _ = sd15
    (item,) = get_family("sd15").encode_prompts(c, ["a red circle"])
    assert item["prompt_embeds"].shape == (77, 768) and item["prompt_mask"].sum() > 2
    assert torch.isfinite(item["prompt_embeds"]).all()
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = c.denoiser(latents, torch.tensor([500]),
                         encoder_hidden_states=item["prompt_embeds"][None]).sample
    assert out.shape == (1, 4, 8, 8) and torch.isfinite(out).all() and out.std() > 0


def _param(module, suffix: str):
    (found,) = [p for n, p in module.named_parameters() if n.endswith(suffix)]
    return found


@REAL_BUILD
def test_weights_depend_on_the_seed_only_and_dtypes_round_them(sd15):
    """An independent bf16 build equals the float32 one rounded: same seed, same values,
    also in the token embedding, which is drawn in many chunks."""
    import torch

    from core.models.full_size.build import build_module

    c, _ = sd15
    ours = c.text_encoders[0]
    again = build_module("sd15", "text_encoder", torch.bfloat16, seed=0)
    other = build_module("sd15", "text_encoder", torch.bfloat16, seed=1)
    assert all(p.dtype == torch.bfloat16 for p in again.parameters())
    for name in ("token_embedding.weight", "layers.11.mlp.fc2.weight",
                 "final_layer_norm.weight", "layers.0.self_attn.q_proj.bias"):
        assert torch.equal(_param(again, name), _param(ours, name).to(torch.bfloat16)), name
    q = "layers.0.self_attn.q_proj.weight"
    assert not torch.equal(_param(again, q), _param(other, q))
    # Variance 1/fan_in (q_proj is 768 wide), norm scales 1, biases 0.
    assert abs(_param(ours, q).std().item() * 768 ** 0.5 - 1) < 0.01
    assert torch.equal(_param(ours, "final_layer_norm.weight"), torch.ones(768))
    assert not _param(ours, "layers.0.self_attn.q_proj.bias").any()


def test_fill_keeps_tied_parameters_tied_and_fp32_modules_fp32():
    import torch
    from accelerate import init_empty_weights
    from transformers import T5Config, T5EncoderModel

    from core.models.full_size.fill import materialize

    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False)
    with init_empty_weights():
        model = T5EncoderModel(config).eval()
    model.tie_weights()
    assert model.shared.weight.device.type == "meta"
    materialize(model, torch.float16, "cpu", seed=0, prefix="t5")
    assert model.shared.weight is model.encoder.embed_tokens.weight
    wo = model.encoder.block[0].layer[1].DenseReluDense.wo.weight
    assert wo.dtype == torch.float32 and model.shared.weight.dtype == torch.float16
    assert all(p.device.type == "cpu" for p in model.parameters())
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 1]])).last_hidden_state
    assert torch.isfinite(out).all()


def test_random_prefix_is_the_documented_one():
    text = (Path(__file__).parents[1] / "docs/random-models.md").read_text(encoding="utf-8")
    assert RANDOM_PREFIX == "random:" and all(f"random:{f}" in text for f in FAMILY_NAMES)


def test_config_rules_and_cache_status_know_random_models(tmp_path):
    from core.cache.status import model_identity
    from core.config import Config, validate_config

    cfg = Config()
    cfg.model.family, cfg.model.path = "sdxl", "random:flux"
    problems = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert problems and "model.family" in problems[0].message
    cfg.model.path = "random:sd4"
    assert any("unknown random family" in p.message for p in validate_config(cfg))
    cfg.model.path = "random:sdxl"
    assert not [p for p in validate_config(cfg) if p.where == "model.path"]
    identity, note = model_identity(cfg, tmp_path)  # what the cache entries record
    assert identity == {"family": "sdxl", "model": "random-sdxl-0"} and note == ""
