"""Benchmark: activation memory of one LoRA training step, measured with fake tensors,
against the formula `--stage check` prints (core/memory/activations.py).

    python bench/activations.py [--families sd15,sdxl,sd3,flux] [--quick] [--eval-batch N]

No GPU and no real memory: each denoiser is built from its config on the meta device
(the full-size configs of core/models/families/<family>/full_size/), given the trainer's LoRA
(rank 16 on the family's attention targets, fp32) on a frozen bf16 base, and turned into
fake tensors (torch's FakeTensorMode: shapes and dtypes, no storage). One forward, the
loss and one backward run under torch's MemTracker, which follows every storage the
step creates and frees and keeps the peak per category. The activation figure is that
peak less what the estimate counts apart (parameters, buffers, parameter gradients):
the tensors autograd keeps plus the backward's temporaries (activation gradients,
checkpoint recomputation) at the moment of the peak.

The tensors are fake CPU tensors: this torch may have no CUDA, and a fake CUDA tensor
cannot enter CUDA autocast without the CUDA runtime. `CudaAutocast` applies CUDA
autocast's casting rules instead (matmuls and convolutions in bf16; norms, softmax and
losses in fp32), which decides the dtype of every saved tensor. What this cannot see:
the caching allocator's rounding and fragmentation, cuBLAS/attention workspaces, and
kernels that save differently on CUDA than their CPU meta implementations say.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

GIB = 1024 ** 3
LORA_RANK = 16
FAMILIES = ("sd15", "sdxl", "sd3", "flux")
# The family presets' resolution and batch (presets/<family>-lora.toml), checkpointing on.
PRESETS = {"sd15": (512, 2), "sdxl": (1024, 1), "sd3": (1024, 1), "flux": (1024, 1)}
CLIP_TOKENS = 77
FLUX_T5_TOKENS = 512
SD3_T5_TOKENS = 256

# CUDA autocast's casting policy (aten/src/ATen/autocast_mode.cpp), for the ops the
# denoisers call: these run in the autocast dtype ...
_LOWER = {F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose2d,
          F.scaled_dot_product_attention, torch.matmul, torch.bmm, torch.baddbmm,
          torch.addmm, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__,
          torch.Tensor.bmm, torch.Tensor.mm}
# ... and these in float32, whatever their inputs (norms keep fp32 outputs, which the
# next op saves: the biggest difference from running everything in bf16).
_FP32 = {F.layer_norm, F.group_norm, F.softmax, F.log_softmax, F.mse_loss, torch.softmax,
         torch.Tensor.softmax, torch.layer_norm, torch.group_norm}


class CudaAutocast(TorchFunctionMode):
    """torch.autocast("cuda", bf16) for fake CPU tensors: casts the floating-point
    tensor arguments of the ops above, as autocast's dispatch key would (the casts are
    autograd-recorded copies either way)."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        target = self.dtype if func in _LOWER else torch.float32 if func in _FP32 else None
        if target is not None:
            def cast(x: Any) -> Any:
                if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != target:
                    return x.to(target)
                return x
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


# ---------------------------------------------------------------- the model


def model_folder(family: str, tiny: Path | None) -> Path:
    """A diffusers folder of configs: the full-size one, or a built tiny model."""
    from core.models.full_size import full_size_dir

    return tiny if tiny is not None else full_size_dir(family)


def denoiser_name(folder: Path) -> str:
    import json

    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    return "unet" if "unet" in index and index["unet"][0] else "transformer"


def meta_denoiser(family: str, folder: Path, checkpointing: bool) -> Any:
    """The denoiser on the meta device, prepared as core/train/setup.py add_trainable
    does: frozen, LoRA on the family's attention targets, checkpointing, train mode."""
    import json

    from accelerate import init_empty_weights
    from peft import LoraConfig

    from core.memory.model_counts import _meta_module
    from core.models.registry import get_family

    name = denoiser_name(folder)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    model = _meta_module(folder, name, index[name])
    model.requires_grad_(False)
    with init_empty_weights():
        model.add_adapter(LoraConfig(r=LORA_RANK, lora_alpha=LORA_RANK,
                                     init_lora_weights="gaussian",
                                     target_modules=get_family(family).lora_target_modules(
                                         "attention")))
    if checkpointing:
        model.enable_gradient_checkpointing(autocast_checkpoint)
    return model.train()


def autocast_checkpoint(module: Any, *args: Any, **kwargs: Any) -> Any:
    """diffusers' default checkpointing function (non-reentrant torch checkpoint), with
    the recomputation under CudaAutocast too: the real autocast state is captured by the
    checkpoint and restored for recomputation, a function mode is not."""
    from torch.utils.checkpoint import checkpoint

    def run(*a: Any, **k: Any) -> Any:
        with CudaAutocast():
            return module(*a, **k)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def fake_parameters(model: torch.nn.Module, frozen: torch.dtype) -> None:
    """Replace every meta parameter and buffer by a fake CPU tensor (call inside the
    FakeTensorMode): trainable (LoRA) in fp32, the frozen base in `frozen`."""
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is not None:
                dtype = torch.float32 if p.requires_grad else frozen
                module._parameters[key] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=dtype), requires_grad=p.requires_grad)
        for key, b in list(module._buffers.items()):
            if b is not None:
                dtype = frozen if b.is_floating_point() else b.dtype
                module._buffers[key] = torch.empty(b.shape, dtype=dtype)


# ---------------------------------------------------------------- one step


def latent_scale(folder: Path) -> int:
    """Pixels per latent: 2 per VAE level after the first (8 for every full-size VAE),
    as memory.step_shape reckons it."""
    import json

    vae = json.loads((folder / "vae" / "config.json").read_text(encoding="utf-8"))
    return 2 ** (len(vae.get("block_out_channels", (0,) * 4)) - 1)


def step_inputs(family: str, config: dict[str, Any], latent: int, batch: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, Any]]:
    """The noisy latents and the denoiser's keyword arguments, as families/<family>/family.py
    `predict` passes them (text embeddings padded to the lengths the trainer caches)."""
    b = batch
    if family in ("sd15", "sd2", "sdxl"):
        noisy = torch.randn(b, config["in_channels"], latent, latent).to(dtype)
        kwargs: dict[str, Any] = {
            "timestep": torch.randint(0, 1000, (b,)),
            "encoder_hidden_states": torch.randn(b, CLIP_TOKENS,
                                                 config["cross_attention_dim"]).to(dtype)}
        if config.get("addition_embed_type") == "text_time":  # SDXL's _unet_kwargs
            pooled = config["projection_class_embeddings_input_dim"] - 6 * config[
                "addition_time_embed_dim"]
            kwargs["added_cond_kwargs"] = {"text_embeds": torch.randn(b, pooled).to(dtype),
                                           "time_ids": torch.ones(b, 6).to(dtype)}
        return noisy, kwargs
    text = torch.randn(b, FLUX_T5_TOKENS if family == "flux" else
                       CLIP_TOKENS + SD3_T5_TOKENS, config["joint_attention_dim"]).to(dtype)
    pooled = torch.randn(b, config["pooled_projection_dim"]).to(dtype)
    if family == "sd3":
        noisy = torch.randn(b, config["in_channels"], latent, latent).to(dtype)
        return noisy, {"timestep": torch.rand(b) * 1000, "encoder_hidden_states": text,
                       "pooled_projections": pooled}
    from diffusers import FluxPipeline

    channels = config["in_channels"] // 4  # the 2x2 patches Flux packs itself
    noisy = torch.randn(b, channels, latent, latent).to(dtype)
    kwargs = {
        "hidden_states": FluxPipeline._pack_latents(noisy, b, channels, latent, latent),
        "timestep": (torch.rand(b)).to(dtype),
        "guidance": (torch.full((b,), 1.0) if config.get("guidance_embeds") else None),
        "pooled_projections": pooled, "encoder_hidden_states": text,
        "txt_ids": torch.zeros(text.shape[1], 3).to(dtype),
        "img_ids": FluxPipeline._prepare_latent_image_ids(b, latent // 2, latent // 2,
                                                          "cpu", dtype)}
    return noisy, kwargs


def forward(family: str, model: Any, latent: int, batch: int) -> torch.Tensor:
    """The denoiser's forward under (emulated) CUDA autocast, as `predict` calls it."""
    config = dict(model.config)
    noisy, kwargs = step_inputs(family, config, latent, batch, torch.bfloat16)
    with CudaAutocast():
        if family == "flux":
            return model(**kwargs, return_dict=False)[0]
        first = "sample" if "unet" in type(model).__name__.lower() else "hidden_states"
        return model(**{first: noisy}, **kwargs, return_dict=False)[0]


def train_step(family: str, model: Any, latent: int, batch: int) -> None:
    """Forward, the fp32 MSE loss, backward: what core/train/loop.py micro_step does,
    less the optimizer."""
    out = forward(family, model, latent, batch)
    loss = F.mse_loss(out.float(), torch.randn(out.shape))
    loss.backward()


def eval_step(family: str, model: Any, latent: int, batch: int) -> None:
    """A forward without gradients: what core/train/evaluation.py scores a batch with."""
    with torch.no_grad():
        forward(family, model, latent, batch)


def frozen_aware_tracker() -> Any:
    """MemTracker, which hooks every parameter's gradient and so refuses a frozen base:
    only the trainable ones are hooked (their gradients count apart, as in the
    estimate). It also walks every module's statistics after each op, which makes a
    UNet step take minutes; only the global peak is needed here."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any,
                                             install_grad_hooks: bool = True
                                             ) -> tuple[int, int]:
            sizes = super()._track_module_params_and_buffers(module, False)
            for param in module.parameters():
                if (install_grad_hooks and param.requires_grad
                        and param not in self._param_to_grad_hook_handles):
                    def hook(grad: torch.Tensor) -> None:
                        self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(hook),
                        param.register_post_accumulate_grad_hook(lambda p: hook(p.grad)))
            return sizes

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

    return Tracker()


@dataclass
class Measured:
    activations: int  # peak less parameters, buffers and parameter gradients
    peak: int  # everything MemTracker saw at the peak
    seconds: float


def measure(family: str, folder: Path, resolution: int, batch: int,
            checkpointing: bool, step: Any = train_step) -> Measured:
    """Activation peak of one LoRA training step (or `step`: eval_step) at `resolution`
    px, `batch` images."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    model = meta_denoiser(family, folder, checkpointing)
    with FakeTensorMode(allow_non_fake_inputs=False):
        fake_parameters(model, torch.bfloat16)
        tracker = frozen_aware_tracker()
        tracker.track_external(model)
        with tracker:
            step(family, model, resolution // latent_scale(folder), batch)
        snap = tracker.get_tracker_snapshot("peak")
    (device_snap,) = snap.values()
    apart = sum(device_snap.get(k, 0) for k in ("Parameter", "Buffer", "Gradient"))
    total = device_snap["Total"]
    return Measured(total - apart, total, time.perf_counter() - start)


# ---------------------------------------------------------------- the estimate


def sizes_for(family: str, folder: Path) -> Any:
    """What `--stage check` reads from the configs (LoRA rank 16 on attention)."""
    from core.memory.config_source import ConfigSource
    from core.memory.model_counts import read_sizes

    return read_sizes(ConfigSource(family, folder), LORA_RANK, "attention", True)


def estimated(family: str, sizes: Any, resolution: int, batch: int,
              checkpointing: bool) -> int:
    """The activations part of the estimate, by the estimate's own code path."""
    from core.config import Config, DatasetConfig
    from core.memory.estimate import activation_bytes, step_shape

    cfg = Config()
    cfg.model.family = family
    cfg.datasets = [DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                  resolution=resolution)]
    cfg.train.batch_size, cfg.train.mixed_precision = batch, "bf16"
    cfg.train.gradient_checkpointing = checkpointing
    return activation_bytes(sizes, step_shape(cfg, sizes))


# ---------------------------------------------------------------- the table


def cases(family: str, quick: bool) -> list[tuple[int, int, bool]]:
    """(resolution, batch, checkpointing): the preset's, then 512 and 1024 at batch 1
    and 4, with and without checkpointing."""
    out = [(*PRESETS[family], True)]
    grid = [(512, 1), (1024, 1)] if quick else [(512, 1), (512, 4), (1024, 1), (1024, 4)]
    for resolution, batch in grid:
        for checkpointing in (False, True):
            if (resolution, batch, checkpointing) not in out:
                out.append((resolution, batch, checkpointing))
    return out


def compare_eval(families: list[str], eval_batch: int) -> None:
    """The eval's forward without gradients against the training step it follows."""
    print(f"{'family':6} {'res':>5} {'train b1 ckpt':>13} {f'eval b{eval_batch}':>9}")
    for family in families:
        folder = model_folder(family, None)
        for resolution in (512, 1024):
            train = measure(family, folder, resolution, 1, True).activations
            evaluation = measure(family, folder, resolution, eval_batch, True,
                                 eval_step).activations
            print(f"{family:6} {resolution:5} {train / GIB:13.2f} {evaluation / GIB:9.2f}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--quick", action="store_true", help="batch 1 only")
    parser.add_argument("--eval-batch", type=int, default=0, metavar="N",
                        help="instead: an eval forward (no gradients) of N images beside "
                             "the training step of 1, at 512 and 1024 px")
    args = parser.parse_args()
    if args.eval_batch:
        compare_eval(args.families.split(","), args.eval_batch)
        return
    print(f"torch {torch.__version__}; fake CPU tensors, CUDA autocast rules, bf16 base, "
          f"LoRA rank {LORA_RANK} (attention)")
    print(f"{'family':6} {'res':>5} {'batch':>5} {'ckpt':>4} {'measured':>9} "
          f"{'formula':>9} {'ratio':>6} {'secs':>5}")
    ratios = []
    for family in args.families.split(","):
        folder = model_folder(family, None)
        sizes = sizes_for(family, folder)
        for resolution, batch, checkpointing in cases(family, args.quick):
            m = measure(family, folder, resolution, batch, checkpointing)
            formula = estimated(family, sizes, resolution, batch, checkpointing)
            ratios.append(formula / m.activations)
            print(f"{family:6} {resolution:5} {batch:5} {'on' if checkpointing else 'off':>4} "
                  f"{m.activations / GIB:9.2f} {formula / GIB:9.2f} "
                  f"{formula / m.activations:6.2f} {m.seconds:5.0f}", flush=True)
    print(f"formula / measured: {min(ratios):.2f} .. {max(ratios):.2f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
