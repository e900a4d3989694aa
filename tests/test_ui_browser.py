"""The page in headless Chromium: load the demo, see a cache-folder conflict appear and go,
edit a caption, launch, watch the log grow and a validation image arrive, stop, and keep
a screenshot (under the test's tmp_path, printed at the end)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_ui_support import CHROMIUM_ARGS, chromium, running_app

from core.config import load_config
from core.presets import PRESETS_DIR

pytestmark = pytest.mark.slow

TIMEOUT_MS = 240_000


def field(page, elem_id: str):
    return page.locator(f"#{elem_id} input, #{elem_id} textarea").first


def set_field(page, elem_id: str, value: str) -> None:
    box = field(page, elem_id)
    box.fill(value)
    box.press("Tab")  # numbers commit on blur


def log_length(page) -> int:
    return page.evaluate("(document.querySelector('#train-log textarea') || {value: ''})"
                         ".value.length")


def test_demo_in_the_browser(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with running_app(tmp_path / "ws") as (ctx, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        try:
            page.goto(url)
            load_demo_and_see_the_conflict(page, ctx.workspace)
            edit_a_caption(page, ctx.workspace)
            export_and_import_the_config(page, ctx.workspace)
            launch_watch_and_stop(page, ctx.workspace)
            resume_and_stop_again(page)
        finally:
            shot = tmp_path / "ui-demo.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            browser.close()
        assert shot.stat().st_size > 10_000


def load_demo_and_see_the_conflict(page, workspace: Path) -> None:
    page.click("#preset-load")  # the demo preset is selected by default
    page.wait_for_selector("#check-panel .dt-ok")
    assert "shapes: 72 image(s)" in page.inner_text("#check-panel")
    set_field(page, "ds-vae_cache", "demo/shapes/latents")  # inside the images folder
    page.wait_for_selector("#check-panel .dt-error")
    text = page.inner_text("#check-panel")
    assert "error(s) block launch" in text and "datasets.0.vae_cache" in text
    assert f"{workspace}/demo/shapes/latents is inside" in text
    set_field(page, "ds-vae_cache", "cache/demo/shapes/vae")
    page.wait_for_selector("#check-panel .dt-ok")
    set_field(page, "ds-resolution", "64")


def edit_a_caption(page, workspace: Path) -> None:
    page.wait_for_selector("#preview img")
    page.locator("#preview img").first.click()
    page.wait_for_function("document.querySelector('#caption-edit textarea').value.length")
    set_field(page, "caption-edit", "a purple circle on a grey background")
    page.click("#caption-save")
    captions = workspace / "demo/shapes"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any("purple" in p.read_text() for p in captions.glob("*.txt")):
            return
        time.sleep(0.2)
    raise AssertionError("the edited caption never reached a .txt file")


def export_and_import_the_config(page, workspace: Path) -> None:
    page.get_by_role("tab", name="Config").click()
    page.click("#config-export")
    exported = workspace / "configs/exports/my-config.toml"  # the Save-as name
    page.wait_for_selector("#config-file a")
    text = exported.read_text()
    preset_steps = load_config(PRESETS_DIR / "demo.toml").train.max_steps
    assert f"\nmax_steps = {preset_steps}\n" in text
    edited = workspace / "edited.toml"
    edited.write_text(text.replace(f"max_steps = {preset_steps}", "max_steps = 123"))
    page.set_input_files("#config-upload input[type=file]", str(edited))
    page.wait_for_function("document.querySelector('#preset-message').innerText"
                           ".includes('imported edited.toml')")
    page.get_by_role("tab", name="Training").click()
    assert field(page, "f-train-max_steps").input_value() == "123"


def resume_and_stop_again(page) -> None:
    step = int(page.inner_text("#train-progress").split("step ")[1].split("/")[0])
    page.click("#resume")
    page.wait_for_function("document.querySelector('#train-message').innerText"
                           ".includes('resumed')", timeout=TIMEOUT_MS)
    page.wait_for_function(
        "(() => { const m = document.querySelector('#train-progress').innerText"
        f".match(/step (\\d+)\\//); return m && Number(m[1]) > {step}; }})()",
        timeout=TIMEOUT_MS)
    page.click("#stop")
    page.wait_for_function("document.querySelector('#train-message').innerText"
                           ".includes('stopped')", timeout=TIMEOUT_MS)
    assert "stopped" in page.inner_text("#train-progress")


def launch_watch_and_stop(page, workspace: Path) -> None:
    page.get_by_role("tab", name="Training").click()
    for elem_id, value in (("f-train-max_steps", "400"), ("f-validation-every", "2"),
                           ("f-validation-steps", "2")):
        set_field(page, elem_id, value)
    page.click("#advanced button, #advanced .label-wrap")
    set_field(page, "f-validation-resolution", "64")
    set_field(page, "f-train-eval_every", "50")
    page.wait_for_timeout(1500)  # let the live check settle on the new values
    page.click("#launch")
    page.wait_for_function("document.querySelector('#train-message').innerText"
                           ".includes('launched')", timeout=TIMEOUT_MS)
    page.wait_for_function("document.querySelector('#train-log textarea').value.length > 0",
                           timeout=TIMEOUT_MS)
    first = log_length(page)
    page.wait_for_function(f"document.querySelector('#train-log textarea').value.length "
                           f"> {first}", timeout=TIMEOUT_MS)
    page.wait_for_selector("#validation-gallery img", timeout=TIMEOUT_MS)
    assert "step 0" in page.inner_text("#validation-gallery"), "the demo draws before training"
    page.wait_for_function("document.querySelector('#validation-gallery').innerText"
                           ".includes('step 2')", timeout=TIMEOUT_MS)
    assert "step " in page.inner_text("#train-progress")
    # The trainer's memory events (a first step is done): host memory only on a CPU.
    page.wait_for_function("document.querySelector('#train-progress').innerText"
                           ".includes('memory: peak')", timeout=30_000)
    command = field(page, "command").input_value()
    assert "accelerate.commands.launch" in command and "--resume" in command
    page.screenshot(path=str(workspace / "running.png"), full_page=True)
    page.click("#stop")
    page.wait_for_function("document.querySelector('#train-message').innerText"
                           ".includes('stopped')", timeout=TIMEOUT_MS)
    page.wait_for_function("document.querySelector('#train-progress').innerText"
                           ".includes('stopped')", timeout=30_000)
    assert (workspace / "runs/demo/checkpoints").is_dir()
