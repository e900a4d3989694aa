"""The page in a browser, issue 25's quiet-page items: an idle page stays quiet while a
live run still shows at the 1 s pace; errors are marked at their fields with one line
beside Launch (wrapped, never cut, Launch disabled while they stand); loading a preset
can be undone; the memory line fits the machine; captioning works offline; the Dataset
tab's plots, tables and thumbnails fit.

One app and one browser for the module; each test opens its own page (a new session).
"""

from __future__ import annotations

import collections
import json
import os
import re
import statistics
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ui_browser import field, set_field
from test_ui_support import open_browser, running_app

from core.presets import PRESETS_DIR

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}
# Six looks at /dt/changes (one every 4 s) in the window: 0.25/s, or 0.29/s when the
# window's ends catch a seventh. A page that polled every 3 s would send 8 (0.33/s).
IDLE_WINDOW_S = 24
MAX_IDLE_RPS = 0.3


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, object]]:
    """(ctx, url, browser): the real app on a fresh workspace, and Chromium."""
    with running_app(tmp_path_factory.mktemp("quiet") / "ws") as (ctx, url), \
            open_browser() as browser:
        yield ctx, url, browser


def open_page(app) -> object:
    """A new page on the app at 1280x800 as a first visit: the form the last test left is
    forgotten, so the demo preset opens by itself and its check passes."""
    from ui.presets import FORM_FILE

    ctx, url, browser = app
    (ctx.workspace / FORM_FILE).unlink(missing_ok=True)
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(90_000)
    page.joins = []  # the event number of every queue join the page sends
    page.on("request", lambda r: page.joins.append(json.loads(r.post_data or "{}").get(
        "fn_index")) if "/queue/join" in r.url else None)
    page.goto(url)
    page.wait_for_selector("#check-panel .dt-ok")
    return page


@pytest.fixture
def page(app) -> Iterator[object]:
    page = open_page(app)
    try:
        yield page
    finally:
        page.close()


@pytest.fixture(scope="module", autouse=True)
def idle_page(app) -> Iterator[object]:
    """A page opened with the module and left alone: its opening (the first of the
    server, which imports diffusers for the memory line) settles while the other tests
    run, and the module's last test counts its requests."""
    page = open_page(app)
    try:
        yield page
    finally:
        page.close()


def request_name(request) -> str:
    """A request as a reader of a failure wants it: a queue join names its event's
    number and trigger (`event_names` turns the number into a name), others their URL."""
    if "/queue/join" not in request.url:
        return f"{request.method} {request.url}"
    body = json.loads(request.post_data or "{}")
    return f"join event {body.get('fn_index')} (trigger {body.get('trigger_id')})"


def event_names(page, lines: list[str]) -> list[str]:
    """`lines` with each event number followed by its api name, from the app's config."""
    with urllib.request.urlopen(page.url.rstrip("/") + "/config", timeout=30) as reply:
        names = [d.get("api_name") for d in json.load(reply)["dependencies"]]
    return [re.sub(r"event (\d+)", lambda m: f"event {m[1]} {names[int(m[1])]}", line)
            for line in lines]


def requests_per_second(page, seconds: float) -> tuple[float, list[str]]:
    """The requests the page sends over `seconds` (per second), and what they are."""
    urls: list[str] = []

    def seen(request) -> None:
        urls.append(request_name(request))

    page.on("request", seen)
    t0 = time.monotonic()
    page.wait_for_timeout(seconds * 1000)
    elapsed = time.monotonic() - t0
    page.remove_listener("request", seen)
    return len(urls) / elapsed, urls


def settle(page, deadline_s: float = 240) -> None:
    """Wait until the opening's events (fill, check, preview, memory line) are done: a
    10 s stretch with at most a few requests (the idle page's looks at /dt/changes,
    ui/idle.py; or a tick and its reply stream). A loaded machine takes longer
    than a quiet one, so a fixed wait would count the opening as idle traffic. CI once
    saw the server's first opening (its first imports of diffusers, for the memory
    line, beside test_machines on the other worker) busy for over 120 s; the idle page
    is that first opening, measured last, and a failure lists what kept it busy."""
    end = time.monotonic() + deadline_s
    urls: list[str] = []
    while time.monotonic() < end:
        _, urls = requests_per_second(page, 10)
        if len(urls) <= 4:  # 2 or 3 looks (one every 4 s), or 2 ticks (join and stream)
            return
    raise AssertionError(f"the page never settled in {deadline_s} s; its last 10 s:\n"
                         + "\n".join(event_names(page, urls[:30])))


def test_a_run_opened_on_an_idle_page_shows_new_log_lines_at_the_fast_pace(app, page) -> None:
    from bench.ui_latency import start_fake_run
    from core.runs.folder import RunFolder
    from core.runs.manager import stop_run

    ctx, _, _ = app
    page.wait_for_timeout(12_000)  # idle: the timer has stopped
    run_dir = start_fake_run(ctx.workspace)
    try:
        page.get_by_role("tab", name="Runs").click()
        page.wait_for_function("document.querySelector('#runs-choice input')?.value"
                               ".includes('latency')")
        page.click("#runs-open")
        page.wait_for_function("document.querySelector('#train-progress')?.innerText"
                               ".includes('latency')")
        delays = []
        for i in range(4):
            page.wait_for_timeout(300 + 250 * i)  # land at different points of a tick
            token = f"probe-{i}-{time.monotonic_ns()}"
            t0 = time.monotonic()
            with open(RunFolder(run_dir).log, "a", encoding="utf-8") as fh:
                fh.write(token + "\n")
            page.wait_for_function("document.querySelector('#train-log textarea').value"
                                   f".includes('{token}')", polling="raf")
            delays.append(time.monotonic() - t0)
        # The page follows the run at the fast pace (1 s ticks; at idle none run).
        # The latency target itself (a median under 1.5 s) is bench/ui_latency.py's: with
        # the other test worker training beside this browser, a tick here took up to 2.1 s.
        assert statistics.median(delays) <= 4.0 and max(delays) <= 8.0, delays
    finally:
        stop_run(run_dir, grace_s=2, handle=ctx.handle(run_dir))
        ctx.forget(run_dir)


def test_an_error_is_marked_at_its_field_and_summed_up_in_one_line_beside_launch(
        page) -> None:
    page.get_by_role("tab", name="Training").click()
    set_field(page, "f-train-learning_rate", "-0.001")
    page.wait_for_function("document.querySelector('#train-message')?.innerText"
                           ".includes('Learning rate')")
    under = ("getComputedStyle(document.querySelector('#f-train-learning_rate'), '::after')"
             ".content")
    page.wait_for_function(f"{under}.includes('greater than 0')")
    outline = page.evaluate("getComputedStyle(document.querySelector("
                            "'#f-train-learning_rate input')).outlineColor")
    assert outline == "rgb(220, 38, 38)", outline
    message = page.locator("#train-message")
    assert "1 error blocks launch" in message.inner_text()
    assert message.locator("li").count() == 0, "one line, not the check panel's list"
    line = page.evaluate("parseFloat(getComputedStyle(document.querySelector("
                         "'#train-message .dt-launch-summary')).lineHeight)")
    assert message.locator(".dt-launch-summary").bounding_box()["height"] <= 1.5 * line
    set_field(page, "f-train-learning_rate", "0.0001")
    page.wait_for_function(f"!{under}.includes('greater than 0')")


def test_a_long_refusal_beside_launch_shows_its_fix_and_launch_waits_for_it(page) -> None:
    """Issue 40 item 7: the summary beside Launch was one line cut with an ellipsis
    ("...is the same fol..."), hiding the fix at the message's end, and Launch could be
    clicked while errors stood."""
    page.get_by_role("tab", name="Training").click()
    assert not page.evaluate("document.querySelector('#launch').disabled")
    set_field(page, "f-output-dir", "demo/shapes")  # the demo's images folder
    page.wait_for_function("document.querySelector('#train-message')?.innerText"
                           ".includes('1 error blocks launch')")
    summary = "document.querySelector('#train-message .dt-launch-summary')"
    assert "pick an output folder outside" in page.locator(
        "#train-message .dt-launch-summary").inner_text()
    assert page.evaluate(f"{summary}.scrollWidth <= {summary}.clientWidth"), "nothing cut"
    right = page.evaluate(f"{summary}.getBoundingClientRect().right")
    assert right <= VIEWPORT["width"], right
    page.wait_for_function("document.querySelector('#launch').disabled")
    set_field(page, "f-output-dir", "runs/demo")
    page.wait_for_function("!document.querySelector('#launch').disabled")
    page.wait_for_function("!document.querySelector('#train-message')?.innerText"
                           ".includes('blocks launch')")


def test_loading_a_preset_over_an_edited_form_can_be_undone(page) -> None:
    page.get_by_role("tab", name="Training").click()
    set_field(page, "f-train-max_steps", "77")
    page.wait_for_timeout(1500)  # the edit reaches the server's copy of the form
    page.reload()  # the form comes back as edited, the preset no longer chosen
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('restored the form')")
    page.get_by_role("tab", name="Training").click()
    assert field(page, "f-train-max_steps").input_value() == "77"
    assert not page.locator("#preset-undo").is_visible()
    page.click("#preset-load")  # nothing chosen: told so beside the button, no toast
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('choose a preset')")
    assert page.locator(".toast-body").count() == 0
    assert field(page, "f-train-max_steps").input_value() == "77"
    page.locator("#preset-source input").fill("preset: demo")
    page.keyboard.press("Enter")
    page.click("#preset-load")
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('Undo')")
    assert field(page, "f-train-max_steps").input_value() != "77"
    page.click("#preset-undo")
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('back as it was')")
    page.wait_for_function("document.querySelector('#f-train-max_steps input').value "
                           "=== '77'")
    page.wait_for_selector("#preset-undo", state="hidden")
    # Issue 40 item 10: the dropdown no longer names the preset the form is not.
    chosen = "document.querySelector('#preset-source input').value"
    page.wait_for_function(f"{chosen} === ''")


def test_an_imported_config_is_not_named_as_the_preset(app, page, tmp_path) -> None:
    """Issue 40 item 10: after a TOML import the dropdown still said "preset: demo"."""
    ctx, _, _ = app
    chosen = "document.querySelector('#preset-source input').value"
    # The preset loaded here, not left to the opening: a previous page's last check,
    # still in flight, may save its form again after open_page removed it.
    page.locator("#preset-source input").fill("preset: demo")
    page.keyboard.press("Enter")
    page.click("#preset-load")
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('Undo')")
    page.wait_for_function(f"{chosen} === 'preset: demo'")
    edited = tmp_path / "mine.toml"
    edited.write_text((PRESETS_DIR / "demo.toml").read_text().replace(
        "max_steps = 400", "max_steps = 123"))
    page.get_by_role("tab", name="Config").click()
    page.set_input_files("#config-upload input[type=file]", str(edited))
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('imported')")
    page.wait_for_function(f"{chosen} === ''")


def test_saving_a_caption_before_choosing_an_image_says_so_beside_the_button(page) -> None:
    page.click("#caption-save")
    page.wait_for_function("document.querySelector('#caption-save-message')?.innerText"
                           ".includes('click an image of the preview first')")
    assert page.locator(".toast-body").count() == 0


def test_the_demo_captions_new_images_offline_with_its_tiny_captioner(app, page) -> None:
    from PIL import Image

    ctx, _, _ = app
    new = [ctx.workspace / f"demo/shapes/zz_new_{i}.png" for i in range(2)]
    for i, path in enumerate(new):  # two pictures without a caption
        Image.new("RGB", (64, 64), (200, 40 * i, 40)).save(path)
    assert all(p.exists() and not p.with_suffix(".txt").exists() for p in new)
    page.click("#caption-area button, #caption-area .label-wrap")
    page.wait_for_selector("#caption-start")
    assert field(page, "f-captioning-model").input_value() == "tiny:blip"
    page.click("#caption-start")
    page.wait_for_function("document.querySelector('#caption-message')?.innerText"
                           ".includes('captioning done')", timeout=240_000)
    captions = [p.with_suffix(".txt").read_text(encoding="utf-8").strip() for p in new]
    assert all(captions), captions
    for path in new:  # the next tests open on the demo's own pictures
        path.unlink()
        path.with_suffix(".txt").unlink()


def test_many_captions_are_edited_at_once_previewed_first_and_undone(app, page) -> None:
    """Issue 40 item 20: a trigger word put first in every caption of the selected
    dataset: Preview writes nothing, Apply writes every .txt (the preview table and the
    tags show it), Undo puts every file back byte for byte."""
    ctx, _, _ = app
    folder = ctx.workspace / "demo/shapes"
    before = {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt"))}
    message = "document.querySelector('#bulk-message')?.innerText"
    page.click("#bulk-area button, #bulk-area .label-wrap")
    page.wait_for_selector("#bulk-preview")
    page.click("#bulk-kind input")
    page.get_by_role("option", name="Add a trigger word first").click()
    field(page, "bulk-find").fill("sks")
    page.click("#bulk-preview")
    page.wait_for_function(f"{message}.includes('{len(before)} caption(s) would change')")
    assert {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt"))} == before
    assert "sks, " in page.inner_text("#bulk-changes")
    page.click("#bulk-apply")
    page.wait_for_function(f"{message}.includes('changed {len(before)} caption(s)')")
    assert all(p.read_text(encoding="utf-8").startswith("sks, ") for p in folder.glob("*.txt"))
    page.wait_for_function("document.querySelector('#preview-captions')?.innerText"
                           ".includes('sks, ')")
    page.click("#bulk-show-tags")
    page.wait_for_function("document.querySelector('#bulk-tags')?.innerText.includes('sks')")
    page.locator("#bulk-area").scroll_into_view_if_needed()
    shots = Path(os.environ.get("UI_SHOTS_DIR") or ctx.workspace.parent)
    page.screenshot(path=str(shots / "bulk-captions.png"), full_page=True)
    page.click("#bulk-undo")
    page.wait_for_function(f"{message}.includes('restored {len(before)} caption(s)')")
    assert {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt"))} == before
    assert page.locator(".toast-body").count() == 0


def test_the_config_tab_exports_in_one_click_and_applies_a_pasted_config(page) -> None:
    """Issue 40 item 14: Export downloads at the first click; the TOML view takes an
    edited or pasted config: Apply names a bad key beside the button and changes nothing,
    a good one fills the form."""
    page.get_by_role("tab", name="Config").click()
    with page.expect_download(timeout=60_000) as download:
        page.click("#config-export")
    text = Path(download.value.path()).read_text(encoding="utf-8")
    assert download.value.suggested_filename == "my-config.toml" and "[train]" in text
    editor = page.locator("#config-toml .cm-content")
    editor.fill(text.replace("max_steps =", "max_stepz ="))
    # The editor hands its text to the page's state after the keystrokes: a click in the
    # same instant applied the text before it (seen once in a full run under load).
    page.wait_for_timeout(1500)
    page.click("#config-apply")
    page.wait_for_function("document.querySelector('#config-apply-message')?.innerText"
                           ".includes('train.max_stepz')")
    assert "nothing was applied" in page.inner_text("#config-apply-message")
    assert page.locator(".toast-body").count() == 0
    editor.fill(re.sub(r"\nmax_steps = \d+\n", "\nmax_steps = 321\n", text))
    # A form change before Apply (the live check rewrites the view from the form) keeps
    # the typed TOML: it once replaced it, and Apply then applied the form to itself.
    page.get_by_role("tab", name="Training").click()
    set_field(page, "f-train-learning_rate", "0.0002")
    page.wait_for_timeout(1500)
    page.get_by_role("tab", name="Config").click()
    # (CodeMirror renders only the lines in view, so the text is judged by what Apply
    # applies below.)
    page.click("#config-apply")
    page.wait_for_function("document.querySelector('#config-apply-message')?.innerText"
                           ".includes('the form now holds this TOML')")
    page.get_by_role("tab", name="Training").click()
    page.wait_for_function("document.querySelector('#f-train-max_steps input')?.value"
                           " === '321'")


def test_the_dataset_and_training_tabs_fit(page) -> None:
    """The histogram's legend is whole and its bars say their counts; long help is
    three lines high, the rest scrolling inside (hovering moves nothing)."""
    page.wait_for_function("document.querySelector('#bucket-histogram')?.innerText"
                           ".includes('128x128 (')")
    page.wait_for_selector("#bucket-histogram g.role-legend-entry")
    # Measured in one go in the page: the plot redraws when the check's data arrives, and
    # a legend read between two draws has no box. A clipped legend never passes.
    page.wait_for_function("""(() => {
        const block = document.querySelector('#bucket-histogram');
        const legend = block?.querySelector('g.role-legend');
        if (!legend) return false;
        const l = legend.getBoundingClientRect(), b = block.getBoundingClientRect();
        return l.height > 0 && l.bottom <= b.bottom;
    })()""", timeout=30_000)
    page.get_by_role("tab", name="Training").click()
    info = page.locator("#f-train-lora_kind .info-text")
    line = page.evaluate("parseFloat(getComputedStyle(document.querySelector("
                         "'#f-train-lora_kind .info-text')).lineHeight)")
    height = info.bounding_box()["height"]
    assert height <= 3.5 * line
    info.hover()
    assert info.bounding_box()["height"] == height, "hovering the help moves the page"
    assert page.evaluate("(e => e.scrollHeight > e.clientHeight)(document.querySelector("
                         "'#f-train-lora_kind .info-text'))"), "the rest of the help scrolls"


def test_a_gated_model_preset_says_how_to_get_access(page) -> None:
    page.locator("#preset-source input").fill("preset: flux-lora")
    page.keyboard.press("Enter")
    page.click("#preset-load")
    page.wait_for_function("document.querySelector('#preset-message')?.innerText"
                           ".includes('gated')")
    text = page.inner_text("#preset-message")
    assert "https://huggingface.co/black-forest-labs/FLUX.1-dev" in text
    assert "HF_TOKEN" in text


def test_an_idle_page_makes_at_most_a_request_every_few_seconds(idle_page) -> None:
    """Last: the runs and the captioning job of the tests before have ended, and the
    page's timer has stopped after a tick or two: it only looks at /dt/changes."""
    page = idle_page
    settle(page)
    rate, urls = requests_per_second(page, IDLE_WINDOW_S)
    assert rate <= MAX_IDLE_RPS, (f"{rate:.2f} requests/s from an idle page (at most "
                                  f"{MAX_IDLE_RPS}):\n" + "\n".join(event_names(page, urls[:20])))
    # Nobody typed on this page: the events of the form's edits (the live check, the
    # memory estimate) ran after its opening fill (and a captioning job's end), not once
    # per field a fill wrote (26 checks and up to 27 estimates an opening on .change).
    with urllib.request.urlopen(page.url.rstrip("/") + "/config", timeout=30) as reply:
        dependencies = json.load(reply)["dependencies"]
    on_edits = {i for i, d in enumerate(dependencies) if len(d["targets"]) > 100}
    runs = collections.Counter(i for i in page.joins if i in on_edits)
    assert len(on_edits) >= 2 and all(n <= 3 for n in runs.values()), event_names(
        page, [f"event {i} ran {n} times" for i, n in runs.items()])
