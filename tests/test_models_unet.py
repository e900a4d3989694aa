"""UNet families (sd15, sd2, sdxl) on tiny random models, CPU, offline.

Each family is built once per module into a temporary workspace; every test loads it
fresh so LoRA adapters from one test never leak into another.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.models import loading, objectives
from core.models.registry import FAMILY_NAMES, get_family, list_families
from core.models.tiny import (
    MARKER,
    build_tiny_folder,
    materialize_tiny,
    resolve_model_path,
    tiny_dir,
)

ROOT = Path(__file__).resolve().parents[1]
UNET_FAMILIES = ["sd15", "sd2", "sdxl"]
TEXT_WIDTH = {"sd15": 32, "sd2": 32, "sdxl": 64}


@pytest.fixture(scope="module")
def workspace(tiny_workspace: Path) -> Path:
    """conftest's session workspace: other test modules reuse the tiny builds."""
    return tiny_workspace


@pytest.fixture(scope="module")
def tiny_paths(workspace: Path) -> dict[str, str]:
    return {f: resolve_model_path(f"tiny:{f}", workspace) for f in UNET_FAMILIES}


def _load(family: str, tiny_paths: dict[str, str]) -> tuple[object, object]:
    fam = get_family(family)
    return fam, fam.load(tiny_paths[family])


def _pixels(n: int = 2, size: int = 64) -> object:
    g = torch.Generator().manual_seed(123)
    return torch.rand(n, 3, size, size, generator=g) * 2 - 1


def _batch(items: list[dict]) -> dict:
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def _add_lora(fam: object, c: object, rank: int = 4, alpha: int = 8) -> None:
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                      target_modules=fam.lora_target_modules()))


# ---------------------------------------------------------------- registry


def test_registry_lists_families_without_importing_torch() -> None:
    code = ("import sys; from core.models.registry import list_families; "
            "print(list_families(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ("['sd15', 'sd2', 'sdxl', 'sd3', 'flux', 'flux_kontext', 'flux2', "
                   "'flux3', 'ideogram4', 'chroma', 'z_image', 'qwen_image', "
                   "'qwen_image_edit', 'qwen_image21', 'krea2', 'ernie_image', 'anima', "
                   "'wan', 'ltx2', 'hunyuan_video15'] False")
    assert list_families() == list(FAMILY_NAMES)


def test_unknown_family_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown model family 'sd9'.*sd15, sd2, sdxl"):
        get_family("sd9")
    with pytest.raises(ValueError, match="tiny:sd15"):
        resolve_model_path("tiny:sd9", Path("/nonexistent"))


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_family_object_matches_protocol(family: str) -> None:
    fam = get_family(family)
    assert fam.name == family
    assert fam.text_encoder_count == (2 if family == "sdxl" else 1)
    assert fam.prediction == ("v_prediction" if family == "sd2" else "epsilon")
    assert fam.lora_target_modules() == ["to_k", "to_q", "to_v", "to_out.0"]


# ---------------------------------------------------------------- training path


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_encode_prompts_keeps_padded_sequence_with_mask(family: str, tiny_paths) -> None:
    fam, c = _load(family, tiny_paths)
    short, long_ = fam.encode_prompts(c, ["a", "a red circle on a blue square"])
    for item in (short, long_):
        assert item["prompt_embeds"].shape == (77, TEXT_WIDTH[family])
        assert item["prompt_mask"].dtype == torch.bool and item["prompt_mask"].shape == (77,)
    # BOS + "a</w>" + EOS = 3 real tokens; the long prompt has more, padding is False.
    assert int(short["prompt_mask"].sum()) == 3
    assert int(long_["prompt_mask"].sum()) > 3 and not bool(long_["prompt_mask"][-1])
    if family == "sdxl":
        assert short["pooled_prompt_embeds"].shape == (32,)
        assert not torch.allclose(short["pooled_prompt_embeds"],
                                  long_["pooled_prompt_embeds"])
    else:
        assert "pooled_prompt_embeds" not in short


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_encode_images_scales_by_eight_and_mean_is_deterministic(family, tiny_paths) -> None:
    fam, c = _load(family, tiny_paths)
    px = _pixels(2, 64)
    mean1, mean2 = fam.encode_images(c, px), fam.encode_images(c, px)
    assert mean1.shape == (2, 4, 8, 8)
    assert torch.equal(mean1, mean2)
    s1 = fam.encode_images(c, px, generator=torch.Generator().manual_seed(0))
    s2 = fam.encode_images(c, px, generator=torch.Generator().manual_seed(0))
    assert torch.equal(s1, s2) and not torch.equal(s1, mean1)
    raw = c.vae.encode(px).latent_dist.mean
    assert torch.allclose(mean1, raw * c.vae.config.scaling_factor)


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_noise_target_follows_prediction_type(family: str, tiny_paths) -> None:
    fam, c = _load(family, tiny_paths)
    latents = fam.encode_images(c, _pixels(2, 64))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(1))
    assert s.noisy.shape == latents.shape == s.target.shape
    assert s.timesteps.shape == (2,) and s.timesteps.dtype == torch.long
    noise = torch.randn_like(latents)
    fixed = fam.noise_and_target(c, latents, timesteps=torch.tensor([500, 500]), noise=noise)
    assert fixed.timesteps.tolist() == [500, 500]
    if c.noise_scheduler.config.prediction_type == "v_prediction":
        assert family == "sd2" and not torch.allclose(fixed.target, noise)
    else:
        assert torch.equal(fixed.target, noise)


def test_noise_offset_shifts_each_image_channel_as_a_whole(tiny_paths) -> None:
    """With offset 0.5 the noise's mean over each image's channel varies with a standard
    deviation near 0.5; without it near 1/8 (the mean of 64 unit normals)."""
    fam, c = _load("sd15", tiny_paths)
    latents = torch.zeros(256, 4, 8, 8)

    def channel_mean_std(offset: float) -> float:
        s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(3),
                                 noise_offset=offset)
        return float(s.target.mean(dim=(2, 3)).std())  # epsilon: the target is the noise

    assert channel_mean_std(0.0) < 0.16
    assert 0.42 < channel_mean_std(0.5) < 0.6
    given = torch.randn_like(latents)  # evaluation's fixed noise is used as given
    fixed = fam.noise_and_target(c, latents, timesteps=torch.tensor([500]), noise=given,
                                 noise_offset=0.5)
    assert torch.equal(fixed.target, given)


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_lora_loss_backward_reaches_only_lora_params(family: str, tiny_paths) -> None:
    fam, c = _load(family, tiny_paths)
    _add_lora(fam, c)
    items = fam.encode_prompts(c, ["a red circle", "a square"])
    latents = fam.encode_images(c, _pixels(2, 64))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(2))
    pred = fam.predict(c, s, _batch(items))
    assert pred.shape == latents.shape
    plain = fam.loss(c, pred, s)
    weighted = fam.loss(c, pred, s, min_snr_gamma=5.0)
    assert plain.ndim == 0 and torch.isfinite(plain) and not torch.isclose(plain, weighted)
    weighted.backward()
    grads = {n: p.grad for n, p in c.denoiser.named_parameters() if p.requires_grad}
    assert grads and all("lora_" in n for n in grads)
    # A fresh LoRA has B = 0, so only B gets gradient on the first step: every B must.
    b_grads = [g for n, g in grads.items() if "lora_B" in n]
    assert len(b_grads) == len(grads) // 2
    assert all(g is not None and g.abs().sum() > 0 for g in b_grads)


def test_half_precision_load_trains_in_that_dtype(tiny_paths) -> None:
    fam = get_family("sdxl")
    c = fam.load(tiny_paths["sdxl"], dtype="bf16")
    assert c.denoiser.dtype == c.vae.dtype == c.text_encoders[1].dtype == torch.bfloat16
    latents = fam.encode_images(c, _pixels(1, 64))
    s = fam.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    pred = fam.predict(c, s, _batch(fam.encode_prompts(c, ["a"])))
    loss = fam.loss(c, pred, s, min_snr_gamma=5.0)
    assert latents.dtype == pred.dtype == torch.bfloat16 and loss.dtype == torch.float32
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        fam.load(tiny_paths["sdxl"], dtype="fp8")


def test_min_snr_weights_differ_for_epsilon_and_v(tiny_paths) -> None:
    _, c = _load("sd2", tiny_paths)
    sched = c.noise_scheduler
    t = torch.tensor([10, 500, 990])
    s = objectives.snr(sched, t)
    v = objectives.min_snr_weights(sched, t, 5.0)
    assert torch.allclose(v, torch.minimum(s, torch.tensor(5.0)) / (s + 1))
    assert v[0] < 1 and v[-1] < 1  # low-noise steps damped; v weights never reach 1


def test_sdxl_size_ids_reach_the_unet(tiny_paths) -> None:
    fam, c = _load("sdxl", tiny_paths)
    text = _batch(fam.encode_prompts(c, ["a"]))
    latents = fam.encode_images(c, _pixels(1, 64))
    s = fam.noise_and_target(c, latents, timesteps=torch.tensor([300]),
                             noise=torch.randn_like(latents))
    default = fam.predict(c, s, text)
    same = fam.predict(c, s, {**text, "original_size": (64, 64), "crop_top_left": (0, 0),
                              "target_size": (64, 64)})
    cropped = fam.predict(c, s, {**text, "original_size": [(1024, 768)],
                                 "crop_top_left": [(32, 0)], "target_size": [(64, 64)]})
    assert torch.allclose(default, same)
    assert not torch.allclose(default, cropped)


# ---------------------------------------------------------------- LoRA files


def _image(pipe: object, family: str) -> object:
    out = pipe("a red circle", num_inference_steps=1, height=64, width=64, output_type="np",
               generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


@pytest.mark.parametrize("family", UNET_FAMILIES)
def test_saved_lora_reloads_in_diffusers_and_kohya_formats(family, tiny_paths, tmp_path):
    fam, c = _load(family, tiny_paths)
    _add_lora(fam, c, rank=4, alpha=8)  # alpha != rank: the scale must survive the files
    with torch.no_grad():  # a fresh LoRA's B is zero; make it change the output
        for n, p in c.denoiser.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    trained = _image(fam.validation_pipeline(c), family)
    files = fam.save_lora(c, tmp_path / "lora")
    assert files["diffusers"] == tmp_path / "lora" / "pytorch_lora_weights.safetensors"

    fresh_fam, fresh = _load(family, tiny_paths)
    pipe = fresh_fam.validation_pipeline(fresh)
    base = _image(pipe, family)
    assert (base - trained).abs().max() > 1e-3
    pipe.load_lora_weights(str(tmp_path / "lora"))
    assert torch.allclose(_image(pipe, family), trained, atol=1e-4)

    from safetensors import safe_open

    with safe_open(str(files["kohya"]), framework="pt") as f:
        keys = list(f.keys())
        alphas = {float(f.get_tensor(k)) for k in keys if k.endswith(".alpha")}
    assert keys and all(k.startswith("lora_unet_") for k in keys)
    assert alphas == {8.0}
    _, other = _load(family, tiny_paths)
    kohya_pipe = fam.validation_pipeline(other)
    kohya_pipe.load_lora_weights(str(tmp_path / "lora"), weight_name=files["kohya"].name)
    assert torch.allclose(_image(kohya_pipe, family), trained, atol=1e-4)


def test_save_lora_without_adapter_says_so(tiny_paths, tmp_path) -> None:
    fam, c = _load("sd15", tiny_paths)
    with pytest.raises(ValueError, match="no LoRA adapter"):
        fam.save_lora(c, tmp_path)


# ---------------------------------------------------------------- bad input


def _fake_checkpoint(path: Path, prefix: str) -> Path:
    from safetensors.torch import save_file

    save_file({f"{prefix}.weight": torch.zeros(2),
               "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2)}, str(path))
    return path


def test_path_that_is_nothing_is_named(tmp_path) -> None:
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(loading.ModelLoadError, match="no_such_model: does not exist"):
        get_family("sd15").load(missing)
    with pytest.raises(loading.ModelLoadError, match="not a diffusers model folder"):
        get_family("sd15").load(str(tmp_path))
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"x")
    with pytest.raises(loading.ModelLoadError, match=r"model\.ckpt.*only \.safetensors"):
        get_family("sd15").load(str(ckpt))


@pytest.mark.parametrize(("prefix", "looks_like", "asked"), [
    ("conditioner.embedders.1.model.ln_final", "sdxl", "sd15"),
    ("cond_stage_model.model.ln_final", "sd2", "sd15"),
    ("model.diffusion_model.joint_blocks.0.x", "sd3", "sdxl"),
    ("double_blocks.0.img_attn.qkv", "flux", "sd2"),
    ("distilled_guidance_layer.in_proj.bias", "chroma", "flux"),
    ("single_stream_modulation.lin", "flux2", "flux"),
])
def test_single_file_of_another_family_is_refused(prefix, looks_like, asked, tmp_path) -> None:
    f = _fake_checkpoint(tmp_path / "weird.safetensors", prefix)
    with pytest.raises(loading.ModelLoadError) as info:
        get_family(asked).load(str(f))
    msg = str(info.value)
    assert "weird.safetensors" in msg and f"looks like a {looks_like} checkpoint" in msg
    assert f'model.family = "{looks_like}"' in msg


def test_folder_of_another_family_is_refused(tiny_paths) -> None:
    with pytest.raises(loading.ModelLoadError, match="StableDiffusionXLPipeline.*not sd15"):
        get_family("sd15").load(tiny_paths["sdxl"])


def test_corrupt_component_names_the_folder(tiny_paths, tmp_path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_paths["sd15"], broken)
    (broken / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(loading.ModelLoadError, match=r"broken/unet: cannot load unet"):
        get_family("sd15").load(str(broken))


def test_hub_id_offline_fails_fast_with_message(monkeypatch) -> None:
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(loading.ModelLoadError, match="no network and not in the HF cache"):
        get_family("sd15").load("nobody-xyz/not-a-model")
    [problem] = loading.check_model_source("nobody-xyz/not-a-model", "sd15")
    assert problem.where == "model.path" and "not in the HF cache" in problem.message


def test_check_model_source_without_loading(tiny_paths, tmp_path) -> None:
    """What `--stage check` reports: key, path and the fix, one problem per path."""
    assert loading.check_model_source("tiny:sd15", "sd15") == []
    assert loading.check_model_source(tiny_paths["sd2"], "sd2") == []
    [p] = loading.check_model_source("tiny:sdxl", "sd15")
    assert p.where == "model.path" and "use tiny:sd15" in p.message
    [p] = loading.check_model_source(tiny_paths["sdxl"], "sd2")
    assert tiny_paths["sdxl"] in p.message and 'model.family = "sdxl"' in p.message
    f = _fake_checkpoint(tmp_path / "x.safetensors", "double_blocks.0.a")
    [p] = loading.check_model_source(str(f), "sdxl")
    assert str(f) in p.message and "looks like a flux checkpoint" in p.message
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 3)
    [p] = loading.check_model_source(str(tmp_path / "bad.safetensors"), "sd15")
    assert "not a readable .safetensors file" in p.message


# ---------------------------------------------------------------- tiny builds


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tiny_build_is_deterministic(tmp_path) -> None:
    build_tiny_folder("sdxl", tmp_path / "a")
    build_tiny_folder("sdxl", tmp_path / "b")
    a, b = _hashes(tmp_path / "a"), _hashes(tmp_path / "b")
    assert any(k.endswith(".safetensors") for k in a) and a == b


def test_materialize_reuses_and_replaces_half_builds(workspace, tiny_paths, tmp_path) -> None:
    folder = Path(tiny_paths["sd15"])
    assert folder == tiny_dir("sd15", workspace) and (folder / MARKER).is_file()
    stamp = (folder / "unet" / "config.json").stat().st_mtime_ns
    assert materialize_tiny("sd15", workspace) == folder
    assert (folder / "unet" / "config.json").stat().st_mtime_ns == stamp
    half = tiny_dir("sd2", tmp_path)  # a folder left without its marker: rebuilt
    (half / "unet").mkdir(parents=True)
    assert materialize_tiny("sd2", tmp_path) == half and (half / "model_index.json").is_file()
    assert not [p for p in half.parent.iterdir() if p.name.endswith(".tmp")]


def test_crashed_build_leaves_nothing_loadable(tmp_path, monkeypatch) -> None:
    import core.models.families.sd15.tiny as tiny_sd15

    def crash(out_dir: Path, seed: int = 0) -> None:
        (Path(out_dir) / "unet").mkdir(parents=True)
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_sd15, "build", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        materialize_tiny("sd15", tmp_path)
    models = tmp_path / "models"
    assert not tiny_dir("sd15", tmp_path).exists()
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.slow  # processes racing to build a tiny model: the full suite's, not test-fast's
def test_concurrent_materialize_builds_once(tmp_path) -> None:
    code = ("import sys; from pathlib import Path; from core.models.tiny import "
            "materialize_tiny; print(materialize_tiny('sd15', Path(sys.argv[1])))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    fam, c = get_family("sd15"), None
    c = fam.load(outs[0][0].strip())
    assert c.denoiser.config.cross_attention_dim == 32


def test_fingerprint_is_stable_and_tracks_weights(tiny_paths, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_paths["sd15"], copy)
    first = loading.fingerprint(str(copy), "folder")
    assert first == loading.fingerprint(str(copy), "folder")
    assert get_family("sd15").load(str(copy)).fingerprint == first
    weights = copy / "unet" / "diffusion_pytorch_model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert loading.fingerprint(str(copy), "folder") != first
    assert loading.fingerprint("org/model", "hub") != loading.fingerprint("org/other", "hub")


@pytest.mark.parametrize(("family", "width", "other"), [("sd15", 1024, "sd2"),
                                                        ("sd2", 768, "sd15")])
def test_an_sd1_model_loaded_as_sd2_or_the_reverse_is_named(family: str, width: int,
                                                            other: str) -> None:
    """The text width of a real model (each family's `text_width`) names the family it
    belongs to; sdxl's (2048) and a tiny model's name none."""
    from types import SimpleNamespace

    loaded = SimpleNamespace(source="some/model", denoiser=SimpleNamespace(
        config=SimpleNamespace(cross_attention_dim=width)))
    with pytest.raises(loading.ModelLoadError, match=f'model.family = "{other}"'):
        get_family(family)._check_loaded(loaded)
    for name, quiet in (("sdxl", 768), (family, 32)):
        loaded.denoiser.config.cross_attention_dim = quiet
        get_family(name)._check_loaded(loaded)
