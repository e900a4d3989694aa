"""The per-GPU memory estimate `--stage check` prints: exact weight, LoRA and optimizer
bytes from meta-device models (compared with the real tiny models, loaded), the check's
`memory:` line, no side effects on the workspace, and the full-size Flux figures it
estimates against a 24 GB card (an estimate: bench/gpu_memory.py measures on a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import REPO, check_in_process, per_gpu_gib, write_shapes

from core.config import Config, DatasetConfig, apply_overrides, load_config, resolved, save_config
from core.memory.activations import StepShape, mmdit_activation_bytes, unet_activation_bytes
from core.memory.estimate import GIB, MemoryEstimate, MemoryPart, estimate_memory
from core.models.adapters import adapter_config
from core.models.full_size import full_size_dir
from core.models.registry import get_family
from core.models.tiny import materialize_tiny
from core.presets import preset_path

MEMORY_LINE = re.compile(r"^memory: [0-9.]+ GiB")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with the tiny sd15, flux and flux2 models built once."""
    ws = tmp_path_factory.mktemp("memory-ws")
    for family in ("sd15", "flux", "flux2"):
        materialize_tiny(family, ws)
    return ws


def part(parts: list[MemoryPart], name: str) -> int:
    return next(p.bytes for p in parts if p.name == name)


def stored_bytes(module: torch.nn.Module, per_weight: int) -> int:
    """What a loaded module holds: floating tensors at `per_weight`, others as they are."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * (per_weight if t.is_floating_point() else t.element_size())
               for t in tensors)


def tiny_config(family: str, **train: object) -> Config:
    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    cfg.datasets = [DatasetConfig(id="a", images="data/a", vae_cache="cache/a", resolution=64)]
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


# ---------------------------------------------------------------- exact parts


@pytest.mark.parametrize("precision,per_weight", [("no", 4), ("bf16", 2)])
def test_tiny_sd15_frozen_weights_are_the_loaded_models_bytes(workspace: Path, precision: str,
                                                              per_weight: int) -> None:
    cfg = load_config(preset_path("demo"))
    cfg.train.mixed_precision = precision
    estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    assert estimate is not None and estimate.unknown is None
    # The demo's base (its tokenizer has the demo's words, so its text encoder is larger).
    c = get_family("sd15").load(str(materialize_tiny("sd15-shapes", workspace)))
    unet_params = sum(p.numel() for p in c.denoiser.parameters())
    assert list(c.denoiser.buffers()) == []  # so the frozen part is parameters alone
    assert part(estimate.parts, "frozen weights") == unet_params * per_weight
    assert part(estimate.caching, "text encoders") == stored_bytes(c.text_encoders[0],
                                                                   per_weight)
    assert part(estimate.caching, "VAE") == stored_bytes(c.vae, per_weight)
    assert estimate.total_bytes < GIB  # the demo fits anywhere
    assert estimate.training_bytes - part(estimate.parts, "CUDA context") < 64 * 1024 ** 2


@pytest.mark.parametrize("family,scope,kind", [
    ("sd15", "all", "lora"), ("flux", "attention", "lora"), ("flux2", "attention", "lora"),
    ("flux2", "all", "lora"),
    # train.lora_kind: convolutions (sd15) and linears (flux2) of each kind.
    *[(f, "all", k) for f in ("sd15", "flux2") for k in ("dora", "lokr", "loha")]])
def test_lora_trainable_count_equals_peft_on_the_real_tiny_model(workspace: Path, family: str,
                                                                 scope: str, kind: str) -> None:
    from peft import LoraConfig

    cfg = tiny_config(family, lora_rank=8, lora_targets=scope, optimizer="adamw", ema=True,
                      lora_kind=kind)
    estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    fam = get_family(family)
    denoiser = fam.load(str(workspace / "models" / f"tiny-{family}")).denoiser
    denoiser.requires_grad_(False)
    targets = fam.lora_target_modules(scope)
    # What the trainer adds (core/train/setup.py: the kind's peft config).
    denoiser.add_adapter(adapter_config(kind, 8, 8, targets))
    trainable = sum(p.numel() for p in denoiser.parameters() if p.requires_grad)
    assert trainable > 0
    lora = get_family(family).load(str(workspace / "models" / f"tiny-{family}")).denoiser
    lora.add_adapter(LoraConfig(r=8, lora_alpha=8, target_modules=targets))
    lora_count = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    assert (trainable == lora_count) == (kind == "lora")  # each kind counts differently
    assert part(estimate.parts, "trainable") == trainable * 4
    assert part(estimate.parts, "gradients") == trainable * 4
    assert part(estimate.parts, "optimizer") == trainable * 8
    assert part(estimate.parts, "EMA") == trainable * 4


def test_int8_stores_quantizable_weights_in_a_byte_plus_a_scale_per_row(workspace: Path) -> None:
    from core.models.quantize import quantizable

    none = tiny_config("flux", mixed_precision="bf16")
    int8 = tiny_config("flux", mixed_precision="bf16")
    int8.model.quantize = "int8"
    frozen = {name: part(estimate_memory(resolved(c, workspace), workspace,
                                         caches_built=False).parts, "frozen weights")
              for name, c in (("none", none), ("int8", int8))}
    denoiser = get_family("flux").load(str(workspace / "models" / "tiny-flux")).denoiser
    weights = [m.weight for n, m in denoiser.named_modules() if quantizable(n, m)]
    assert weights
    saved = sum(w.numel() * (2 - 1) - w.shape[0] * 2 for w in weights)
    assert frozen["none"] - frozen["int8"] == saved


def test_full_fine_tune_trains_the_whole_denoiser_in_fp32(workspace: Path) -> None:
    cfg = tiny_config("sd15", method="full", mixed_precision="bf16", optimizer="adamw8bit")
    estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    unet = get_family("sd15").load(str(workspace / "models" / "tiny-sd15")).denoiser
    params = sum(p.numel() for p in unet.parameters())
    assert part(estimate.parts, "frozen weights") == 0
    assert part(estimate.parts, "trainable") == params * 4
    assert part(estimate.parts, "optimizer") == params * 2


def test_single_file_counts_the_tensors_in_its_header(workspace: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import save_file

    import core.models.full_size as full_size

    # The architecture (LoRA, activations, the parts the file lacks): the tiny sd15.
    monkeypatch.setattr(full_size, "full_size_dir", lambda f: workspace / "models" / f"tiny-{f}")
    path = tmp_path / "model.safetensors"
    save_file({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(320, 4, 3, 3),
               "model.diffusion_model.out.2.weight": torch.zeros(4, 320, 3, 3),
               "cond_stage_model.transformer.text_model.final_layer_norm.weight":
                   torch.zeros(768)}, str(path))
    cfg = tiny_config("sd15", mixed_precision="fp16")
    cfg.model.path = str(path)
    estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    assert estimate.unknown is None
    assert part(estimate.parts, "frozen weights") == (320 * 4 * 9 + 4 * 320 * 9) * 2
    assert part(estimate.caching, "text encoders") == 768 * 2
    # The demo's base (its tokenizer has the demo's words, so its text encoder is larger).
    c = get_family("sd15").load(str(materialize_tiny("sd15-shapes", workspace)))
    assert part(estimate.caching, "VAE") == stored_bytes(c.vae, 4)  # fp16 VAE upcasts


# ---------------------------------------------------------------- the check and the workspace


def test_check_prints_the_memory_line_and_leaves_an_unbuilt_workspace_alone(
        tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write_shapes(ws / "data/a", 3)
    cfg = tiny_config("sd15")
    cfg.output.dir = "runs/x"
    save_config(cfg, tmp_path / "run.toml")
    before = tree(ws)
    done = check_in_process("--config", str(tmp_path / "run.toml"), "--workspace", str(ws))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in done.stdout.splitlines() if MEMORY_LINE.match(line)], done.stdout
    assert tree(ws) == before  # the tiny model was built elsewhere, and removed


def test_unbuilt_tiny_model_estimate_creates_nothing_in_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    before = tree(ws)
    estimate = estimate_memory(resolved(tiny_config("sd3"), ws), ws, caches_built=False)
    assert estimate.unknown is None and estimate.total_bytes > 0
    assert tree(ws) == before


def test_hub_model_not_in_the_cache_is_unknown_not_a_guess(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    cfg = tiny_config("flux")
    cfg.model.path = "nobody/not-a-cached-model"
    estimate = estimate_memory(resolved(cfg, tmp_path), tmp_path, caches_built=False)
    assert estimate.parts == [] and estimate.lines()[0].startswith("memory: unknown (")
    assert "not in the HF cache" in estimate.lines()[0]


def test_an_invalid_key_is_named_and_the_estimate_is_left_out(workspace: Path,
                                                             tmp_path: Path) -> None:
    """train.lora_rank = 0 is the check's error; the estimate must not add a second,
    cryptic one from building a LoRA of rank 0."""
    from core.check import run_check
    from core.problems import errors

    write_shapes(tmp_path / "a", 2)
    cfg = tiny_config("sd15", lora_rank=0)
    cfg.datasets[0].images = str(tmp_path / "a")
    report = run_check(cfg, workspace)
    assert [p.where for p in errors(report.problems)] == ["train.lora_rank"]
    assert not [line for line in report.lines() if line.startswith("memory")], report.lines()
    # the UI's call too
    assert estimate_memory(resolved(cfg, workspace), workspace, caches_built=False) is None


@pytest.mark.parametrize("resolution, size, trains_at", [
    (72, (72, 72), "64x64"),  # 72 rounds down to the 64 px bucket
    (128, (128, 64), "256x64"),  # 2:1 images go to the 4:1 bucket, not 128x128
])
def test_activations_are_estimated_at_the_bucket_the_run_trains_at(
        workspace: Path, tmp_path: Path, resolution: int, size: tuple[int, int],
        trains_at: str) -> None:
    from core.check import run_check

    write_shapes(tmp_path / "a", 2, size=size)
    cfg = tiny_config("sd15")
    cfg.datasets[0].images, cfg.datasets[0].resolution = str(tmp_path / "a"), resolution
    report = run_check(cfg, workspace)
    assert [ds.buckets for ds in report.datasets] == [[tuple(map(int, trains_at.split("x")))] * 2]
    line = next(line for line in report.lines() if MEMORY_LINE.match(line))
    assert f"activations estimated from {trains_at}," in line, line
    if resolution == 72:  # the same figures as a dataset at 64
        at_64 = tiny_config("sd15")
        assert estimate_memory(resolved(at_64, workspace), workspace, caches_built=False).parts == \
            report.memory.parts


# ---------------------------------------------------------------- the lines


def test_lines_name_the_dominant_phase_and_warn_above_the_gpu() -> None:
    estimate = MemoryEstimate(parts=[MemoryPart("frozen weights", 3 * GIB),
                                     MemoryPart("activations", GIB, exact=False)],
                              caching=[MemoryPart("text encoders", 9 * GIB)],
                              shape="512x512, batch 1, gradient checkpointing on",
                              advice=['model.quantize = "int8"'])
    lines = estimate.lines()
    assert lines[0].startswith("memory: 9.0 GiB per GPU") and "caches dominates" in lines[0]
    assert "activations ~1.0 GiB" in lines[1] and "512x512" in lines[1]
    assert not any(line.startswith("warning") for line in lines)  # no GPU detected
    estimate.device_total_bytes, estimate.device_name = 8 * GIB, "Small GPU"
    warning = estimate.lines()[-1]
    assert warning.startswith("warning: memory:") and "Small GPU" in warning
    assert 'model.quantize = "int8"' in warning


def test_a_validation_phase_that_dominates_leads_and_asks_for_a_lower_resolution() -> None:
    estimate = MemoryEstimate(parts=[MemoryPart("frozen weights", 3 * GIB)],
                              caching=[MemoryPart("text encoders", 2 * GIB)],
                              validation=[MemoryPart("frozen weights", 3 * GIB),
                                          MemoryPart("sampling and decode", GIB, exact=False)],
                              shape="512x512, batch 1, gradient checkpointing on",
                              validation_shape="validation images 1024x1024")
    lines = estimate.lines()
    assert lines[0].startswith("memory: 4.0 GiB per GPU (estimate; validation dominates)")
    assert "sampling and decode ~1.0 GiB" in lines[0] and "1024x1024" in lines[0]
    assert lines[1].startswith("  training: 3.0 GiB") and "512x512" in lines[1]
    assert lines[2].startswith("  building caches first: 2.0 GiB")


def test_checkpointing_and_resolution_move_the_activation_estimate() -> None:
    unet = {"block_out_channels": [320, 640, 1280, 1280],
            "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
            "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3}
    mmdit = {"num_attention_heads": 24, "attention_head_dim": 128, "num_layers": 19,
             "num_single_layers": 38}
    for estimate in (lambda s: unet_activation_bytes(unet, s),
                     lambda s: mmdit_activation_bytes(mmdit, s, 512, 2)):
        plain = estimate(StepShape(64, 64, 1, 2, checkpointing=False))
        checkpointed = estimate(StepShape(64, 64, 1, 2, checkpointing=True))
        larger = estimate(StepShape(128, 128, 1, 2, checkpointing=True))
        assert checkpointed < plain / 4
        assert larger > 2 * checkpointed
        assert estimate(StepShape(64, 64, 2, 2, checkpointing=False)) == 2 * plain


# ---------------------------------------------------------------- full size


def flux_estimate(quantize: str) -> MemoryEstimate:
    cfg = apply_overrides(load_config(preset_path("flux-lora")), [
        "model.path=random:flux", f"model.quantize={quantize}", "datasets.0.resolution=512",
        "train.batch_size=1", "train.gradient_checkpointing=true",
        "train.mixed_precision=bf16"])
    estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=False)
    assert estimate is not None and estimate.unknown is None, estimate
    return estimate


def test_flux_dev_estimate_exceeds_24gb_unless_quantized() -> None:
    """The estimate's figures, not a measurement (bench/gpu_memory.py measures on a GPU)."""
    none, int8 = flux_estimate("none"), flux_estimate("int8")
    frozen = part(none.parts, "frozen weights")
    assert 11.8e9 * 2 < frozen < 12.0e9 * 2  # FLUX.1-dev's 11.9 B parameters in bf16
    assert none.total_bytes > 22 * GIB
    assert int8.total_bytes < 16 * GIB
    assert part(int8.parts, "trainable") == part(none.parts, "trainable")


def test_kontext_counts_the_control_tokens_and_its_preset_fits_24gb() -> None:
    """FLUX.1 Kontext joins the control image's tokens to the target's: the same model and
    step as FLUX.1 with twice the image tokens, and its preset (int8, 1024 px) under 24 GiB."""
    shape = StepShape(128, 128, 1, 2, checkpointing=True)
    kontext_shape = StepShape(128, 128, 1, 2, checkpointing=True, image_sequences=2)
    config = {"num_attention_heads": 24, "attention_head_dim": 128, "num_layers": 19,
              "num_single_layers": 38}
    one = mmdit_activation_bytes(config, shape, 512, 2)
    two = mmdit_activation_bytes(config, kontext_shape, 512, 2)
    # 4096 image tokens + 512 text, then 8192 + 512: the activations grow by that ratio.
    assert two / one == pytest.approx((8192 + 512) / (4096 + 512), rel=1e-6)

    cfg = apply_overrides(load_config(preset_path("flux-kontext-lora")),
                          ["model.path=random:flux_kontext"])
    estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=False)
    assert estimate is not None and estimate.unknown is None, estimate
    assert "1024x1024 + 1 control image" in estimate.shape
    assert 12 * GIB < estimate.total_bytes < 22 * GIB


def test_qwen_image_edit_preset_fits_24gb_at_its_resolution_and_says_what_does_not() -> None:
    """The preset's opening comment: int8 fits under 23 GiB at its 576 px, 640 px
    under 24, 1024 px does not."""
    def gib(resolution: int) -> float:
        cfg = apply_overrides(load_config(preset_path("qwen-image-edit-lora")), [
            "model.path=random:qwen_image_edit", f"datasets.0.resolution={resolution}"])
        estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=False)
        assert estimate is not None and estimate.unknown is None, estimate
        return estimate.total_bytes / GIB

    assert 22.0 < gib(576) < 23.0 < gib(640) < gib(768) < 24.0 < gib(1024)


# Validation rounds measured on an H200 (docs/memory.md, bench/gpu_memory.py): preset,
# family, the run's and the validation's resolution, model.quantize, GiB of allocated
# tensors during the round. The estimate less its CUDA context must cover each, by little.
H200_VALIDATION = [("sdxl-lora", "sdxl", 1024, "none", 7.73),
                   ("flux-lora", "flux", 512, "int8", 12.43),
                   ("chroma-lora", "chroma", 1024, "none", 19.69),
                   ("z-image-lora", "z_image", 1024, "none", 14.36)]


@pytest.mark.parametrize(("preset", "family", "side", "quantize", "measured"), H200_VALIDATION,
                         ids=[case[1] for case in H200_VALIDATION])
def test_the_validation_phase_covers_the_validation_rounds_measured_on_an_h200(
        preset: str, family: str, side: int, quantize: str, measured: float) -> None:
    cfg = apply_overrides(load_config(preset_path(preset)), [
        f"model.path=random:{family}", f"model.quantize={quantize}",
        f"datasets.0.resolution={side}", f"validation.resolution={side}"])
    estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=True)
    assert estimate is not None and estimate.unknown is None, estimate
    names = [p.name for p in estimate.validation]
    assert "activations" not in names and "gradients" not in names  # between steps
    assert "VAE" in names  # it comes to the GPU to decode
    tensors = (estimate.validation_bytes - part(estimate.validation, "CUDA context")) / GIB
    assert measured <= tensors <= measured + 0.5, estimate.lines()
    assert estimate.total_bytes >= estimate.validation_bytes


def test_the_configs_are_read_once_until_they_change(tmp_path: Path, monkeypatch) -> None:
    """A form edit of the resolution estimates again without building the model on the
    meta device again; an edited config.json is read afresh."""
    import shutil

    from core.memory import model_counts as memory_model

    monkeypatch.setenv("DT_CACHE_DIR", str(tmp_path / "cache"))  # this test's own
    built = []
    real = memory_model._meta_module
    monkeypatch.setattr(memory_model, "_meta_module",
                        lambda *args: built.append(args[1]) or real(*args))
    folder = tmp_path / "flux2"
    shutil.copytree(full_size_dir("flux2"), folder)
    cfg = apply_overrides(load_config(preset_path("flux2-lora")), [f"model.path={folder}"])

    def estimate(resolution: int) -> int:
        cfg.datasets[0].resolution = resolution
        found = estimate_memory(resolved(cfg, tmp_path), tmp_path, caches_built=True)
        assert found is not None and found.unknown is None, found
        return part(found.parts, "activations")

    small = estimate(512)
    reads = len(built)
    assert reads >= 3  # the transformer, the VAE and the text encoder
    assert estimate(1024) > small and len(built) == reads
    config = folder / "transformer/config.json"
    config.write_text(config.read_text(encoding="utf-8").replace(
        '"num_layers": 5', '"num_layers": 6'), encoding="utf-8")
    estimate(1024)
    assert len(built) == 2 * reads
    memory_model._read_sizes.cache_clear()  # as a new process: the disk has the sizes
    estimate(512)
    assert len(built) == 2 * reads, "a new process reads the sizes from the disk"
    assert len(list((tmp_path / "cache/memory-sizes").glob("*.json"))) == 2


def test_an_unbuilt_tiny_models_sizes_are_kept_without_building_it_again(
        tmp_path: Path, monkeypatch) -> None:
    """A new person's page estimates the demo before its tiny model is built: the sizes
    counted then are kept under the model's name, so the next estimate (every page
    open, every form fill) neither builds the model in a temporary folder nor counts."""
    from core.memory import model_counts as memory_model

    monkeypatch.setenv("DT_CACHE_DIR", str(tmp_path / "cache"))
    built = []
    real = memory_model._meta_module
    monkeypatch.setattr(memory_model, "_meta_module",
                        lambda *args: built.append(args[1]) or real(*args))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    cfg = load_config(preset_path("demo"))
    first = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    reads = len(built)
    assert first is not None and first.unknown is None and reads >= 3
    memory_model._read_sizes.cache_clear()  # as a new process would
    again = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
    assert len(built) == reads, "read from the disk, not counted again"
    assert again is not None and again.lines() == first.lines()
    assert not (workspace / "models").exists(), "the estimate builds nothing in the workspace"


@pytest.mark.slow  # two `app.py --stage check` processes
def test_a_second_check_in_a_new_process_imports_no_diffusers(workspace: Path,
                                                            tmp_path: Path) -> None:
    """The check's estimate builds meta-device models once per state of the configs;
    a later `--stage check` (each headless run starts with one) reads the sizes from
    the disk cache instead of importing diffusers and transformers (seconds of CPU)."""
    import os
    import subprocess
    import sys
    from importlib import metadata

    write_shapes(workspace / "data/a", 2)
    cfg = tiny_config("sd15")
    path = tmp_path / "run.toml"
    save_config(cfg, path)
    env = {**os.environ, "DT_CACHE_DIR": str(tmp_path / "cache")}

    def check() -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", str(REPO / "app.py"), "--no-ui",
             "--config", str(path), "--stage", "check", "--workspace", str(workspace)],
            capture_output=True, text=True, env=env, timeout=300)
        line = next((x for x in done.stdout.splitlines() if MEMORY_LINE.match(x)), "")
        imported = {x.rsplit("|", 1)[-1].strip() for x in done.stderr.splitlines()}
        assert line, done.stdout[-2000:] + done.stderr[-2000:]
        return line, " ".join(sorted({"diffusers", "torch"} & imported))

    first, second = check(), check()
    assert first[1].startswith("diffusers"), "the first check builds the models"
    # A CPU-only torch says so in its version: no import only to ask for CUDA.
    cpu_build = metadata.version("torch").endswith("+cpu")
    assert second == (first[0], "" if cpu_build else "torch"), \
        "the second reads what the first counted"


def test_the_validation_phase_grows_with_its_resolution_and_goes_without_prompts() -> None:
    def validation(*overrides: str) -> MemoryEstimate:
        cfg = apply_overrides(load_config(preset_path("chroma-lora")),
                              ["model.path=random:chroma", *overrides])
        estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=True)
        assert estimate is not None
        return estimate

    small, large = validation("validation.resolution=512"), validation(
        "validation.resolution=1024")
    decode = [part(e.validation, "sampling and decode") for e in (small, large)]
    assert decode[1] == 4 * decode[0]
    assert large.dominant == "validation" and "a lower validation.resolution" in large.advice
    assert small.dominant == "training"
    assert "a lower validation.resolution" not in small.advice
    silent = validation("validation.prompts=[]")
    assert silent.validation == [] and silent.total_bytes == silent.training_bytes


# ---------------------------------------------------------------- activation calibration


@pytest.mark.slow
def test_activation_formula_matches_a_fake_tensor_measurement_of_full_size_sd15() -> None:
    """The calibration of core/memory/activations.py, pinned on its cheapest case: full-size
    SD1.5 at 512 px, batch 1, no checkpointing (fake tensors: seconds, no memory). The
    formula errs high, by at most the 20% it achieved over all families
    (bench/activations.py)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_activations",
                                                  REPO / "bench" / "activations.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass looks its module up there
    spec.loader.exec_module(bench)
    folder = full_size_dir("sd15")
    measured = bench.measure("sd15", folder, 512, 1, checkpointing=False).activations
    formula = bench.estimated("sd15", bench.sizes_for("sd15", folder), 512, 1, False)
    assert 0.98 * measured <= formula <= 1.2 * measured


def test_without_a_gpu_the_line_leads_with_the_ram_of_a_cpu_run(
        workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine the UI runs on has no GPU (forced, so a GPU box checks it too): the
    run goes on its CPU, so the first line is RAM without a CUDA context; the per-GPU
    figure follows for whoever plans a GPU run."""
    import core.memory.estimate as memory

    monkeypatch.setattr(memory, "cuda_available", lambda: False)
    cfg = resolved(load_config(preset_path("demo")), workspace)
    lines = estimate_memory(cfg, workspace, caches_built=False).lines()
    assert MEMORY_LINE.match(lines[0]) and "GiB of RAM" in lines[0], lines
    assert "no GPU" in lines[0] and "CUDA context" not in lines[0], lines
    assert "per GPU" not in lines[0]
    assert lines[1].startswith("  on a GPU: ") and "per GPU" in lines[1], lines


# The shipped presets of the large families on their real sizes (random:<family> reads the
# shipped configs and builds nothing): (preset, family, per-GPU GiB bounds, the frozen
# weights the line names). Estimates, not measurements: bench/gpu_memory.py measures.
PRESET_ESTIMATES = [
    ("chroma-lora", "chroma", (18, 21), "16.6"),  # 8.9 B parameters in bf16, 1024 px
    # int8 20 B base, 1024 px: validation is the peak (24.2; an H200 held 23.8 + context)
    ("qwen-image-lora", "qwen_image", (18, 25), "19.0"),
    ("flux2-lora", "flux2", (6, 22), None),
    ("z-image-lora", "z_image", (12, 22), "11.5"),  # bf16, unquantized, 1024 px
    # Wan 2.1 T2V 1.3B in bf16, 33 frames at 480 px: caching (UMT5-XXL) is the peak
    ("wan-lora", "wan", (10, 22), "2.6"),
]


@pytest.mark.parametrize(("preset", "family", "bounds", "frozen"), PRESET_ESTIMATES,
                         ids=[p[1] for p in PRESET_ESTIMATES])
def test_preset_check_passes_and_its_estimate_fits_a_24gb_card(
        tmp_path: Path, preset: str, family: str, bounds: tuple[int, int],
        frozen: str | None) -> None:
    write_shapes(tmp_path / "data/mydata", 2)
    done = check_in_process("--preset", preset, "--workspace", str(tmp_path),
                            "--set", f"model.path=random:{family}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("memory: "))
    assert bounds[0] < per_gpu_gib(done.stdout) < bounds[1], line
    if frozen is not None:
        assert f"frozen weights {frozen} GiB" in line



def test_frames_multiply_a_video_familys_activations_not_a_still_familys(tmp_path: Path) -> None:
    """33 frames are 9 latent frames: the transformer's image tokens grow 9-fold from 1
    frame, its 512 text tokens do not (at 448 px: 784 image tokens a frame), so the
    activations grow between 5 and 9-fold; a still-image family ignores frames."""
    from core.config import load_config
    from core.memory.estimate import estimate_memory
    from core.presets import preset_path

    def activations(preset: str, frames: int) -> int:
        cfg = load_config(preset_path(preset))
        cfg.model.path = f"random:{cfg.model.family}"
        cfg.datasets[0].frames = frames
        cfg.launch.cpu = True
        parts = estimate_memory(cfg, tmp_path, caches_built=True).parts
        return next(p.bytes for p in parts if p.name == "activations")

    one, many = activations("wan-lora", 1), activations("wan-lora", 33)
    assert 5 < many / one < 9
    assert activations("z-image-lora", 1) == activations("z-image-lora", 33)


def test_wan22_ti2v_latents_are_16x_smaller_per_side(tiny_workspace: Path) -> None:
    """TI2V-5B's VAE makes a latent of 16x16 pixels, Wan 2.1's of 8x8: at 1024 px the
    same transformer sees 1,024 image tokens, not 4,096, beside the 512 text tokens."""
    from core.config import load_config
    from core.memory.estimate import estimate_memory
    from core.presets import preset_path

    def activations(path: str) -> int:
        cfg = load_config(preset_path("wan-lora"))
        cfg.model.path, cfg.launch.cpu = path, True
        cfg.datasets[0].resolution, cfg.datasets[0].frames = 1024, 1
        estimate = estimate_memory(cfg, tiny_workspace, caches_built=True)
        return next(p.bytes for p in estimate.parts if p.name == "activations")

    ratio = activations("tiny:wan_ti2v") / activations("tiny:wan")
    assert ratio == pytest.approx((1024 + 512) / (4096 + 512), rel=0.02)


def test_a_two_expert_model_loads_both_and_trains_what_model_experts_says(
        tmp_path: Path, tiny_workspace: Path) -> None:
    """Wan 2.2 A14B keeps both experts loaded: twice one expert's frozen weights; "both"
    trains a LoRA on each, "high_noise" on one."""
    from core.config import load_config
    from core.memory.estimate import estimate_memory
    from core.presets import preset_path

    def parts(path: str, experts: str) -> dict[str, int]:
        cfg = load_config(preset_path("wan-lora"))
        cfg.model.path, cfg.model.experts, cfg.launch.cpu = path, experts, True
        estimate = estimate_memory(cfg, tiny_workspace, caches_built=True)
        return {p.name: p.bytes for p in estimate.parts}

    one, both, high = (parts("tiny:wan", "both"), parts("tiny:wan22", "both"),
                       parts("tiny:wan22", "high_noise"))
    assert both["frozen weights"] == 2 * one["frozen weights"] == high["frozen weights"]
    assert both["trainable"] == 2 * one["trainable"] == 2 * high["trainable"]


def test_a_family_states_what_the_estimate_reads_in_family_memory() -> None:
    """The estimate reads family.memory (a MemorySpec) alone: a family that still sets
    one of the members it replaced would be read by nothing, and its estimate would
    quietly lose its packing or layout (a family folder merged after the move)."""
    from core.models.registry import families

    replaced = ("extra_text_tokens", "latent_packing", "activation_layout",
                "extra_stream_bytes")
    stray = [f"{family.name}.{name}" for family in families() for name in replaced
             if hasattr(family, name)]
    assert not stray, "set these in memory = MemorySpec(...): " + ", ".join(stray)


@pytest.mark.parametrize("family", ["flux3", "anima"])
def test_a_modular_only_folder_is_estimated(tiny_workspace: Path, family: str) -> None:
    """A model diffusers ships as modular pipelines only has modular_model_index.json,
    not model_index.json: its folder is estimated from that index (its entries add where
    each part was saved), as the random: configs are."""
    from core.models.tiny import materialize_tiny

    folder = materialize_tiny(family, tiny_workspace)
    assert (folder / "modular_model_index.json").is_file()
    assert not (folder / "model_index.json").is_file()
    cfg = Config()
    cfg.model.family, cfg.model.path = family, str(folder)
    estimate = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                               caches_built=True)
    assert estimate is not None
    assert {p.name: p.bytes for p in estimate.parts}["frozen weights"] > 0
