"""Train the demo's base model, `tiny:sd15-shapes`, and write weights.safetensors beside
this file. Run once by a developer; the demo only loads the result.

    .venv/bin/python -m core.models.families.sd15.shapes.pretrain   # ~20 min on 2 CPU cores
    .venv/bin/python -m core.models.families.sd15.shapes.pretrain --preview grid.png

Two phases, each from a fixed seed:
1. The autoencoder (the tiny SD1.5 VAE's architecture) learns to reconstruct the
   synthetic shapes (every shape, colour and background of the demo), so a decoded
   latent shows the shape and colour that went in. Four latent channels per 8x8 patch
   are too few for arbitrary colour pairs at this size, and the demo needs only its own.
2. The UNet learns circles and squares in red, green and blue only, conditioned on the
   tiny CLIP's embeddings of "a <colour> <shape> on a <background> background". The demo
   LoRA then teaches what the base lacks: triangles (and yellow). It trains with
   v-prediction on SD1.5's betas rescaled to zero terminal SNR (shapes.zero_snr_scheduler):
   on SD's own schedule it read the colour off the starting noise and drew the colour the
   seed suggested, whatever the prompt said.

The text encoder (the tiny CLIP, from its seed) trains with the UNet, on each caption
and on its short form without the background, as prompts usually are; the demo's LoRA
then leaves it frozen, as LoRA training leaves a real base's. Settings and seeds are
recorded in the file's metadata.
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
    vae_steps: int = 1200
    vae_batch: int = 8
    vae_crop: int = 64  # the VAE is convolutional: 64 px crops of 128 px images train 4x faster
    vae_lr: float = 1e-3
    vae_norm_groups: int = 2
    unet_images: int = 3000
    unet_steps: int = 3000
    unet_batch: int = 16
    unet_lr: float = 1e-3
    empty_caption_share: float = 0.1
    min_snr_gamma: float = 5.0
    noise_offset: float = 0.0  # zero terminal SNR does what offset noise did, properly
    schedule: str = "zero-snr v-prediction"  # shapes.zero_snr_scheduler


def shape_image(rng: random.Random, size: int, shapes: tuple[str, ...],
                colors: tuple[str, ...]) -> tuple[Any, str]:
    """One synthetic image (PIL) and its caption, drawn as the demo dataset draws them."""
    from core.data.synthetic import BACKGROUNDS, COLORS, draw_shape

    shape = rng.choice(shapes)
    background = rng.choice(tuple(BACKGROUNDS))
    color_name = rng.choice(colors)
    image = draw_shape(shape, COLORS[color_name], BACKGROUNDS[background], size, rng)
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

    from core.models.tiny.unet import SD_VAE_SCALING
    from core.models.tiny.vae import tiny_vae

    torch.manual_seed(s.seed + 1)
    vae = tiny_vae(4, SD_VAE_SCALING, norm_groups=s.vae_norm_groups)
    # Start with a near-zero posterior spread: at the default (std 1) the sampled latent
    # drowns the colours and the decoder learns one average colour for every shape.
    with torch.no_grad():
        vae.quant_conv.weight[4:].zero_()
        vae.quant_conv.bias[4:].fill_(-8.0)
    opt = torch.optim.AdamW(vae.parameters(), lr=s.vae_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, s.vae_steps, eta_min=s.vae_lr / 20)
    rng = random.Random(f"vae-{s.seed}")
    from core.data.synthetic import COLORS, SHAPES

    start = time.time()
    for step in range(1, s.vae_steps + 1):
        images = [shape_image(rng, s.size, SHAPES, tuple(COLORS))[0]
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
        _log_step("vae", step, s.vae_steps, loss, start)
    vae.eval()
    return vae


def calibrate(vae: Any, s: PretrainSettings) -> None:
    """Give every latent channel mean 0 and spread 1 on demo-like images, by rescaling
    the 1x1 convolutions around the latent (an exact reparametrisation: decoding is
    unchanged), then set scaling_factor as real VAEs are set (1 / std, about 1 here).

    Without it the channels that carry colour have a fifth of the spread of the others,
    noise erases them first, and the UNet learns shapes but not the prompted colours.
    """
    import torch

    from core.data.synthetic import COLORS, SHAPES

    rng = random.Random(f"calibrate-{s.seed}")
    images = [shape_image(rng, s.size, SHAPES, tuple(COLORS))[0] for _ in range(64)]
    with torch.no_grad():
        latents = vae.encode(to_pixels(images)).latent_dist.mean
        mean, std = latents.mean(dim=(0, 2, 3)), latents.std(dim=(0, 2, 3))
        channels = len(mean)
        q, pq = vae.quant_conv, vae.post_quant_conv
        q.weight[:channels] /= std.view(-1, 1, 1, 1)
        q.bias[:channels] = (q.bias[:channels] - mean) / std
        q.bias[channels:] -= 2 * std.log()  # log-variance of the rescaled latent
        pq.bias += (pq.weight[:, :, 0, 0] * mean).sum(dim=1)
        pq.weight *= std.view(1, -1, 1, 1)
        latents = vae.encode(to_pixels(images)).latent_dist.mean
    vae.register_to_config(scaling_factor=round(1.0 / float(latents.std()), 4))


def reuse_vae(path: Path, s: PretrainSettings) -> Any:
    """The autoencoder of an earlier weights file, refused unless it was trained with
    these VAE settings (the metadata must keep describing the file)."""
    import torch

    from core.models.families.sd15.shapes import load_weights
    from core.models.tiny.unet import SD_VAE_SCALING
    from core.models.tiny.vae import tiny_vae

    state, metadata = load_weights(path)
    earlier = json.loads(metadata["settings"])
    for key in ("seed", "size", "vae_steps", "vae_batch", "vae_crop", "vae_lr",
                "vae_norm_groups"):
        if earlier.get(key) != getattr(s, key):
            raise SystemExit(f"{path} was trained with {key}={earlier.get(key)}, not "
                             f"{getattr(s, key)}")
    vae = tiny_vae(4, SD_VAE_SCALING, norm_groups=s.vae_norm_groups)
    vae.load_state_dict({k: v.to(torch.float32) for k, v in state["vae"].items()})
    calibrate(vae, s)  # earlier files hold the autoencoder as trained
    return vae.eval()


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


def caption_forms(captions: list[str]) -> tuple[list[str], Any]:
    """Every text the base trains on, and per image the indices of its full caption
    ("a red circle on a white background") and its short one ("a red circle"); the
    empty text is index 0. Both forms, because prompts usually omit the background and
    CLIP's padding positions summarise the whole text."""
    import torch

    texts = [""]
    index: dict[str, int] = {"": 0}
    pairs = []
    for caption in captions:
        pair = []
        for text in (caption, caption.split(" on a ")[0]):
            if text not in index:
                index[text] = len(texts)
                texts.append(text)
            pair.append(index[text])
        pairs.append(pair)
    return texts, torch.tensor(pairs)


def train_unet(s: PretrainSettings, latents: Any, captions: list[str],
               text_encoder: Any, tokenizer: Any) -> Any:
    """The UNet from scratch and the text encoder with it (a base's text encoder is
    trained with it; the demo's LoRA then leaves it frozen)."""
    import torch
    import torch.nn.functional as F

    from core.models.families.sd15.shapes import zero_snr_scheduler
    from core.models.tiny.unet import tiny_unet

    torch.manual_seed(s.seed)
    unet = tiny_unet()
    alphas = zero_snr_scheduler().alphas_cumprod
    texts, forms = caption_forms(captions)
    ids = tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length,
                    truncation=True, return_tensors="pt").input_ids
    text_encoder.train()
    opt = torch.optim.AdamW([{"params": unet.parameters()},
                             {"params": text_encoder.parameters(), "lr": s.unet_lr / 2}],
                            lr=s.unet_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _warmup_cosine(step, s))
    gen = torch.Generator().manual_seed(s.seed)
    start = time.time()
    for step in range(1, s.unet_steps + 1):
        idx = torch.randint(0, len(latents), (s.unet_batch,), generator=gen)
        short = torch.rand(s.unet_batch, generator=gen) < 0.5
        which = forms[idx, short.long()]
        which[torch.rand(s.unet_batch, generator=gen) < s.empty_caption_share] = 0
        cond = text_encoder(ids)[0][which]
        x0 = latents[idx]
        noise = torch.randn(x0.shape, generator=gen)
        noise += s.noise_offset * torch.randn((*x0.shape[:2], 1, 1), generator=gen)
        t = torch.randint(0, 1000, (s.unet_batch,), generator=gen)
        a = alphas[t].view(-1, 1, 1, 1)
        pred = unet(a.sqrt() * x0 + (1 - a).sqrt() * noise, t, encoder_hidden_states=cond)
        velocity = a.sqrt() * noise - (1 - a).sqrt() * x0
        snr = a.flatten() / (1 - a.flatten())
        weight = snr.clamp(max=s.min_snr_gamma) / (snr + 1)  # min-SNR for v-prediction
        loss = (F.mse_loss(pred.sample, velocity, reduction="none").mean(dim=(1, 2, 3))
                * weight).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*unet.parameters(), *text_encoder.parameters()], 1.0)
        opt.step()
        sched.step()
        _log_step("unet", step, s.unet_steps, loss, start)
    unet.eval()
    text_encoder.eval()
    return unet


def _log_step(phase: str, step: int, total: int, loss: Any, start: float) -> None:
    if step % 100 == 0 or step == 1:
        print(f"{phase} step {step}/{total} loss {loss.item():.4f} "
              f"({time.time() - start:.0f}s)", flush=True)


def _warmup_cosine(step: int, s: PretrainSettings, warmup: int = 100) -> float:
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (s.unet_steps - warmup)))


def text_side(seed: int, workdir: Path) -> tuple[Any, Any]:
    """The tiny SD1.5's text encoder and tokenizer, built as `tiny:sd15` builds them but
    with the demo's words as single tokens (shapes.WORDS)."""
    import torch
    from transformers import CLIPTextModel

    from core.models.families.sd15.shapes import WORDS
    from core.models.tiny.clip import clip_tokenizer, tiny_clip_config

    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config(words=WORDS))
    text_encoder.eval()
    return text_encoder, clip_tokenizer(workdir / "tokenizer", words=WORDS)


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
            "script": "core/models/families/sd15/shapes/pretrain.py"}
    save_file(tensors, str(path), metadata=meta)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--vae-steps", type=int, default=PretrainSettings.vae_steps)
    parser.add_argument("--unet-steps", type=int, default=PretrainSettings.unet_steps)
    parser.add_argument("--vae-from", type=Path, default=None,
                        help="reuse the autoencoder of an earlier weights file (phase 2 only)")
    parser.add_argument("--vae-only", action="store_true",
                        help="stop after the autoencoder (its file feeds --vae-from)")
    args = parser.parse_args(argv)
    s = PretrainSettings(vae_steps=args.vae_steps, unet_steps=args.unet_steps)
    start = time.time()
    if args.vae_from:
        vae = reuse_vae(args.vae_from, s)
    else:
        vae = train_vae(s)
        calibrate(vae, s)
    print(f"vae scaling_factor {vae.config.scaling_factor}", flush=True)
    if args.vae_only:
        save_weights(args.out, {"vae": vae}, s, time.time() - start)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        text_encoder, tokenizer = text_side(s.seed, Path(tmp))
        latents, captions = base_latents(vae, s)
        unet = train_unet(s, latents, captions, text_encoder, tokenizer)
    save_weights(args.out, {"vae": vae, "unet": unet, "text_encoder": text_encoder}, s,
                 time.time() - start)
    print(f"wrote {args.out} ({time.time() - start:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
