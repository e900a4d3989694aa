"""Benchmark: building the latent cache versus the bare VAE encode it is built around.

    python bench/cache.py [--count 96] [--resolution 128] [--workspace DIR] [--profile]

On a tiny sd15 model and a generated folder of PNGs with captions, in one process:

1. baseline: every image already decoded, resized and cropped (`load_pixels`, the build's
   own preprocessing) and grouped into the same batches `build_vae_entries` makes; only
   `family.encode_images` is timed: no file I/O, no decoding, no saving;
2. a cold `core.cache.stage.build_caches` (plan, header checks, decode, encode, atomic
   writes, and the text-embedding cache);
3. a second `build_caches` over the now complete cache, which should only read headers;
4. the baseline again, so a burst of load from elsewhere shows as a spread between the
   two baseline figures rather than silently skewing the ratio.

The figure is build images/s over baseline images/s, both for the VAE part of the build
(BuildStats.seconds of the VAE entries) and for the whole stage (wall time of the call,
text cache included). `--profile` runs the cold build under cProfile and prints the top
functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import time
from pathlib import Path
from typing import Any

from common import demo_like_config, load_line, workspace, write_images

VAE_BATCH = 4  # build_caches' default vae_batch, which the baseline mirrors


def baseline(family: Any, components: Any, batches: list[Any]) -> float:
    """Seconds to encode the pre-decoded batches, as build_vae_entries calls the VAE."""
    import torch

    start = time.perf_counter()
    for batch in batches:
        with torch.no_grad():
            family.encode_images(components, batch).float().cpu()
    return time.perf_counter() - start


def decoded_batches(cfg: Any, components: Any) -> list[Any]:
    """The build's own plan, chunking and preprocessing, done up front."""
    import torch

    from core.cache.build import _chunks, load_pixels
    from core.cache.plan import plan_caches
    from core.cache.stage import model_identity

    plan = plan_caches(cfg, model_identity(components))
    return [torch.stack([load_pixels(job) for job in chunk]).to(dtype=components.vae.dtype)
            for chunk in _chunks(plan.vae_jobs, VAE_BATCH)]


def timed_build(cfg: Any, family: Any, components: Any,
                profile: bool = False) -> tuple[float, Any, str]:
    from core.cache.stage import build_caches

    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    report = build_caches(cfg, family, components, vae_batch=VAE_BATCH)
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - start
    text = ""
    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(15)
        text = out.getvalue()
    return seconds, report, text


def warm_up(family: Any, components: Any, batch: Any) -> None:
    """First calls pay one-off costs (kernel selection, allocator growth); not timed."""
    import torch

    with torch.no_grad():
        for _ in range(2):
            family.encode_images(components, batch)
        family.encode_prompts(components, ["warm up"])


def run(ws: Path, count: int, resolution: int, profile: bool) -> None:
    import torch

    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    print(load_line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    start = time.perf_counter()
    model_dir = materialize_tiny("sd15", ws)
    family = get_family("sd15")
    components = family.load(str(model_dir))
    print(f"tiny sd15 ready in {time.perf_counter() - start:.1f} s ({model_dir})")

    images = ws / "bench-cache-images"
    shutil.rmtree(images, ignore_errors=True)
    write_images(images, count, resolution)
    cfg = demo_like_config(ws, images, resolution, batch_size=4, max_steps=1)
    for folder in (cfg.datasets[0].vae_cache, cfg.text_cache.dir):
        shutil.rmtree(folder, ignore_errors=True)  # a cold build, whatever was there

    batches = decoded_batches(cfg, components)
    warm_up(family, components, batches[0])
    base_a = baseline(family, components, batches)
    cold_s, cold, profile_text = timed_build(cfg, family, components, profile)
    warm_s, warm, _ = timed_build(cfg, family, components)
    base_b = baseline(family, components, batches)

    base_s = (base_a + base_b) / 2
    n = len(cold.plan.vae_jobs)
    print(f"\n{n} images, {resolution} px, PNG + captions; VAE batch {VAE_BATCH} "
          f"({len(batches)} batches); {len(cold.plan.text_jobs)} unique captions")
    print(f"baseline encode (no I/O):   {n / base_a:7.1f} images/s before, "
          f"{n / base_b:7.1f} after  ({base_a:.2f} s, {base_b:.2f} s; mean {base_s:.2f} s)")
    vae_rate, base_rate = n / cold.vae.seconds, n / base_s
    print(f"cold build, VAE part:       {vae_rate:7.1f} images/s  ({cold.vae.seconds:.2f} s, "
          f"{cold.vae.written} written)")
    print(f"cold build, whole stage:    {n / cold_s:7.1f} images/s  ({cold_s:.2f} s; text "
          f"{cold.text.seconds:.2f} s for {cold.text.written} entries, plan+checks "
          f"{cold_s - cold.vae.seconds - cold.text.seconds:.2f} s)")
    print(f"RATIO build/baseline, VAE part:    {vae_rate / base_rate:.3f}   (aim > 0.85)")
    print(f"RATIO build/baseline, whole stage: {(n / cold_s) / base_rate:.3f}")
    print(f"second (cached) run:        {warm_s:.3f} s  ({warm.stale_vae} VAE and "
          f"{warm.stale_text} text entries stale, {warm.vae.written + warm.text.written} "
          f"written; {1000 * warm_s / n:.2f} ms per image)")
    if cold.problems:
        print(f"problems: {len(cold.problems)}, first: {cold.problems[0]}")
    print(load_line())
    if profile_text:
        print("\n--- cProfile of the cold build ---\n" + profile_text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=96, help="images to generate")
    parser.add_argument("--resolution", type=int, default=128, help="image side in pixels")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="where the tiny model, images and caches go (default: temp)")
    parser.add_argument("--profile", action="store_true", help="cProfile the cold build")
    args = parser.parse_args(argv)
    with workspace(args.workspace, "bench-cache-") as ws:
        run(ws, args.count, args.resolution, args.profile)


if __name__ == "__main__":
    main()
