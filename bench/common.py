"""Shared by the benchmarks: a workspace, an image folder, a demo-like config, machine load.

Benchmarks are programs, not tests: each prints a figure measured against a baseline taken
in the same run, on the same machine, so the ratio stays meaningful when the machine is
slower or busier than usual.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The tiny models build offline; nothing may try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLORS = [(220, 40, 40), (40, 170, 60), (40, 80, 220), (235, 200, 30)]
SHAPES = ("circle", "square")


@contextmanager
def workspace(path: Path | None, prefix: str, keep: bool = False) -> Iterator[Path]:
    """`path` as given (kept), or a temporary folder removed afterwards unless `keep`."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path.absolute()
        return
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        if keep:
            print(f"workspace kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def write_images(folder: Path, count: int, size: int) -> list[Path]:
    """`count` square PNGs with `.txt` captions, one distinct caption per image (so the
    text cache has as many entries as the VAE cache: the heavier, realistic case).
    Mirrors tests/conftest.py `write_shapes`, at the benchmark's size."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        image = Image.new("RGB", (size, size), (245, 245, 245))
        color, shape = COLORS[i % len(COLORS)], SHAPES[i % len(SHAPES)]
        box = (4 + i % 7, 4, size - 4, size - 4 - i % 5)
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=color)
        path = folder / f"img_{i:04d}.png"
        image.save(path)
        path.with_suffix(".txt").write_text(f"a {shape} number {i}", encoding="utf-8")
        paths.append(path)
    return paths


def demo_like_config(ws: Path, images: Path, resolution: int, batch_size: int,
                     max_steps: int):
    """A resolved (absolute paths) config like presets/demo.toml, with eval, validation
    and checkpoints pushed past max_steps so that no timed step includes them."""
    from core.config import Config, DatasetConfig, OutputConfig, TextCacheConfig

    cfg = Config()
    cfg.model.family, cfg.model.path = "sd15", "tiny:sd15"
    cfg.datasets.append(DatasetConfig(id="shapes", images=str(images),
                                      vae_cache=str(ws / "cache/shapes/vae"),
                                      resolution=resolution))
    cfg.text_cache = TextCacheConfig(dir=str(ws / "cache/text"))
    cfg.output = OutputConfig(dir=str(ws / "runs/bench"))
    t = cfg.train
    t.method, t.lora_rank, t.batch_size, t.max_steps = "lora", 8, batch_size, max_steps
    t.learning_rate, t.lr_warmup_steps, t.max_grad_norm = 1e-3, 10, 1.0
    t.eval_every = t.checkpoint_every = max_steps + 1
    cfg.validation.every = max_steps + 1
    cfg.validation.resolution, cfg.validation.steps = resolution, 2
    return cfg


def add_omp_option(parser: Any) -> None:
    parser.add_argument(
        "--omp-passive", action="store_true",
        help="set OMP_WAIT_POLICY=PASSIVE (here and in child processes) before torch loads: "
             "on a busy machine libgomp's spinning threads otherwise slow torch several-fold")


def parse_run_options(parser: Any, argv: list[str] | None, timeout_help: str) -> Any:
    """The options of a benchmark that launches runs (--timeout, --workspace,
    --omp-passive) added, the arguments parsed, and the OMP line printed (before torch
    is imported)."""
    parser.add_argument("--timeout", type=float, default=600, help=timeout_help)
    parser.add_argument("--workspace", type=Path, default=None, help="default: a temp dir")
    add_omp_option(parser)
    args = parser.parse_args(argv)
    print(apply_omp_option(args.omp_passive))
    return args


def apply_omp_option(passive: bool) -> str:
    """Call before torch is imported; returns a line saying what torch's threads will do."""
    if passive:
        if "torch" in sys.modules:
            raise RuntimeError("--omp-passive must be applied before torch is imported")
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset: libgomp spins)')}"


def load_line() -> str:
    """The 1/5/15-minute load averages against the core count: a busy machine skews the
    absolute figures (ratios less so, as both sides run in the same window)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average: unknown"
    return (f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
            + ("  (BUSY: other work is running)" if one > (os.cpu_count() or 1) * 0.75 else ""))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
