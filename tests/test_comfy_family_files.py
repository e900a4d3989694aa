"""ComfyUI's diffusion-model files as model.path, family by family: each tiny model's
transformer written in that family's ComfyUI layout (tests/comfy_layouts.py) as bf16,
fp8 and fp8_scaled (scales, input scales and the marker beside the weights), loaded with
model.config = the tiny folder. The file loads as the folder's transformer (fp8: within
fp8's rounding), a LoRA run keeps its Linears in fp8 through a training step, the
estimate counts them at one byte, and bad files are named at check. Z-Image's own tests
are tests/test_comfy_base_file.py. Offline (conftest sets HF_HUB_OFFLINE)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from comfy_layouts import PREFIX, at_tiny_width, comfy_file, fp8_file
from conftest import small_config
from safetensors.torch import load_file, save_file

from core.check import run_check
from core.config import resolved
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

FAMILIES = ("flux", "flux_kontext", "chroma", "sd3", "flux2", "qwen_image",
            "qwen_image_edit", "krea2", "ltx2", "ernie_image", "ideogram4", "hunyuan_video15")
# diffusers' converters that fix FLUX.1's width (comfy_layouts.at_tiny_width).
FIXED_WIDTH = {"flux": "FluxTransformer2DModel", "flux_kontext": "FluxTransformer2DModel",
               "chroma": "ChromaTransformer2DModel"}
FORMS = ("bf16", "fp8", "fp8_scaled")


@pytest.fixture(autouse=True)
def _tiny_width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    callspec = getattr(request.node, "callspec", None)
    family = callspec.params.get("family") if callspec else None
    if family in FIXED_WIDTH:
        at_tiny_width(monkeypatch, FIXED_WIDTH[family])


def _folder(family: str, workspace: Path) -> Path:
    return Path(resolve_model_path(f"tiny:{family}", workspace))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tiny transformer's weights, drawn wider than its 0.02-std init so fp8's
    rounding shows against them, and saved in the folder's dtype."""
    torch.manual_seed(0)
    weights = {}
    for path in sorted((folder / "transformer").glob("*.safetensors")):
        weights.update(load_file(str(path)))
    return {k: torch.randn_like(v.float()).mul(0.3).to(v.dtype) if v.is_floating_point()
            else v for k, v in weights.items()}


@pytest.fixture(scope="module")
def files(tiny_workspace: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, dict[str, Path]]:
    """family -> "folder" (the tiny diffusers model, its transformer reweighted as the
    files hold it) and one file per form."""
    import shutil

    out = tmp_path_factory.mktemp("comfy-families")
    paths: dict[str, dict[str, Path]] = {}
    for family in FAMILIES:
        folder = out / family
        shutil.copytree(_folder(family, tiny_workspace), folder)
        weights = _weights(folder)
        for stale in (folder / "transformer").glob("*.safetensors"):
            stale.unlink()
        save_file(weights, str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
        bf16 = comfy_file(family, weights)
        paths[family] = {"folder": folder}
        for form, tensors in (("bf16", bf16), ("fp8", fp8_file(bf16, False)),
                              ("fp8_scaled", fp8_file(bf16, True))):
            paths[family][form] = out / f"{family}_{form}.safetensors"
            save_file(tensors, str(paths[family][form]))
    return paths


@pytest.mark.parametrize("family", FAMILIES)
def test_each_form_loads_as_the_folders_transformer(files, family: str) -> None:
    fam, f = get_family(family), files[family]
    want = fam.load(str(f["folder"]), dtype=torch.bfloat16).denoiser.state_dict()
    for form in FORMS:
        got = fam.load(str(f[form]), dtype=torch.bfloat16, config=str(f["folder"])).denoiser
        assert not any(p.is_meta for p in got.parameters()), (family, form)
        got = got.state_dict()
        assert got.keys() == want.keys(), (family, form, set(got) ^ set(want))
        for key, value in want.items():
            if form == "bf16":  # (diffusers keeps some norms in float32 from a folder)
                assert torch.equal(got[key].to(torch.bfloat16), value.to(torch.bfloat16)), (
                    family, key)
            else:  # fp8's 3 mantissa bits, against the tensor's own range
                error = (got[key].float() - value.float()).abs().max()
                assert error <= 0.07 * value.float().abs().max() + 1e-6, (family, form, key)


def _config(tmp_path: Path, f: dict[str, Path], family: str, form: str):
    cfg = small_config(tmp_path, images=2, family=family)
    cfg.model.path, cfg.model.config = str(f[form]), str(f["folder"])
    return cfg


@pytest.mark.slow  # a meta-device build per family: seconds each (make test runs them)
@pytest.mark.parametrize("family", FAMILIES)
def test_an_fp8_file_is_estimated_at_one_byte_a_linear_weight(files, tmp_path: Path,
                                                               family: str) -> None:
    from core.memory.estimate import estimate_memory

    f = files[family]
    scaled = resolved(_config(tmp_path, f, family, "fp8_scaled"), tmp_path)
    assert scaled.model.quantize == "fp8"
    bf16 = resolved(_config(tmp_path, f, family, "bf16"), tmp_path)
    assert bf16.model.quantize == "none"
    got = estimate_memory(scaled, tmp_path, [], caches_built=False).parts
    bf16.model = dataclasses.replace(bf16.model, quantize="fp8")
    assert got == estimate_memory(bf16, tmp_path, [], caches_built=False).parts
    bf16.model = dataclasses.replace(bf16.model, quantize="none")
    assert got != estimate_memory(bf16, tmp_path, [], caches_built=False).parts


# One family's step in the fast suite; the others' (4-15 s each) with the slow tests.
@pytest.mark.parametrize("family", [f if f == "qwen_image" else pytest.param(
    f, marks=pytest.mark.slow) for f in FAMILIES])
def test_a_lora_step_on_an_fp8_scaled_file_keeps_its_linears_in_fp8(files, tmp_path: Path,
                                                                    family: str) -> None:
    from test_quantize import assert_one_step_quantizes

    assert_one_step_quantizes(_config(tmp_path, files[family], family, "fp8_scaled"),
                              tmp_path, "fp8")


# ---------------------------------------------------------------- refused at check


def _model_errors(cfg, workspace: Path) -> list[str]:
    report = run_check(cfg, workspace, estimate=False)
    return [str(p) for p in report.problems
            if p.level == "error" and p.where.startswith("model.path")]


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_files_are_named_at_check(files, tmp_path: Path, family: str) -> None:
    """A scaled file without its scales; another family's ComfyUI file (the next family
    in FAMILIES whose layout is not this family's)."""
    f = files[family]
    scaled = load_file(str(f["fp8_scaled"]))
    bare = tmp_path / "no_scales.safetensors"
    save_file({k: v for k, v in scaled.items() if not k.endswith(".scale_weight")}, str(bare))
    [message] = _model_errors(_config(tmp_path, f | {"bare": bare}, family, "bare"), tmp_path)
    assert message.startswith(f"error: model.path: {bare}") and "scale_weight" in message
    own = get_family(family)
    layouts = {family, own.single_file.layout_of}
    other = next(o for o in FAMILIES[FAMILIES.index(family) + 1:] + FAMILIES
                 if o not in layouts and get_family(o).single_file.layout_of not in layouts)
    [message] = _model_errors(_config(tmp_path, f | {"other": files[other]["fp8"]}, family,
                                      "other"), tmp_path)
    assert "looks like a" in message and f"not {family}" in message, message


def test_a_bundled_checkpoint_reads_only_its_diffusion_model(files, tmp_path: Path) -> None:
    """ComfyUI's all-in-one files (LTX-2's ltx-2-19b-*, FLUX.1's fp8 checkpoint) hold a
    VAE and text encoders beside the diffusion model: only the diffusion model is read,
    model.config gives the rest."""
    f = files["ltx2"]
    tensors = load_file(str(f["fp8_scaled"]))
    tensors |= {"vae.decoder.conv_in.weight": torch.zeros(4, 4, 3, 3),
                "text_embedding_projection.aggregate_embed.weight": torch.zeros(4, 4)}
    bundled = tmp_path / "ltx2_bundled.safetensors"
    save_file(tensors, str(bundled))
    fam = get_family("ltx2")
    got = fam.load(str(bundled), dtype=torch.bfloat16, config=str(f["folder"])).denoiser
    want = fam.load(str(f["fp8_scaled"]), dtype=torch.bfloat16, config=str(f["folder"])
                    ).denoiser.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in got.state_dict().items())
    assert PREFIX + "scaled_fp8" in tensors
