"""Benchmark: train.token_routing's step time, routed against unrouted, on the CPU.

    python bench/routing.py [--fraction 0.5] [--layers 8] [--frames 5] [--side 40]
                            [--steps 6] [--warmup 2] [--checkpointing] [--threads N]

A random Wan 2.1 transformer scaled down from the family's full_size config (1.3B:
30 blocks of width 1536, 12 heads of 128) to --layers blocks of width 256 (4 heads of
64, feed-forward 1024), as many blocks routed as the family's range says (the middle
half), LoRA (the family's attention targets, rank 16) on a frozen base: one training
step is the flow-matching loss of a random latent clip of --frames latent frames of
--side x --side latents (--frames * (side/2)^2 tokens, 2000 by default) against random
text embeddings, backward, AdamW. The routed and the unrouted model are the same
weights and take turns step by step, so load on the machine hits both alike; the figure
is the ratio of their median step times after --warmup steps each, in wall time and in
the process's CPU time (with --threads 1, the work done: on a shared machine other
processes' load moves the wall time of single steps by several times, the CPU time
hardly).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from common import REPO, load_line, median

FULL_SIZE = REPO / "core/models/families/wan/full_size/transformer/config.json"


def scaled_config(layers: int) -> dict[str, Any]:
    """The full-size Wan 2.1 config, narrower and shallower (what the CPU can step)."""
    config = json.loads(FULL_SIZE.read_text(encoding="utf-8"))
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config.update(num_layers=layers, num_attention_heads=4, attention_head_dim=64,
                  ffn_dim=1024, text_dim=256, freq_dim=256)
    return config


def lora_model(config: dict[str, Any], checkpointing: bool) -> Any:
    import torch
    from diffusers import WanTransformer3DModel

    from core.models.adapters import adapter_config
    from core.models.registry import get_family

    torch.manual_seed(0)
    model = WanTransformer3DModel(**config)
    model.requires_grad_(False)
    model.add_adapter(adapter_config("lora", 16, 16,
                                     get_family("wan").lora_target_modules("attention")))
    if checkpointing:
        model.enable_gradient_checkpointing()
    return model.train()


def step(model: Any, optimizer: Any, router: Any, fraction: float,
         shape: tuple) -> tuple[float, float]:
    """One training step, routed when `fraction` > 0: its (wall, CPU) seconds."""
    import torch

    latents = torch.randn(*shape)
    noise, text = torch.randn_like(latents), torch.randn(shape[0], 64, 256)
    sigma = torch.rand(shape[0])
    noisy = (1 - sigma.view(-1, 1, 1, 1, 1)) * latents + sigma.view(-1, 1, 1, 1, 1) * noise
    router.fraction = fraction
    started, cpu = time.perf_counter(), time.process_time()
    with router.step(True):
        out = model(noisy, sigma * 1000, text).sample
        loss = torch.nn.functional.mse_loss(out.float(), noise - latents)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started, time.process_time() - cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from core.models.blocks import denoiser_stacks
    from core.models.registry import get_family
    from core.models.routing import install

    if args.threads:
        torch.set_num_threads(args.threads)
    family = get_family("wan")
    model = lora_model(scaled_config(args.layers), args.checkpointing)
    router = install(family.routing, model, denoiser_stacks(family, model), args.fraction)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    shape = (1, 16, args.frames, args.side, args.side)
    times: dict[float, list[tuple[float, float]]] = {0.0: [], args.fraction: []}
    for i in range(args.warmup + args.steps):
        for fraction in times:  # turn by turn: the same load on both
            took = step(model, optimizer, router, fraction, shape)
            if i >= args.warmup:
                times[fraction].append(took)
        routed = router.take()
    out: dict[str, Any] = {"tokens": args.frames * (args.side // 2) ** 2, "layers": args.layers,
                           "routed_blocks": [router.spans[0].start, router.spans[0].stop],
                           "routed_tokens_last": routed}
    for n, clock in enumerate(("wall", "cpu")):
        plain = median([t[n] for t in times[0.0]])
        routed_s = median([t[n] for t in times[args.fraction]])
        out[clock] = {"plain_s": round(plain, 3), "routed_s": round(routed_s, 3),
                      "ratio": round(routed_s / plain, 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--frames", type=int, default=5, help="latent frames")
    parser.add_argument("--side", type=int, default=40, help="latent side (even)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    print(load_line())
    result = run(args)
    print(f"Wan {args.layers} blocks, width 256, {result['tokens']} tokens, LoRA"
          f"{', checkpointed' if args.checkpointing else ''}: blocks "
          f"{result['routed_blocks'][0]}-{result['routed_blocks'][1] - 1} routed")
    for clock in ("wall", "cpu"):
        r = result[clock]
        print(f"{clock:>4}: token_routing 0: {r['plain_s']:.3f} s/step; {args.fraction:g}: "
              f"{r['routed_s']:.3f} s/step; ratio {r['ratio']:.3f}")
    print(load_line())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
