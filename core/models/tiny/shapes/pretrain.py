"""Train the demo's base model, `tiny:sd15-shapes`, and write weights.safetensors beside
this file. Run once by a developer; the demo only loads the result.

    .venv/bin/python -m core.models.tiny.shapes.pretrain            # ~20 min on 2 CPU cores
    .venv/bin/python -m core.models.tiny.shapes.pretrain --preview grid.png

Two phases, each from a fixed seed:
1. The autoencoder (the tiny SD1.5 VAE's architecture) learns to reconstruct the
   synthetic shapes (every shape and colour of the demo, plus random colours), so a
   decoded latent shows the shape and colour that went in.
2. The UNet learns circles and squares in red, green and blue only, conditioned on the
   tiny CLIP's embeddings of "a <colour> <shape> on a <background> background". The demo
   LoRA then teaches what the base lacks: triangles (and yellow).

The text encoder stays as built from its seed (random weights, frozen), as a real base's
text encoder is frozen during LoRA training; its weights are stored too, so the result
does not depend on torch's random number generator staying the same across versions.
Settings and seeds are recorded in the file's metadata.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WEIGHTS = Path(__file__).with_name("weights.safetensors")
BASE_COLORS = ("red", "green", "blue")
BASE_SHAPES = ("circle", "square")


@dataclass
class PretrainSettings:
    seed: int = 0
    size: int = 128
    vae_steps: int = 1500
    vae_batch: int = 16
    vae_crop: int = 64  # the VAE is convolutional: 64 px crops of 128 px images train 4x faster
    vae_lr: float = 1e-3
    unet_images: int = 3000
    unet_steps: int = 3000
    unet_batch: int = 32
    unet_lr: float = 1e-3
    empty_caption_share: float = 0.1


def shape_image(rng: random.Random, size: int, shapes: tuple[str, ...],
                colors: tuple[str, ...], random_colors: bool = False) -> tuple[Any, str]:
    """One synthetic image (PIL) and its caption, drawn as the demo dataset draws them."""
    from core.data.synthetic import BACKGROUNDS, COLORS, draw_shape

    shape = rng.choice(shapes)
    background = rng.choice(tuple(BACKGROUNDS))
    if random_colors and rng.random() < 0.5:
        color_name, rgb = "", tuple(rng.randint(0, 255) for _ in range(3))
    else:
        color_name = rng.choice(colors)
        rgb = COLORS[color_name]
    image = draw_shape(shape, rgb, BACKGROUNDS[background], size, rng)
    return image, f"a {color_name} {shape} on a {background} background"


def to_pixels(images: list[Any]) -> Any:
    """PIL images as a [-1, 1] float tensor [B, 3, H, W]."""
    import numpy as np
    import torch

    array = np.stack([np.asarray(im, dtype=np.float32) for im in images]) / 127.5 - 1.0
    return torch.from_numpy(array).permute(0, 3, 1, 2).contiguous()


def random_crops(pixels: Any, crop: int, rng: random.Random) -> Any:
    import torch

    side = pixels.shape[-1]
    out = []
    for image in pixels:
        top, left = rng.randint(0, side - crop), rng.randint(0, side - crop)
        out.append(image[:, top:top + crop, left:left + crop])
    return torch.stack(out)


def train_vae(s: PretrainSettings) -> Any:
    import torch
    import torch.nn.functional as F

    from core.models.tiny.sd15 import SD_VAE_SCALING
    from core.models.tiny.vae import tiny_vae

    torch.manual_seed(s.seed + 1)
    vae = tiny_vae(4, SD_VAE_SCALING)
    opt = torch.optim.AdamW(vae.parameters(), lr=s.vae_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, s.vae_steps, eta_min=s.vae_lr / 20)
    rng = random.Random(f"vae-{s.seed}")
    from core.data.synthetic import COLORS, SHAPES

    start = time.time()
    for step in range(1, s.vae_steps + 1):
        images = [shape_image(rng, s.size, SHAPES, tuple(COLORS), random_colors=True)[0]
                  for _ in range(s.vae_batch)]
        pixels = random_crops(to_pixels(images), s.vae_crop, rng)
        dist = vae.encode(pixels).latent_dist
        recon = vae.decode(dist.sample()).sample
        kl = dist.kl().mean() / pixels[0].numel()
        loss = F.mse_loss(recon, pixels) + 0.5 * F.l1_loss(recon, pixels) + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == 1:
            print(f"vae step {step}/{s.vae_steps} loss {loss.item():.4f} "
                  f"({time.time() - start:.0f}s)", flush=True)
    vae.eval()
    return vae


def calibrate(vae: Any, s: PretrainSettings) -> None:
    """scaling_factor = 1 / std of the latents of demo-like images, as real VAEs are set."""
    import torch

    from core.data.synthetic import COLORS, SHAPES

    rng = random.Random(f"calibrate-{s.seed}")
    images = [shape_image(rng, s.size, SHAPES, tuple(COLORS))[0] for _ in range(64)]
    with torch.no_grad():
        latents = vae.encode(to_pixels(images)).latent_dist.mean
    vae.register_to_config(scaling_factor=round(1.0 / float(latents.std()), 4))


def base_latents(vae: Any, s: PretrainSettings) -> tuple[Any, list[str]]:
    """Scaled latents and captions of the base's training images."""
    import torch

    from core.models.modules import encode_latents

    rng = random.Random(f"unet-{s.seed}")
    pairs = [shape_image(rng, s.size, BASE_SHAPES, BASE_COLORS) for _ in range(s.unet_images)]
    chunks = []
    for i in range(0, len(pairs), 64):
        pixels = to_pixels([p[0] for p in pairs[i:i + 64]])
        chunks.append(encode_latents(vae, pixels))
    return torch.cat(chunks), [p[1] for p in pairs]


def text_embeddings(text_encoder: Any, tokenizer: Any, captions: list[str]) -> dict[str, Any]:
    import torch

    unique = sorted(set(captions) | {""})
    tok = tokenizer(unique, padding="max_length", max_length=tokenizer.model_max_length,
                    truncation=True, return_tensors="pt")
    with torch.no_grad():
        embeds = text_encoder(tok.input_ids)[0]
    return {caption: embeds[i] for i, caption in enumerate(unique)}


def train_unet(s: PretrainSettings, latents: Any, captions: list[str],
               embeds: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F

    from core.models.tiny.sd15 import pndm_scheduler, tiny_unet

    torch.manual_seed(s.seed)
    unet = tiny_unet()
    scheduler = pndm_scheduler()
    alphas = scheduler.alphas_cumprod
    opt = torch.optim.AdamW(unet.parameters(), lr=s.unet_lr, weight_decay=0.01)
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return step / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (s.unet_steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(s.seed)
    caption_embeds = torch.stack([embeds[c] for c in captions])
    empty = embeds[""]
    start = time.time()
    for step in range(1, s.unet_steps + 1):
        idx = torch.randint(0, len(latents), (s.unet_batch,), generator=gen)
        x0 = latents[idx]
        cond = caption_embeds[idx].clone()
        drop = torch.rand(s.unet_batch, generator=gen) < s.empty_caption_share
        cond[drop] = empty
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, 1000, (s.unet_batch,), generator=gen)
        a = alphas[t].view(-1, 1, 1, 1)
        noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = unet(noisy, t, encoder_hidden_states=cond).sample
        loss = F.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == 1:
            print(f"unet step {step}/{s.unet_steps} loss {loss.item():.4f} "
                  f"({time.time() - start:.0f}s)", flush=True)
    unet.eval()
    return unet


def text_side(seed: int, workdir: Path) -> tuple[Any, Any]:
    """The tiny SD1.5's text encoder and tokenizer, built exactly as `tiny:sd15` builds."""
    import torch
    from transformers import CLIPTextModel

    from core.models.tiny.clip import clip_tokenizer, tiny_clip_config

    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config())
    text_encoder.eval()
    return text_encoder, clip_tokenizer(workdir / "tokenizer")


def save_weights(path: Path, parts: dict[str, Any], s: PretrainSettings,
                 seconds: float) -> None:
    """Every part's state dict under `<part>.` keys, in fp16 as checkpoints are stored,
    with the settings, the VAE's calibrated scaling and the time taken as metadata."""
    import torch
    from safetensors.torch import save_file

    tensors = {f"{name}.{k}": v.detach().to(torch.float16).contiguous()
               for name, module in parts.items() for k, v in module.state_dict().items()}
    meta = {"settings": json.dumps(asdict(s)),
            "vae_scaling_factor": str(parts["vae"].config.scaling_factor),
            "train_seconds": f"{seconds:.0f}",
            "script": "core/models/tiny/shapes/pretrain.py"}
    save_file(tensors, str(path), metadata=meta)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--vae-steps", type=int, default=PretrainSettings.vae_steps)
    parser.add_argument("--unet-steps", type=int, default=PretrainSettings.unet_steps)
    args = parser.parse_args(argv)
    s = PretrainSettings(vae_steps=args.vae_steps, unet_steps=args.unet_steps)
    start = time.time()
    vae = train_vae(s)
    calibrate(vae, s)
    print(f"vae scaling_factor {vae.config.scaling_factor}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        text_encoder, tokenizer = text_side(s.seed, Path(tmp))
        latents, captions = base_latents(vae, s)
        embeds = text_embeddings(text_encoder, tokenizer, captions)
    unet = train_unet(s, latents, captions, embeds)
    save_weights(args.out, {"vae": vae, "unet": unet, "text_encoder": text_encoder}, s,
                 time.time() - start)
    print(f"wrote {args.out} ({time.time() - start:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
