"""The page in a browser, issue 54 item 4's walkthrough findings: a preset loaded over
a form clears the earlier form's refusals beside the controls; help is no Tab stop; the
clip preview follows the clip settings; an optimizer's and a schedule's own options show
only where they apply.

One app and one browser for the module; each test opens its own page.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_ui_support import open_browser, running_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, object]]:
    with running_app(tmp_path_factory.mktemp("findings") / "ws") as (ctx, url), \
            open_browser() as browser:
        yield ctx, url, browser


@pytest.fixture
def page(app, tmp_path) -> Iterator[object]:
    from ui.presets import FORM_FILE

    ctx, url, browser = app
    (ctx.workspace / FORM_FILE).unlink(missing_ok=True)  # the demo preset opens by itself
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(90_000)
    try:
        page.goto(url)
        page.wait_for_selector("#check-panel .dt-ok")
        yield page
    finally:
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        page.close()


def text_of(elem_id: str) -> str:
    return f"(document.querySelector('#{elem_id}')?.innerText || '')"


def test_loading_a_preset_clears_the_earlier_forms_refusals(page) -> None:
    """A refusal beside Save caption and one beside Apply (a bad TOML) were about the
    form a preset then replaces: they go with it, the preset's own note stays."""
    page.click("#caption-save")
    page.wait_for_function(f"{text_of('caption-save-message')}.includes('click an image')")
    page.get_by_role("tab", name="Config").click()
    page.locator("#config-toml .cm-content").fill("[train]\nmax_stepz = 3\n")
    page.wait_for_timeout(1500)  # the editor hands its text to the page's state
    page.click("#config-apply")
    page.wait_for_function(f"{text_of('config-apply-message')}.includes('nothing was "
                           "applied')")
    page.locator("#preset-source input").fill("preset: demo")
    page.keyboard.press("Enter")
    page.click("#preset-load")
    page.wait_for_function(f"{text_of('preset-message')}.includes('Undo')")
    page.wait_for_function(f"{text_of('config-apply-message')} === ''")
    page.get_by_role("tab", name="Dataset").click()
    page.wait_for_function(f"{text_of('caption-save-message')} === ''")


def test_tab_goes_from_field_to_field_never_to_their_help(page) -> None:
    """The help under a label scrolls, so Chromium made it a Tab stop between two
    fields; Tab now goes from input to input, and the help is no stop at all."""
    page.get_by_role("tab", name="Training").click()
    page.focus("#f-train-checkpoint_every input")
    page.keyboard.press("Tab")
    focused = "document.activeElement.closest('[id^=f-]')?.id"
    assert page.evaluate(focused) == "f-train-keep_checkpoints"
    assert page.evaluate("document.activeElement.tagName") == "INPUT"
    for _ in range(12):
        page.keyboard.press("Tab")
        assert not page.evaluate("document.activeElement.classList.contains('info-text')")
    assert page.evaluate("[...document.querySelectorAll('.info-text')]"
                         ".every((h) => h.tabIndex === -1)")


def load_preset(page, name: str) -> None:
    page.locator("#preset-source input").fill(f"preset: {name}")
    page.keyboard.press("Enter")
    page.click("#preset-load")
    page.wait_for_function(f"{text_of('preset-message')}.includes('loaded {name}')")


def test_the_clip_preview_follows_frames_fps_clips_and_clip_count(page) -> None:
    """A video dataset's preview counts the samples its clip settings make (the demo's
    48 clips of 9 frames at 8 fps): each of fps, clips, clip_count and frames, edited,
    draws it again."""
    load_preset(page, "demo-video")
    note = text_of("preview-note")
    page.wait_for_function(f"{note}.includes('of 48 of clips (48 clip(s)')")
    steps = (("ds-fps", "4", "No usable"),  # too few frames left at 4 fps
             ("ds-fps", "16", "of 48 of clips"),
             ("ds-clip_count", "3", None),  # clips = start: one a video still
             ("ds-clips", "uniform", "of 144 of clips (144 clip(s)"),
             ("ds-clip_count", "2", "of 96 of clips (96 clip(s)"),
             ("ds-frames", "81", "No usable"))
    for elem_id, value, shows in steps:
        page.fill(f"#{elem_id} input", value)
        page.press(f"#{elem_id} input", "Enter" if elem_id == "ds-clips" else "Tab")
        if shows is not None:
            page.wait_for_function(f"{note}.includes({shows!r})")
    assert "images or clips" in page.evaluate(note)


def visible(page, elem_id: str) -> bool:
    return page.locator(f"#{elem_id}").is_visible()


def test_optimizer_and_schedule_options_show_only_where_they_apply(page) -> None:
    """Prodigy's own options show for prodigy only, LR restarts for
    cosine_with_restarts only; epsilon goes for lion, which reads none."""
    page.get_by_role("tab", name="Training").click()
    page.click("#advanced button, #advanced > .label-wrap")
    page.wait_for_selector("#f-train-optimizer input")
    assert visible(page, "f-train-optimizer_eps")
    for hidden in ("f-train-prodigy_d_coef", "f-train-prodigy_safeguard_warmup",
                   "f-train-lr_cycles", "f-train-lr_power"):
        assert not visible(page, hidden), hidden
    for elem_id, value in (("f-train-optimizer", "prodigy"),
                           ("f-train-lr_scheduler", "cosine_with_restarts")):
        page.locator(f"#{elem_id} input").fill(value)
        page.keyboard.press("Enter")
    page.wait_for_selector("#f-train-prodigy_d_coef", state="visible")
    page.wait_for_selector("#f-train-lr_cycles", state="visible")
    assert visible(page, "f-train-prodigy_safeguard_warmup")
    assert not visible(page, "f-train-lr_power")
    page.locator("#f-train-optimizer input").fill("lion")
    page.keyboard.press("Enter")
    page.wait_for_selector("#f-train-optimizer_eps", state="hidden")
    page.wait_for_selector("#f-train-prodigy_d_coef", state="hidden")


def test_extend_says_at_once_that_it_is_starting(page) -> None:
    """Between the click on Extend and the server's answer (seconds, for a run), a line
    beside the buttons says what is under way; the answer then replaces it. The
    server's events are held here until the line has been seen."""
    held: list = []
    page.get_by_role("tab", name="Training").click()
    page.route("**/queue/join**", lambda route: held.append(route))
    try:
        page.click("#extend")
        page.wait_for_function(f"{text_of('train-message')}.includes('extending: "
                               "checking the run')")
    finally:
        for route in held:
            route.continue_()
        page.unroute("**/queue/join**")  # (one held after the loop goes on with it)
    page.wait_for_function(f"!{text_of('train-message')}.includes('extending:')")
