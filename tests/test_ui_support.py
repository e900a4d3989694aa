"""Helpers shared by the UI tests (no tests here): start the real app on a free port,
find Chromium, stop what a test started."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Small overrides so the demo finishes fast on 2 CPU cores (the preset trains 128 px,
# for hundreds of steps).
FAST = {"train.max_steps": "8", "train.checkpoint_every": "4", "train.eval_every": "4",
        "train.eval_images": "4", "validation.every": "4", "validation.steps": "2",
        "validation.resolution": "64", "datasets.0.resolution": "64"}


@contextlib.contextmanager
def running_app(workspace: Path, auth: list[tuple[str, str]] | None = None
                ) -> Iterator[tuple[object, str]]:
    """The real app (AppContext + Blocks) served on 127.0.0.1; yields (ctx, url)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from ui.app import launch_app
    from ui.context import AppContext

    ctx = AppContext(workspace, secrets=[p for _, p in auth or []])
    demo, url = launch_app(ctx, port=free_port(), auth=auth, prevent_thread_lock=True,
                           quiet=True)
    try:
        yield ctx, url
    finally:
        stop_runs(ctx)
        demo.close()
        ctx.close()


@contextlib.contextmanager
def open_browser() -> Iterator[object]:
    """Headless Chromium through Playwright (skips when either is missing)."""
    executable = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def stop_runs(ctx) -> None:
    """Stop every run and cache build a test left going (fast: no long grace)."""
    from core.runs.manager import stop_run

    for handle in ctx.live_handles():
        with contextlib.suppress(Exception):
            stop_run(handle.run_dir, grace_s=10, handle=handle)
    if ctx.cache_job is not None and ctx.cache_job.poll() is None:
        ctx.cache_job.stop(grace_s=5)


def demo_config(workspace: Path, changes: dict[str, str] | None = None) -> str:
    """The demo preset as TOML with the fast overrides (and `changes`), data generated."""
    from core.config import apply_overrides, dumps_config, load_config
    from core.ops import prepare_demo
    from core.presets import preset_path

    cfg = load_config(preset_path("demo"))
    items = {**FAST, **(changes or {})}
    apply_overrides(cfg, [f"{k}={v}" for k, v in items.items()])
    prepare_demo(cfg, workspace, new_output=False)
    return dumps_config(cfg)


def chromium() -> str:
    """Debian's chromium (CI installs it); skip with the reason when it truly is absent."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.skip("chromium not found: install it with `apt-get install -y chromium` "
                    "(.ci/run does)")
    pytest.importorskip("playwright", reason="the playwright package is not installed "
                                             "(it is in requirements.txt)")
    return path


@contextlib.contextmanager
def browser_page(url: str, width: int = 1280, height: int = 800,
                 args: tuple[str, ...] = ()) -> Iterator[object]:
    """One headless Chromium page on `url` (a module fixture keeps it for its tests);
    `args`: Chromium switches beside CHROMIUM_ARGS."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=[*CHROMIUM_ARGS, *args])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(60_000)
            page.goto(url)
            yield page
        finally:
            browser.close()


# The texts of the red "Error" toasts on the page.
ERROR_TOASTS = ("Array.from(document.querySelectorAll('[data-testid=\"toast-body\"].error'))"
                ".map(e => e.innerText)")
