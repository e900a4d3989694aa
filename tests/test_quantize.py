"""A quantized frozen base (`model.quantize`): LoRA trains on an int8 (torchao) denoiser,
and the LoRA it saves is a normal LoRA that loads on the unquantized model; the check
refuses what this machine cannot run. CPU, tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PYTHON, REPO, small_config, train_in_process
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from core.config import Config, apply_overrides, load_config, save_config, validate_config
from core.models.quantize import quantizable, quantize_frozen, quantize_problems
from core.models.registry import get_family
from core.models.tiny import resolve_model_path
from core.presets import preset_path

TORCHAO_WEIGHT = {"int8": "Int8Tensor", "fp8": "Float8Tensor"}


@pytest.fixture(scope="module")
def folders(tiny_workspace: Path) -> dict[str, Path]:
    """The session's tiny Flux and SDXL folders (built once, shared with other modules)."""
    return {name: resolve_model_path(f"tiny:{name}", tiny_workspace) for name in ("flux", "sdxl")}


def fixed_batch(family, c) -> tuple[dict, object]:
    """Two images and captions, noised once: the same batch every step."""
    texts = family.encode_prompts(c, ["a red circle", "a blue square"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    pixels = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = family.encode_images(c, pixels.to(c.vae.dtype)).float()
    sample = family.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    return batch, sample


def train_steps(family, c, params: list, steps: int) -> list[float]:
    batch, sample = fixed_batch(family, c)
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = family.loss(c, family.predict(c, sample, batch).float(), sample)
        loss.backward()
        if len(losses) == 1:  # after one step lora_B is no longer zero: every A learns
            named = dict(c.denoiser.named_parameters())
            # Every adapter, the first layer's included, learns through the int8 layers
            # after it; no frozen weight collects a gradient.
            assert [n for n, p in named.items() if "lora_" in n and
                    (p.grad is None or not p.grad.any())] == []
            assert [n for n, p in named.items() if "lora_" not in n and p.grad is not None] == []
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def image(pipe, prompt: str = "a red circle") -> torch.Tensor:
    out = pipe(prompt, num_inference_steps=2, height=64, width=64, output_type="pt",
               generator=torch.Generator().manual_seed(0))
    return out.images[0]


@pytest.mark.parametrize("name", ["flux", "sdxl"])
def test_lora_on_int8_base_trains_and_loads_on_the_plain_model(folders, tmp_path: Path,
                                                               name: str) -> None:
    from diffusers import DiffusionPipeline
    from peft.utils import get_peft_model_state_dict

    from core.train.setup import add_trainable

    family = get_family(name)
    c = family.load(str(folders[name]), dtype=torch.bfloat16, device="cpu")
    linears = {n for n, m in c.denoiser.named_modules() if quantizable(n, m)}
    quantize_frozen(c.denoiser, "int8", "cpu")
    kinds = {type(m.weight).__name__ for n, m in c.denoiser.named_modules() if n in linears}
    assert kinds == {"Int8Tensor"}

    cfg = Config()
    cfg.train.lora_rank, cfg.train.gradient_checkpointing = 4, name == "flux"
    params = add_trainable(family, c.denoiser, cfg)
    assert params and all(p.dtype == torch.float32 and p.requires_grad for p in params)
    frozen = [p for n, p in c.denoiser.named_parameters() if "lora_" not in n]
    assert not any(p.requires_grad for p in frozen)
    losses = train_steps(family, c, params, steps=6)
    assert losses[-1] < losses[0], losses
    assert {type(m.weight).__name__ for n, m in c.denoiser.named_modules()
            if n in linears} == {"Int8Tensor"}, "training left the base quantized"

    family.save_lora(c, tmp_path / "lora")
    trained = get_peft_model_state_dict(c.denoiser)
    pipe = DiffusionPipeline.from_pretrained(str(folders[name]), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    denoiser = pipe.transformer if name == "flux" else pipe.unet
    assert not any(type(p).__name__ in TORCHAO_WEIGHT.values() for p in denoiser.parameters())
    with torch.no_grad():
        before = image(pipe)
        pipe.load_lora_weights(str(tmp_path / "lora"), adapter_name="trained")
        after = image(pipe)
    loaded = get_peft_model_state_dict(denoiser, adapter_name="trained")
    assert sorted(loaded) == sorted(trained), "missing or unexpected LoRA keys"
    for key, value in trained.items():
        torch.testing.assert_close(loaded[key].float(), value.float())
    assert (after - before).abs().max() > 1e-4


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_quantize_frozen_leaves_every_linear_quantized_on_the_device(scheme: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.LayerNorm(48),
                                torch.nn.Linear(48, 16)).to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    want = model(x)
    quantize_frozen(model, scheme, torch.device("cpu"))
    assert {type(model[i].weight).__name__ for i in (0, 2)} == {TORCHAO_WEIGHT[scheme]}
    assert type(model[1].weight) is torch.nn.Parameter  # not a Linear: left as it was
    got = model(x)
    assert (got - want).abs().max() < 0.1 * want.abs().max()  # close, not equal
    assert not torch.equal(got, want)


def test_nf4_off_cuda_and_unknown_schemes_are_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        quantize_frozen(model, "nf4", "cpu")
    with pytest.raises(ValueError, match="unknown model.quantize 'int4'"):
        quantize_frozen(model, "int4", "cpu")
    quantize_frozen(model, "none", "cpu")
    assert type(model[0].weight) is torch.nn.Parameter


def test_problems_on_a_machine_without_gpu(monkeypatch) -> None:
    from core.models import quantize

    monkeypatch.setattr(quantize, "_cuda_devices", lambda: [])  # runs on a GPU machine too
    assert quantize_problems("none") == []
    assert quantize_problems("int8") == []
    [fp8] = quantize_problems("fp8")
    assert fp8.level == "error" and fp8.where == "model.quantize"
    assert "no CUDA GPU was found" in fp8.message and '"int8"' in fp8.message
    [nf4] = quantize_problems("nf4", "x.quantize")
    assert nf4.where == "x.quantize" and nf4.level == "error"
    assert "runs only on a CUDA GPU" in nf4.message  # bitsandbytes is in requirements.txt
    monkeypatch.setattr(quantize, "_installed", lambda package: package != "bitsandbytes")
    [nf4] = quantize_problems("nf4")
    assert "pip install bitsandbytes" in nf4.message


def test_fp8_names_the_gpu_that_is_too_old(monkeypatch) -> None:
    from core.models import quantize

    monkeypatch.setattr(quantize, "_cuda_devices",
                        lambda: [("NVIDIA A100-SXM4-80GB", (8, 0))])
    [problem] = quantize_problems("fp8")
    assert "found NVIDIA A100-SXM4-80GB (compute capability 8.0)" in problem.message
    assert 'use "int8"' in problem.message
    monkeypatch.setattr(quantize, "_cuda_devices", lambda: [("NVIDIA H100", (9, 0))])
    assert quantize_problems("fp8") == []


def test_quantized_full_fine_tune_is_a_config_error() -> None:
    cfg = load_config(preset_path("flux-lora"))
    assert cfg.model.quantize == "int8"
    apply_overrides(cfg, ["train.method=full"])
    [problem] = [p for p in validate_config(cfg) if p.where == "model.quantize"]
    assert "cannot be fully fine-tuned" in problem.message
    apply_overrides(cfg, ["model.quantize=none"])
    assert not [p for p in validate_config(cfg) if p.where == "model.quantize"]


def test_flux_preset_check_has_no_quantize_problem(tmp_path: Path) -> None:
    from core.check import run_check

    cfg = apply_overrides(load_config(preset_path("flux-lora")), ["model.path=tiny:flux"])
    report = run_check(cfg, tmp_path)
    assert not [p for p in report.problems if "quantize" in p.where], report.lines()


def quantized_events(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in e.items() if k not in ("type", "time")}
            for e in events if e["type"] == "quantized"]


def assert_all_linears_quantized(event: dict, scheme: str) -> None:
    """The trainer's `quantized` event: every quantizable layer of the denoiser holds the
    scheme's torchao weight (counted from the weights, not read from the config)."""
    n = event["linear_layers"]
    assert n > 10, event  # tiny Flux has dozens of Linear layers
    assert event == {"scheme": scheme, "linear_layers": n, "quantized": n,
                     "weight_types": {TORCHAO_WEIGHT[scheme]: n}}


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_a_quantized_run_trains_on_quantized_linear_weights(tmp_path: Path, scheme: str) -> None:
    """The trainer itself (in this process) quantizes the denoiser it trains: its
    `quantized` event counts every Linear of tiny Flux as int8/fp8, and the run finishes."""
    cfg = small_config(tmp_path, images=2, family="flux")
    cfg.model.quantize = scheme
    assert_one_step_quantizes(cfg, tmp_path, scheme)


def assert_one_step_quantizes(cfg: Any, tmp_path: Path, scheme: str) -> None:
    """One bf16 step of `cfg` on the CPU, in this process: it finishes, and its
    `quantized` event counts every Linear of the denoiser in `scheme`."""
    cfg.train.mixed_precision = "bf16"
    cfg.train.max_steps, cfg.train.eval_every, cfg.train.checkpoint_every = 1, 100, 100
    cfg.validation.every, cfg.validation.prompts = 100, ["a red circle"]
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tmp_path) == 0
    [event] = quantized_events(Path(cfg.output.dir))
    assert_all_linears_quantized(event, scheme)


@pytest.mark.slow
def test_trainer_runs_on_an_int8_flux(tmp_path: Path) -> None:
    """A demo-like run on tiny Flux with an int8 base, through the CLI."""
    import subprocess

    from core.runs.status import read_status

    cfg = small_config(tmp_path, images=4, family="flux")
    cfg.model.quantize, cfg.train.mixed_precision = "int8", "bf16"
    cfg.train.max_steps = cfg.train.checkpoint_every = cfg.validation.every = 6
    cfg.train.eval_every = 1000
    save_config(cfg, tmp_path / "run.toml")
    done = subprocess.run([PYTHON, "app.py", "--no-ui", "--workspace", str(tmp_path),
                           "--config", str(tmp_path / "run.toml")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    run_dir = Path(cfg.output.dir)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert read_status(run_dir).state == "done" and read_status(run_dir).step == 6
    assert (run_dir / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run_dir / "validation/step_000006").is_dir()
    log = (run_dir / "train.log").read_text()
    assert "get_apply_tensor_subclass" not in log
    [event] = quantized_events(run_dir)
    assert_all_linears_quantized(event, "int8")
    n = event["linear_layers"]
    assert f"model.quantize int8: {n} of {n} linear layers of the denoiser quantized" in log


def storages(t: torch.Tensor) -> list[int]:
    """Where a tensor's data lives: a torchao weight's in its inner tensors."""
    if is_traceable_wrapper_subclass(t):
        return [ptr for name in t.__tensor_flatten__()[0] for ptr in storages(getattr(t, name))]
    return [t.untyped_storage().data_ptr()]


def saved_new_bytes(family, c) -> int:
    """Bytes of the tensors autograd keeps for the backward of one prediction that are
    not the model's own parameters (each storage once): activations, and the copies of
    weights made on the way."""
    own = {ptr for p in c.denoiser.parameters() for ptr in storages(p)}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not is_traceable_wrapper_subclass(t) and storages(t)[0] not in own:
            kept[storages(t)[0]] = t.untyped_storage().nbytes()
        return t

    batch, sample = fixed_batch(family, c)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = family.loss(c, family.predict(c, sample, batch).float(), sample)
    loss.backward()
    return sum(kept.values())


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_the_backward_keeps_the_dequantized_weights_the_estimate_counts(
        folders, tiny_workspace: Path, scheme: str) -> None:
    """torchao's layers multiply by a dequantized copy of their weight, and autograd
    keeps it for the backward: without gradient checkpointing one per quantized layer.
    The memory estimate's "dequantized weights" part counts them, every quantized layer's:
    an upper bound."""
    from core.config import resolved
    from core.memory.estimate import estimate_memory
    from core.train.setup import add_trainable

    family = get_family("flux")
    cfg = Config()
    cfg.model.family, cfg.model.path, cfg.model.quantize = "flux", "tiny:flux", scheme
    cfg.train.lora_rank, cfg.train.gradient_checkpointing = 4, False
    cfg.train.mixed_precision = "bf16"
    kept = {}
    for quantize in ("none", scheme):
        c = family.load(str(folders["flux"]), dtype=torch.bfloat16, device="cpu")
        quantize_frozen(c.denoiser, quantize, "cpu")
        add_trainable(family, c.denoiser, cfg)
        kept[quantize] = saved_new_bytes(family, c)
    copies = kept[scheme] - kept["none"]
    estimate = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                               caches_built=True)
    counted = next(p.bytes for p in estimate.parts if p.name == "dequantized weights")
    # Layers whose input needs no gradient keep none: the embedders before the first
    # adapter and the modulations of the time embedding (on the tiny Flux 0.42 of all).
    assert 0.3 * counted < copies <= counted, (copies, counted)
    cfg.train.gradient_checkpointing = True
    with_checkpointing = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                                         caches_built=True)
    one_block = next(p.bytes for p in with_checkpointing.parts
                     if p.name == "dequantized weights")
    assert 0 < one_block < counted / 2
    warned = [p for p in validate_config(cfg) if p.where == "train.gradient_checkpointing"]
    assert warned == []
    cfg.train.gradient_checkpointing = False
    [warning] = [p for p in validate_config(cfg) if p.where == "train.gradient_checkpointing"]
    assert warning.level == "warning" and "dequantized copy" in warning.message
