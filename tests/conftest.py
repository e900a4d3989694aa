"""Shared fixtures: a session workspace holding tiny models, small image folders, configs."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# Subprocesses (accelerate launch, app.py) find `core` and stay quiet about telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# As ui/serve.py does for the app: tests that build Blocks in this process (the form's
# fixtures) would otherwise start gradio's version check and analytics threads, each an
# HTTP request this offline machine cannot answer.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Under pytest-xdist (make test) the workers share the cores: torch in each takes its
# share instead of every core (oversubscribed threads make every test slower).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


# A test process imports torch, diffusers, transformers and gradio as it goes: about 600k
# objects that live as long as it does, which every full collection walked again (0.3 s
# each; 13% of the CPU of three in-process test files went to the collector). After a
# slow full collection, whatever survived it is frozen, so the next ones walk only what
# the tests made since. A frozen object is still freed when its last reference goes; only
# one left in a cycle would outlive its test, which is memory, not a result.
SLOW_COLLECTION_S = 0.05
_collection_started = [0.0]


def _freeze_after_a_slow_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _collection_started[0] = time.perf_counter()
    elif info["generation"] == 2 and time.perf_counter() - _collection_started[0] > \
            SLOW_COLLECTION_S:
        gc.freeze()


gc.callbacks.append(_freeze_after_a_slow_collection)

# The files that take longest (measured: `pytest -n 2 --durations=80`, a full run on this
# 2-core machine), handed out first: with whole files per worker (--dist loadfile), a long
# file started last would leave the other worker idle while it runs.
LONGEST_FILES = ("test_machines.py", "test_ui_quiet_browser.py", "test_ui_browser.py",
                 "test_train.py", "test_ui_runs_browser.py", "test_fsdp.py", "test_demo.py",
                 "test_single_file.py", "test_ui_api.py", "test_extend.py",
                 "test_family_folder.py", "test_ui_form_browser.py", "test_cache.py",
                 "test_console.py",
                 # the longest of make test-fast's (py-spy over a test-fast run)
                 "test_memory_estimate.py", "test_family_qwen_image_edit.py",
                 "test_family_ltx2.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    # A browser test drives a page through a server and timers on a machine that runs
    # another worker's training beside it: one that fails gets a second try, and the
    # summary lists it as rerun (-rR), so a race it found is seen and fixed, while one
    # slow moment does not fail CI. A test that fails twice fails.
    for item in items:
        if item.path.name.endswith("_browser.py"):
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=2))


def pytest_configure(config: pytest.Config) -> None:
    """The memory estimate's disk cache (core/memory/sizes_cache.py) in a folder
    of this session, shared by its workers and their subprocesses, not in ~/.cache."""
    if not hasattr(config, "workerinput") and "DT_CACHE_DIR" not in os.environ:
        import tempfile

        folder = tempfile.mkdtemp(prefix="dt-test-cache-")
        os.environ["DT_CACHE_DIR"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


FIRST_TRIES: list[tuple[str, str]] = []  # (test, why its first try failed): the summary


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":
        FIRST_TRIES.append((report.nodeid, report.longreprtext[-4000:]))


def pytest_terminal_summary(terminalreporter) -> None:
    """Why each rerun test failed at first: a rerun that passed is still a race to fix."""
    for nodeid, why in FIRST_TRIES:
        terminalreporter.section(f"first try of {nodeid}", sep="-")
        terminalreporter.write_line(why)


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (for a test's rendezvous or web server: tests run
    side by side under pytest-xdist, so none may count on accelerate's 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def forget_compiles() -> Iterator[None]:
    """What a test compiled is forgotten after it, with dynamo's process-wide counters: a
    later test in the same worker (tests/test_hot_loop.py) counts the graphs its own run
    compiles. Nothing to do, and nothing imported, where torch._dynamo never loaded."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        from torch._dynamo.utils import counters

        dynamo.reset()
        counters.clear()


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace shared by the session, so each tiny model is built once."""
    return tmp_path_factory.mktemp("workspace")


def write_shapes(folder: Path, count: int, size: tuple[int, int] = (64, 64),
                 captions: list[str] | None = None) -> list[Path]:
    """`count` PNG images with `.txt` captions; captions cycle through `captions`."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    colors = [(220, 40, 40), (40, 170, 60), (40, 80, 220), (235, 200, 30)]
    captions = captions or [f"image number {i}" for i in range(count)]
    paths = []
    for i in range(count):
        image = Image.new("RGB", size, (245, 245, 245))
        ImageDraw.Draw(image).ellipse((4 + i % 7, 4, size[0] - 4, size[1] - 4 - i % 5),
                                      fill=colors[i % len(colors)])
        path = folder / f"img_{i:03d}.png"
        image.save(path)
        path.with_suffix(".txt").write_text(captions[i % len(captions)], encoding="utf-8")
        paths.append(path)
    return paths


def write_controls(folder: Path, images: Path) -> Path:
    """A control image for each image of `images` (same name): its colours inverted, so
    each pair is an edit a model could learn."""
    from PIL import Image, ImageOps

    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(images.glob("*.png")):
        ImageOps.invert(Image.open(path).convert("RGB")).save(folder / path.name)
    return folder


def small_config(tmp: Path, datasets: int = 1, images: int = 6, family: str = "sd15",
                 shared_captions: bool = False):
    """A resolved config over fresh image folders in `tmp` (absolute paths)."""
    from core.config import Config, DatasetConfig, OutputConfig, TextCacheConfig
    from core.models.registry import family_or_defaults

    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    for d in range(datasets):
        captions = ["a shared caption", "another shared one"] if shared_captions else [
            f"dataset {d} image {i}" for i in range(images)]
        write_shapes(tmp / f"data{d}", images, captions=captions)
        cfg.datasets.append(DatasetConfig(id=f"d{d}", images=str(tmp / f"data{d}"),
                                          vae_cache=str(tmp / f"cache/vae{d}"), resolution=64))
    edit = family_or_defaults(family).edit
    if edit and not edit.optional:  # an edit model trains on pairs (FLUX.2: text alone too)
        for d, ds in enumerate(cfg.datasets):
            ds.control = str(write_controls(tmp / f"control{d}", Path(ds.images)))
        cfg.validation.control_images = [str(Path(cfg.datasets[0].control) / "img_000.png")]
    cfg.text_cache = TextCacheConfig(dir=str(tmp / "cache/text"))
    cfg.output = OutputConfig(dir=str(tmp / "runs/run"))
    cfg.train.batch_size = 2
    # Each eval scores every eval image at 4 timesteps, own and shuffled captions: with
    # the default 8 images it cost a short test run more than its steps. Tests of the
    # eval itself set their own.
    cfg.train.eval_images = 2
    cfg.validation.resolution = 64
    cfg.validation.steps = 2
    cfg.launch.main_process_port = free_port()  # a two-process run's rendezvous
    return cfg


def train_in_process(cfg_path: Path, workspace: Path, *extra: str) -> int:
    """core.train.main in this process (no `accelerate launch`: seconds, not tens of
    seconds), accelerate's state reset before and after. tests/test_train.py covers the
    real launch."""
    import signal

    from accelerate.state import AcceleratorState

    from core.train.main import main

    # The trainer installs its stop handlers for its process; here that is pytest's.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        return main(["--config", str(cfg_path), "--workspace", str(workspace), *extra])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def train_events(cfg, folder: Path, workspace: Path | None = None) -> list[dict]:
    """`cfg` trained in-process on the CPU without validation images (its config saved
    in `folder`; tiny models built in `workspace`, default `folder`); the run's events."""
    import json

    from core.config import save_config

    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, folder / "config.toml")
    assert train_in_process(folder / "config.toml", workspace or folder) == 0
    lines = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_compiled_blocks_train_alike(tmp: Path, workspace: Path, family: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile = "blocks" on a family's tiny model (aot_eager on the CPU, as
    tests/test_hot_loop.py): two steps with the same losses as uncompiled."""
    monkeypatch.setenv("TRAIN_COMPILE_BACKEND", "aot_eager")

    def losses(name: str, mode: str) -> list[float]:
        cfg = small_config(tmp / name, images=2, family=family)
        cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 2, 100, 100
        cfg.train.gradient_checkpointing, cfg.train.compile = True, mode
        events = train_events(cfg, tmp / name, workspace)
        return [e["loss"] for e in events if e["type"] == "step"]

    plain = losses("plain", "off")
    assert len(plain) == 2 and losses("compiled", "blocks") == pytest.approx(plain, rel=1e-4,
                                                                             abs=1e-5)


def step_losses(folder: Path, steps: int, family: str = "sd15", workspace: Path | None = None,
                **train: object) -> list[float]:
    """The loss of each of `steps` steps of small_config(folder) trained in-process on the
    CPU with the `train.*` keys given (no eval, no validation); tiny models built in
    `workspace` (default `folder`: pass tiny_workspace to share the session's)."""
    cfg = small_config(folder, images=4, family=family)
    for key, value in train.items():
        setattr(cfg.train, key, value)
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = steps, 100, 100
    return [e["loss"] for e in train_events(cfg, folder, workspace) if e["type"] == "step"]


@pytest.fixture(scope="session")
def tiny_sd15(tiny_workspace: Path):
    """(family, components) of the tiny SD1.5, loaded once; tests must not change it."""
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    family = get_family("sd15")
    return family, family.load(str(materialize_tiny("sd15", tiny_workspace)))


def tiny_with_blocks(workspace: Path, family_name: str, **sizes: int):
    """(family, components) of the tiny `family_name` with its denoiser rebuilt with
    `sizes` (config keys: num_layers=4, ...), random (seed 0), a rank-4 LoRA on it,
    checkpointing on: a real model with more blocks than the tiny one."""
    import dataclasses

    import torch

    from core.config import Config
    from core.models.registry import get_family
    from core.models.tiny import resolve_model_path
    from core.train.setup import add_trainable

    family = get_family(family_name)
    c = family.load(str(resolve_model_path(f"tiny:{family_name}", workspace)),
                    dtype=torch.float32, device="cpu")
    torch.manual_seed(0)
    config = {**c.denoiser.config, **sizes}
    c = dataclasses.replace(c, denoiser=type(c.denoiser).from_config(config))
    cfg = Config()
    cfg.model.family = family_name
    cfg.train.lora_rank, cfg.train.gradient_checkpointing = 4, True
    add_trainable(family, c.denoiser, cfg)
    return family, c


def sigma_law_cdf(sigmas, law: str, shift: float = 1.0, std: float = 1.0):
    """The CDF at `sigmas` of a training-sigma law: u drawn "uniform" or "logit_normal"
    (sigmoid of a normal of mean 0 and `std`) on (0, 1), then the static shift
    shift * u / (1 + (shift - 1) * u) (core/models/objectives.py)."""
    import torch

    x = torch.as_tensor(sigmas, dtype=torch.float64)
    u = x / (shift - (shift - 1.0) * x)  # the shift undone
    if law == "uniform":
        return u
    if law == "logit_normal":
        return torch.special.ndtr(torch.log(u / (1.0 - u)) / std)
    raise ValueError(f"unknown law {law!r}")


def ks_distance(sigmas, law: str, shift: float = 1.0, std: float = 1.0) -> float:
    """Kolmogorov-Smirnov statistic of drawn sigmas against `law` (sigma_law_cdf): the
    largest gap between their empirical CDF and the law's. Uniform and logit-normal draws
    differ by 0.117 at any shift; 5000 draws of the right law stay under 0.03."""
    import torch

    x = torch.as_tensor(sigmas, dtype=torch.float64).flatten().sort().values
    n = x.numel()
    cdf = sigma_law_cdf(x, law, shift, std)
    above = torch.arange(1, n + 1, dtype=torch.float64) / n - cdf
    below = cdf - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(above, below).max())


def per_gpu_gib(check_stdout: str) -> float:
    """The per-GPU figure of `--stage check`'s memory estimate: first on its memory line,
    or, on a machine without a GPU (where the RAM figure leads), on the line after."""
    return float(re.search(r"([0-9.]+) GiB per GPU", check_stdout).group(1))


def app_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python app.py <args>` run by app.main in this process (from `cwd`), its stdout,
    stderr and exit code as subprocess.run gives them. For commands whose outcome is
    decided here (a check, a refusal): the interpreter and the imports (about 5 s a
    call here) are not what those tests are about; tests/test_cli.py runs the real
    command."""
    import contextlib
    import io

    import app

    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = app.main(list(args))
            except SystemExit as exc:  # argparse's refusals
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["app.py", *args], code, out.getvalue(), err.getvalue())


LOADED_MARK = "modules loaded at exit: "


def app_and_loaded_modules(*args: str, modules: tuple[str, ...], timeout: float = 300
                           ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python app.py <args>` in a process of its own, as a terminal runs it, and which of
    `modules` it had imported when it ended (one left out by core/libraries.py does not
    count), in the order given."""
    code = ("import json, runpy, sys\n"
            f"sys.argv = ['app.py', *{list(args)!r}]\n"
            "try:\n    runpy.run_path('app.py', run_name='__main__')\n"
            f"finally:\n    print({LOADED_MARK!r} + json.dumps([m for m in {list(modules)!r}"
            " if sys.modules.get(m) is not None]), file=sys.stderr)\n")
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    marks = [line for line in done.stderr.splitlines() if line.startswith(LOADED_MARK)]
    assert marks, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(marks[-1][len(LOADED_MARK):])


def check_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python app.py --no-ui --stage check <args>`, in this process (app_in_process)."""
    return app_in_process("--no-ui", "--stage", "check", *args, cwd=cwd)


# ---------------------------------------------------------------- UI, in process


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator:
    """An AppContext on a fresh workspace, closed after the test."""
    from ui.context import AppContext

    context = AppContext(tmp_path, monitor=False)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="module")
def dataset_tab():
    """The Dataset tab's components, built once per module."""
    import gradio as gr

    from ui import tab_dataset
    from ui.form import Form

    with gr.Blocks():
        return tab_dataset.build(Form())
