"""Benchmark: dataset scanning with header-only reads versus full decodes.

    python bench/scan.py [--count 20000] [--dir DIR] [--decode-sample 1000] [--keep]

Writes N small images (mixed sizes, aspect ratios and formats; a handful of variants are
encoded once and their bytes copied, so generating is quick), then in one run measures:

1. listing only (scan_images),
2. scan + read_header over every file (what `--stage check` does),
3. index_dataset (scan + headers + captions, the real check path),
4. load_rgb (full decode + RGB) over an evenly spaced sample, extrapolated to all files.

It prints images/s and memory: the Python-heap peak from tracemalloc (a second, traced
pass; PIL's pixel buffers are C allocations tracemalloc does not see) and the growth of
the process's peak RSS (ru_maxrss) during each phase. The files were just written, so
they are in the page cache: figures are for a warm cache.
"""

from __future__ import annotations

import argparse
import io
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image, ImageDraw  # noqa: E402

from core.config import DatasetConfig  # noqa: E402
from core.data.images import load_rgb, read_header  # noqa: E402
from core.data.index import index_dataset  # noqa: E402
from core.data.scan import scan_images  # noqa: E402

SIZES = [(512, 512), (768, 512), (512, 768), (640, 480), (1024, 576), (320, 320),
         (1024, 1024), (480, 640)]
FILES_PER_FOLDER = 1000


def _variant(size: tuple[int, int], index: int) -> Image.Image:
    """A gradient with a few shapes: compresses like a simple photo, not like noise."""
    w, h = size
    r = Image.linear_gradient("L").resize(size)
    g = Image.linear_gradient("L").rotate(90).resize(size)
    b = Image.new("L", size, 40 * index % 256)
    im = Image.merge("RGB", (r, g, b))
    draw = ImageDraw.Draw(im)
    draw.ellipse((w // 4, h // 4, w // 2, h // 2), fill=(220, 30, 30))
    draw.rectangle((w // 2, h // 2, 3 * w // 4, 7 * h // 8), fill=(30, 30, 220))
    return im


def _encoded_variants() -> list[tuple[str, bytes]]:
    out = []
    for i, size in enumerate(SIZES):
        for fmt, ext in (("JPEG", ".jpg"), ("PNG", ".png")):
            buf = io.BytesIO()
            _variant(size, i).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
            out.append((ext, buf.getvalue()))
    return out


def generate(root: Path, count: int) -> int:
    """Write `count` files into sub-folders of FILES_PER_FOLDER; returns total bytes."""
    variants = _encoded_variants()
    total = 0
    for i in range(count):
        folder = root / f"{i // FILES_PER_FOLDER:03d}"
        if i % FILES_PER_FOLDER == 0:
            folder.mkdir(parents=True, exist_ok=True)
        ext, data = variants[i % len(variants)]
        (folder / f"img_{i:06d}{ext}").write_bytes(data)
        total += len(data)
    return total


def _status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux lets a process reset its RSS high-water mark, so each phase gets its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    peak = _status_mib("VmHWM")
    if peak is None:  # not Linux: ru_maxrss, a high-water mark over the whole process
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return peak


def measure(label: str, n: int, fn: Callable[[], object]) -> tuple[float, float]:
    """Time fn once untraced (with RSS growth), then once under tracemalloc for the heap peak.

    RSS growth is the phase's peak RSS minus the RSS when it started. Where the peak cannot
    be reset it is the growth of the process-wide high-water mark (0 when an earlier phase
    already needed more).
    """
    _reset_peak_rss()
    rss_before = _status_mib("VmRSS") or _peak_rss_mib()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    rss_growth = _peak_rss_mib() - rss_before
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rate = n / elapsed if elapsed else float("inf")
    print(f"{label:<34} {n:>6} images  {elapsed:7.2f} s  {rate:9.0f} images/s  "
          f"python-heap peak {peak / 2**20:6.1f} MiB  peak-RSS growth {rss_growth:6.1f} MiB")
    return elapsed, rate


def run(root: Path, count: int, sample: int) -> None:
    print(f"generating {count} images in {root} ...")
    start = time.perf_counter()
    size = generate(root, count)
    sizes = ", ".join(f"{w}x{h}" for w, h in SIZES)
    print(f"generated {count} files, {size / 2**20:.0f} MiB, in {time.perf_counter() - start:.1f} s"
          f" (JPEG and PNG; {sizes})")
    print(f"process peak RSS before measuring: {_peak_rss_mib():.0f} MiB; per-phase peaks "
          f"{'reset' if _reset_peak_rss() else 'NOT resettable here (process-wide mark)'}")

    measure("scan_images (listing only)", count, lambda: scan_images(root))
    paths = scan_images(root)
    assert len(paths) == count, f"scan found {len(paths)} of {count}"
    _, header_rate = measure("scan + read_header (all)", count,
                             lambda: [read_header(p) for p in scan_images(root)])
    ds = DatasetConfig(images=str(root), vae_cache=str(root.parent / "no-cache"),
                       caption="filename")
    measure("index_dataset (check path)", count, lambda: index_dataset(ds, "datasets.0"))

    step = max(1, count // sample)
    subset = paths[::step][:sample]

    def decode_all() -> None:
        for p in subset:
            load_rgb(p).close()

    _, decode_rate = measure("load_rgb full decode (sample)", len(subset), decode_all)
    print(f"full decode of all {count} extrapolated from {len(subset)} evenly spaced files: "
          f"{count / decode_rate:.1f} s")
    print(f"header-only is {header_rate / decode_rate:.0f}x faster than a full decode")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write the images (default: a temporary folder)")
    parser.add_argument("--decode-sample", type=int, default=1000,
                        help="files fully decoded; the rate is extrapolated to all")
    parser.add_argument("--keep", action="store_true", help="keep the generated images")
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-scan-"))
    root = base / "images"
    if root.exists():
        shutil.rmtree(root)
    try:
        run(root, args.count, args.decode_sample)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            if args.dir is None:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
