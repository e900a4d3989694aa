"""What a person sees, in headless Chromium: the page opens on the demo preset (no Load
click), a rename reaches the dataset list, the histogram's bars and the preview note, a
mistyped model folder is named on the Training tab as it is typed, and a refresh
restores the form (the Config tab's TOML included); Export writes the Save-as name."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_ui_browser import field, set_field
from test_ui_support import CHROMIUM_ARGS, chromium, open_browser, running_app

pytestmark = pytest.mark.slow

BARS = ("Array.from(document.querySelectorAll('#bucket-histogram g.mark-rect path'))"
        ".some(p => p.getBBox().height > 1)")


def test_the_form_opens_filled_follows_a_rename_and_survives_a_refresh(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    shots = tmp_path / "shots"
    shots.mkdir()
    # where the demo builds its tiny model (the mistyped path's parent exists)
    (tmp_path / "ws/models/tiny-sd15-shapes").mkdir(parents=True)
    with running_app(tmp_path / "ws") as (ctx, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        try:
            page.goto(url)
            page.wait_for_selector("#check-panel .dt-ok")  # the demo, without a click
            assert field(page, "ds-id").input_value() == "shapes"
            page.wait_for_function(BARS)
            set_field(page, "ds-id", "triangles")
            page.wait_for_function("document.querySelector('#ds-selector')?.innerText"
                                   ".includes('1. triangles')")
            page.wait_for_function("document.querySelector('#preview-note')?.innerText"
                                   ".includes('triangles')")
            page.wait_for_function("document.querySelector('#check-panel')?.innerText"
                                   ".includes('triangles: 72 image(s)')")
            page.wait_for_timeout(1000)
            assert page.evaluate(BARS), "the histogram draws the renamed dataset's bars"
            page.screenshot(path=str(shots / "renamed.png"), full_page=True)
            page.get_by_role("tab", name="Training").click()
            set_field(page, "f-model-path", "models/tiny-sd51")
            page.wait_for_function("document.querySelector('#model-path-check')?.innerText"
                                   ".includes('does not exist')")
            text = page.inner_text("#model-path-check")
            assert "models/tiny-sd51 does not exist" in text and "HF cache" not in text
            assert "did you mean" in text and "tiny-sd15-shapes" in text
            page.screenshot(path=str(shots / "model-path.png"), full_page=True)
            page.wait_for_timeout(1500)  # the kept form catches up with the last edit
            page.reload()
            page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                                   ".includes('restored')")
            assert field(page, "ds-id").input_value() == "triangles"
            assert "1. triangles" in page.inner_text("#ds-selector")
            page.get_by_role("tab", name="Config").click()
            page.wait_for_function("document.querySelector('#config-toml')?.innerText"
                                   ".includes('id = \"triangles\"')")
            assert 'path = "models/tiny-sd51"' in page.inner_text("#config-toml")
            set_field(page, "config-name", "after-refresh")
            page.click("#config-export")
            page.wait_for_selector("#config-file a")
            exported = ctx.workspace / "configs/exports/after-refresh.toml"
            assert 'id = "triangles"' in exported.read_text()
            page.screenshot(path=str(shots / "restored-config.png"), full_page=True)
        finally:
            print(f"screenshots: {shots}")
            browser.close()


def test_the_dataset_advanced_section_edits_masks_and_names_a_conflict(tmp_path: Path):
    """The Dataset tab's Advanced accordion shows the schema's advanced dataset keys; a
    masks folder inside the images folder is named in the check panel as it is typed.
    The video keys (frames, fps, clips) show only once model.family is a video family."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with running_app(tmp_path / "ws") as (ctx, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        try:
            page.goto(url)
            page.wait_for_selector("#check-panel .dt-ok")
            (tmp_path / "ws/demo/shapes/masks").mkdir(parents=True, exist_ok=True)
            page.locator("#ds-advanced").get_by_text("Advanced").first.click()
            # The accordion opens on the next render: waited for, not read at once (a
            # clean-clone run read it hidden).
            page.wait_for_selector("#ds-regularization", state="visible")
            set_field(page, "ds-masks", "demo/shapes/masks")
            page.wait_for_function("document.querySelector('#check-panel')?.innerText"
                                   ".includes('Loss masks folder')")
            text = page.inner_text("#check-panel")
            assert "is inside" in text and "masks would be read as training images" in text
            page.screenshot(path=str(tmp_path / "masks.png"), full_page=True)
            assert not page.locator("#ds-frames").is_visible()  # sd15: stills only
            page.get_by_role("tab", name="Training").click()
            assert not page.locator("#f-validation-frames").is_visible()
            page.click("#f-model-family input")
            page.get_by_role("option", name="wan", exact=True).first.click()
            page.wait_for_selector("#f-validation-frames", state="visible")
            page.get_by_role("tab", name="Dataset").click()
            page.wait_for_selector("#ds-frames", state="visible")
            assert page.locator("#ds-clips").is_visible()
            page.screenshot(path=str(tmp_path / "video-keys.png"), full_page=True)
        finally:
            browser.close()


def test_the_caption_editor_keeps_its_image_and_text_across_a_dataset_switch(
        tmp_path: Path) -> None:
    """Issue 40 item 8: with a caption typed for an image of one dataset, choosing
    another dataset kept the editor's image and text but Save refused it ("click an image
    of the preview first"), and the typed text went with the next click. Now the editor
    says whose caption it holds and Save writes it there."""
    from conftest import write_shapes

    workspace = tmp_path / "ws"
    write_shapes(workspace / "more", 3, captions=["another set"])
    typed = "a purple circle typed before switching"
    with running_app(workspace) as (ctx, url), open_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        try:
            page.goto(url)
            page.wait_for_selector("#check-panel .dt-ok")
            page.wait_for_selector("#preview img")
            page.locator("#preview img").first.click()
            page.wait_for_function("document.querySelector('#caption-edit textarea')"
                                   ".value.length")
            field(page, "caption-edit").fill(typed)
            page.click("#ds-add")
            page.wait_for_function("document.querySelector('#ds-selector')?.innerText"
                                   ".includes('2.')")
            set_field(page, "ds-images", "more")
            set_field(page, "ds-vae_cache", "cache/more/vae")
            page.wait_for_function("document.querySelector('#preview-note')?.innerText"
                                   ".includes('of 3')")
            page.wait_for_function("document.querySelector('#caption-save-message')"
                                   "?.innerText.includes('not among the images shown')")
            assert field(page, "caption-edit").input_value() == typed
            page.click("#caption-save")
            page.wait_for_function("document.querySelector('#caption-save-message')"
                                   "?.innerText.includes('caption saved to')")
            saved = [p for p in (workspace / "demo/shapes").glob("*.txt")
                     if p.read_text().strip() == typed]
            assert len(saved) == 1, "written to the image the editor named"
            assert all(p.read_text().strip() == "another set"
                       for p in (workspace / "more").glob("*.txt"))
        finally:
            page.close()
