"""Benchmark: building the latent cache versus the bare VAE encode it is built around.

    python bench/cache.py [--count 96] [--resolution 128] [--workspace DIR] [--repeat 3]
                          [--profile] [--omp-passive]

On a tiny sd15 model and a generated folder of PNGs with captions, in one process, in
rounds (--repeat, default 3), interleaved so a burst of load from other programs hits both
sides alike:

1. baseline: every image already decoded, resized and cropped (`load_pixels`, the build's
   own preprocessing) and grouped into the same batches `build_vae_entries` makes; only
   `family.encode_images` is timed: no file I/O, no decoding, no saving;
2. a cold `core.cache.stage.build_caches`, caches deleted first (plan, header checks,
   decode, encode, atomic writes, and the text-embedding cache);
then once: a `build_caches` over the now complete cache, which should only read headers.

The figure is build images/s over baseline images/s, both for the VAE part of the build
(BuildStats.seconds of the VAE entries) and for the whole stage (wall time of the call,
text cache included), from the best round (outside load only ever adds time) and the
median round. `--profile` adds one more cold build under cProfile and prints the top
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

from common import (
    add_omp_option,
    apply_omp_option,
    demo_like_config,
    load_line,
    median,
    workspace,
    write_images,
)

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


class TimedFamily:
    """The family, with the wall time of each `encode_images` call inside the build
    recorded: the build's own encode time, measured in the same pass as its total."""

    def __init__(self, family: Any) -> None:
        self.family = family
        self.encode_seconds = 0.0

    def encode_images(self, components: Any, pixels: Any, generator: Any = None) -> Any:
        start = time.perf_counter()
        try:
            return self.family.encode_images(components, pixels, generator)
        finally:
            self.encode_seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.family, name)


def timed_build(cfg: Any, family: Any, components: Any,
                profile: bool = False) -> tuple[float, Any, str, float]:
    """(wall seconds, CacheReport, profile text, seconds spent inside encode_images)."""
    from core.cache.stage import build_caches

    timed = TimedFamily(family)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    report = build_caches(cfg, timed, components, vae_batch=VAE_BATCH)
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
    return seconds, report, text, timed.encode_seconds


def warm_up(family: Any, components: Any, batch: Any) -> None:
    """First calls pay one-off costs (kernel selection, allocator growth); not timed."""
    import torch

    with torch.no_grad():
        for _ in range(2):
            family.encode_images(components, batch)
        family.encode_prompts(components, ["warm up"])


def report(bases: list[float], colds: list[tuple[float, Any, str, float]], warm_s: float,
           warm: Any, batch_count: int, resolution: int) -> None:
    """Best of the rounds (outside load only ever adds time) and the median, both ways."""
    cold = colds[0][1]
    n = len(cold.plan.vae_jobs)
    vae = [c[1].vae.seconds for c in colds]
    whole = [c[0] for c in colds]
    print(f"\n{n} images, {resolution} px, PNG + captions; VAE batch {VAE_BATCH} "
          f"({batch_count} batches); {len(cold.plan.text_jobs)} unique captions; "
          f"{len(bases)} rounds")
    for label, fn in (("best", min), ("median", median)):
        b, v, w = fn(bases), fn(vae), fn(whole)
        print(f"[{label}] baseline encode (no I/O): {n / b:6.1f} images/s ({b:.2f} s)  |  "
              f"build VAE part: {n / v:6.1f} images/s ({v:.2f} s)  |  whole stage: "
              f"{n / w:6.1f} images/s ({w:.2f} s)")
        print(f"[{label}] RATIO build/baseline, VAE part: {b / v:.3f}  (aim > 0.85);  "
              f"whole stage incl. text cache: {b / w:.3f}")
    inner = [c[3] / c[1].vae.seconds for c in colds]
    print(f"encode share of the build's VAE part (encode calls timed inside the same build; "
          f"robust to outside load): median {median(inner):.3f}, best {max(inner):.3f}  "
          f"(1.0 = loading and saving fully hidden)")
    text = [c[1].text.seconds for c in colds]
    print(f"text cache part of the cold build: median {median(text):.2f} s for "
          f"{cold.text.written} captions; plan + header checks: median "
          f"{median([w - v - t for w, v, t in zip(whole, vae, text, strict=True)]):.2f} s")
    print(f"second (cached) run: {warm_s:.3f} s  ({warm.stale_vae} VAE and {warm.stale_text} "
          f"text entries stale, {warm.vae.written + warm.text.written} written; "
          f"{1000 * warm_s / n:.2f} ms per image)")
    problems = cold.problems
    if problems:
        print(f"problems: {len(problems)}, first: {problems[0]}")


def run(ws: Path, count: int, resolution: int, repeat: int, profile: bool) -> None:
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
    bases, colds = [], []
    for rep in range(repeat):  # interleaved, so a burst of outside load hits both sides
        bases.append(baseline(family, components, batches))
        for folder in (cfg.datasets[0].vae_cache, cfg.text_cache.dir):
            shutil.rmtree(folder, ignore_errors=True)
        colds.append(timed_build(cfg, family, components))
        print(f"  round {rep + 1}: baseline {bases[-1]:.2f} s, cold build VAE part "
              f"{colds[-1][1].vae.seconds:.2f} s (of which encode {colds[-1][3]:.2f} s), "
              f"whole stage {colds[-1][0]:.2f} s", flush=True)
    warm_s, warm, _, _ = timed_build(cfg, family, components)
    report(bases, colds, warm_s, warm, len(batches), resolution)
    print(load_line())
    if profile:  # an extra cold build, not counted: the profiler slows what it watches
        for folder in (cfg.datasets[0].vae_cache, cfg.text_cache.dir):
            shutil.rmtree(folder, ignore_errors=True)
        print("\n--- cProfile of one more cold build ---\n"
              + timed_build(cfg, family, components, profile=True)[2])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=96, help="images to generate")
    parser.add_argument("--resolution", type=int, default=128, help="image side in pixels")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="where the tiny model, images and caches go (default: temp)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="interleaved rounds of baseline + cold build (best and median)")
    parser.add_argument("--profile", action="store_true", help="cProfile the cold build")
    add_omp_option(parser)
    args = parser.parse_args(argv)
    print(apply_omp_option(args.omp_passive))
    with workspace(args.workspace, "bench-cache-") as ws:
        run(ws, args.count, args.resolution, args.repeat, args.profile)


if __name__ == "__main__":
    main()
