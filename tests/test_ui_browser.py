"""The page in headless Chromium: load the demo, see a cache-folder conflict appear and go,
edit a caption, launch, watch the log grow and a validation image arrive, stop, and keep
a screenshot (under the test's tmp_path, printed at the end)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_ui_support import CHROMIUM_ARGS, chromium, free_port, running_app

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
    assert "1 error blocks launch" in text and "datasets.0.vae_cache" in text
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
    page.wait_for_function("document.querySelector('#caption-save-message')?.innerText"
                           ".includes('caption saved to')")
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
    # The Stop event writes the message; the progress line is the next tick's (1 s while
    # a run lives), as after the first stop: a loaded machine showed it still "running".
    page.wait_for_function("document.querySelector('#train-progress').innerText"
                           ".includes('stopped')", timeout=30_000)


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
    assert "core.runs.accelerate_launch" in command and "--resume" in command
    page.screenshot(path=str(workspace / "running.png"), full_page=True)
    page.click("#stop")
    page.wait_for_function("document.querySelector('#train-message').innerText"
                           ".includes('stopped')", timeout=TIMEOUT_MS)
    page.wait_for_function("document.querySelector('#train-progress').innerText"
                           ".includes('stopped')", timeout=30_000)
    assert (workspace / "runs/demo/checkpoints").is_dir()


# The marks Vega draws for each series of the loss plot: (series, stroke colour, path length).
LINE_MARKS_JS = """Array.from(document.querySelectorAll(
  '#loss-plot svg path[aria-roledescription="line mark"]')).map(e => [
  (e.getAttribute('aria-label') || '').split('series: ')[1] || '',
  e.getAttribute('stroke') || '', (e.getAttribute('d') || '').length])"""


def test_live_loss_plot_draws_train_steps_that_arrive_after_the_first_eval(tmp_path: Path):
    """The trainer evaluates at step 0, before any step: that lone point draws no line, so
    the plot waits; the train curve that follows must be drawn in its colour, with a
    legend, beside the eval curves."""
    import gradio as gr
    from playwright.sync_api import sync_playwright

    from core.runs.status import append_event
    from ui import run_views
    from ui.context import AppContext

    executable = chromium()
    run = tmp_path / "ws/runs/live"
    run.mkdir(parents=True)
    append_event(run, {"type": "eval", "step": 0, "loss": 0.5, "loss_shuffled": 0.52})
    ctx = AppContext(tmp_path / "ws")
    following = run_views.follow(ctx, run, log_offset=0)
    with gr.Blocks() as demo:
        view = run_views.RunView(gr.State(None), gr.HTML(), gr.Textbox(),
                                 run_views.loss_plot(), gr.Gallery(), gr.Textbox(),
                                 gr.Markdown())
        gr.Timer(0.3).tick(lambda: run_views.tick(ctx, view, following), None, view.polled())
    demo.launch(server_port=free_port(), prevent_thread_lock=True, quiet=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(demo.local_url)
            page.wait_for_timeout(3000)  # ten ticks: the step-0 eval has been read
            assert page.evaluate(f"{LINE_MARKS_JS}.length") == 0
            for step in range(1, 41):
                append_event(run, {"type": "step", "step": step, "loss": 0.9 - step / 100})
            append_event(run, {"type": "eval", "step": 40, "loss": 0.4, "loss_shuffled": 0.45})
            page.wait_for_function(f"{LINE_MARKS_JS}.some(m => m[0] === 'train' && m[2] > 200)",
                                   timeout=60_000)
            marks = {name: stroke for name, stroke, _ in page.evaluate(LINE_MARKS_JS)}
            assert marks["train"].startswith("#"), f"train drawn without a colour: {marks}"
            assert len({marks["train"], marks["eval"], marks["eval (shuffled captions)"]}) == 3
            legend = page.inner_text("#loss-plot")
            assert "train" in legend and "eval (shuffled captions)" in legend
        finally:
            shot = tmp_path / "loss-plot.png"
            page.locator("#loss-plot").screenshot(path=str(shot))
            print(f"screenshot: {shot}")
            browser.close()
            demo.close()
            ctx.close()


def test_out_of_range_numbers_are_named_by_label_and_the_checks_keep_up(tmp_path: Path):
    """A negative learning rate or 0 max steps is named by the field's label beside
    Launch and in the check panel, goes when fixed, and never stops the live check."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with running_app(tmp_path / "ws") as (ctx, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        message = "document.querySelector('#train-message').innerText"
        try:
            page.goto(url)
            page.click("#preset-load")
            page.wait_for_selector("#check-panel .dt-ok")
            page.get_by_role("tab", name="Training").click()
            set_field(page, "f-train-learning_rate", "-0.001")
            page.wait_for_function(f"{message}.includes('Learning rate')")
            text = page.inner_text("#train-message")
            assert "train.learning_rate" in text and "greater than 0" in text, text
            assert "Learning rate" in page.inner_text("#check-panel")
            page.locator("#train-message").screenshot(path=str(tmp_path / "launch-message.png"))
            set_field(page, "f-train-learning_rate", "0.0001")
            page.wait_for_function(f"!{message}.includes('Learning rate')")
            page.wait_for_selector("#check-panel .dt-ok", state="attached")
            set_field(page, "f-train-max_steps", "0")
            page.wait_for_function(f"{message}.includes('Max steps')")
            page.get_by_role("tab", name="Dataset").click()
            set_field(page, "ds-images", "no/such/folder")  # max steps still 0
            page.wait_for_function("document.querySelector('#check-panel').innerText"
                                   ".includes('Images folder (dataset 1)')")
            panel = page.inner_text("#check-panel")
            assert "Max steps" in panel and "datasets.0.images" in panel, panel
            assert "minimum" not in page.inner_text("body"), "Gradio's own range toast"
        finally:
            shot = tmp_path / "form-problems.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            browser.close()


def test_the_validation_grid_shows_each_prompt_at_each_round(tmp_path: Path):
    """Issue 40 item 16: the Training tab's prompt x step grid, its rows labelled by the
    prompts without their flags, its images served from the run folder."""
    import gradio as gr
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from core.config import Config, save_config
    from ui import run_views
    from ui.context import AppContext

    run = tmp_path / "ws/runs/grid"
    cfg = Config()
    cfg.validation.prompts = ["a red circle --w 96", "a blue square"]
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    for step in (0, 10, 20):
        folder = run / f"validation/step_{step:06d}"
        folder.mkdir(parents=True)
        for n, colour in enumerate(("red", "blue")):
            Image.new("RGB", (96, 64), colour).save(folder / f"{n:02d}.png")
    ctx = AppContext(tmp_path / "ws", monitor=False)
    following = run_views.follow(ctx, run, log_offset=0)
    with gr.Blocks() as demo:
        view = run_views.RunView(gr.State(None), gr.HTML(), gr.Textbox(),
                                 run_views.loss_plot(), gr.Gallery(), gr.Textbox(),
                                 gr.Markdown(), grid=gr.HTML(elem_id="validation-grid"))
        gr.Timer(0.3).tick(lambda: run_views.tick(ctx, view, following), None, view.polled())
    # The app serves the workspace (ui/app.py): the grid's images are its files.
    demo.launch(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                allowed_paths=[str(ctx.workspace)])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(demo.local_url)
            page.wait_for_function("[...document.querySelectorAll('#validation-grid img')]"
                                   ".filter(i => i.complete && i.naturalWidth === 96)"
                                   ".length === 6", timeout=60_000)
            rows = page.locator("#validation-grid tbody tr").all_inner_texts()
            assert [r.strip() for r in rows] == ["a red circle", "a blue square"], rows
            head = page.inner_text("#validation-grid thead")
            assert "before (step 0)" in head and "step 10" in head and "step 20" in head
        finally:
            page.locator("#validation-grid").screenshot(path=str(tmp_path / "grid.png"))
            browser.close()
            demo.close()
            ctx.close()
