"""The page in a browser, issue 40's cosmetic items: an idle page draws no animation
frames (Gradio's page loader left a status timer running at 60 frames a second, about
10% of a core: ui/gradio_fixes.py) and sends no Gradio event (each cost its renderer
150 to 300 ms: ui/idle.py), yet follows a run started elsewhere; a dropdown left with
Tab closes its options; long captions show whole in the preview table and as the
gallery labels' tooltips; a loss series with one point shows as a dot.

One app and one browser for the module; each test opens its own page.
"""

from __future__ import annotations

import glob
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port
from test_queue import fake_live_run
from test_ui_quiet_browser import request_name, settle
from test_ui_support import open_browser, running_app

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}
# Every animation frame's time, from before Gradio's modules take requestAnimationFrame.
FRAME_TIMES = ("window.__frames = []; const raf = window.requestAnimationFrame.bind(window);"
               "window.requestAnimationFrame = (cb) => raf((t) => {"
               " window.__frames.push(performance.now()); return cb(t); });")
IDLE_WINDOW_MS = 60_000  # the opening's events under load, then the quiet stretch
QUIET_GAP_MS = 3_000
LONG = ("a very long caption about a red circle on a pale grey background, drawn with a "
        "soft edge, slightly off centre, long enough to be cut short in any thumbnail")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, object]]:
    with running_app(tmp_path_factory.mktemp("cosmetics") / "ws") as (ctx, url), \
            open_browser() as browser:
        yield ctx, url, browser


@pytest.fixture
def page(app) -> Iterator[object]:
    from ui.presets import FORM_FILE

    ctx, url, browser = app
    (ctx.workspace / FORM_FILE).unlink(missing_ok=True)  # the demo preset opens by itself
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(90_000)
    page.add_init_script(FRAME_TIMES)
    try:
        page.goto(url)
        page.wait_for_selector("#check-panel .dt-ok")
        yield page
    finally:
        page.close()


def test_the_served_status_tracker_stops_its_timer_with_its_element() -> None:
    import gradio

    from ui.gradio_fixes import MARK, patch_status_tracker

    assets = Path(gradio.__file__).parent / "templates/frontend/assets"
    (source,) = glob.glob(str(assets / "statustracker-*.js"))
    patched = patch_status_tracker(Path(source).read_text(encoding="utf-8"))
    assert patched is not None and patched.count(MARK) == 1, \
        "this Gradio's status tracker has another shape: update ui/gradio_fixes.py"


def test_the_served_layout_lookup_finds_the_node_gradios_walk_finds(app) -> None:
    """ui/gradio_fixes.py indexes Gradio's layout lookup: on a tree with repeated ids it
    answers what Gradio's own walk answers (the first node in the walk's order, null for
    an id not there), and once the task has ended it sees a replaced subtree."""
    import re

    import gradio

    from ui.gradio_fixes import INDEXED_LOOKUP, LOOKUP, LOOKUP_MARK, patch_layout_lookup

    assets = Path(gradio.__file__).parent / "templates/frontend/assets"
    (core,) = glob.glob(str(assets / "core-*.js"))
    source = Path(core).read_text(encoding="utf-8")
    patched = patch_layout_lookup(source)
    assert patched is not None and patched.count(LOOKUP_MARK) == 1, \
        "this Gradio's layout lookup has another shape: update ui/gradio_fixes.py"
    original = LOOKUP.search(source)
    walk = re.sub(rf"\b{re.escape(original[1])}\(", "walk(", original[0])
    page = app[2].new_page()
    try:
        found = page.evaluate(f"""async () => {{
            {walk} {INDEXED_LOOKUP.format(name="indexed")}
            let seed = 7;
            const rand = (n) => (seed = (seed * 1103515245 + 12345) % 2147483648) % n;
            // 400 nodes, level by level, 1 to 4 children each; 300 ids, so some repeat
            const root = {{id: rand(300), children: []}};
            const queue = [root];
            let made = 1;
            for (let i = 0; made < 400; i++) {{
                for (let k = 0; k <= i % 4 && made < 400; k++, made++) {{
                    const child = {{id: rand(300), children: []}};
                    queue[i].children.push(child);
                    queue.push(child);
                }}
            }}
            const ids = [...Array(320).keys()];
            const same = ids.every((id) => walk(root, id) === indexed(root, id));
            root.children = [{{id: 5000, children: []}}];
            await new Promise((done) => setTimeout(done, 0));
            return {{same, made, replaced: indexed(root, 5000) !== null
                     && indexed(root, 5000) === walk(root, 5000)}};
        }}""")
    finally:
        page.close()
    assert found["made"] >= 300, found  # a tree of that size, with ids repeated
    assert found["same"] and found["replaced"], found


def test_an_idle_page_draws_no_animation_frames(page) -> None:
    """An idle page draws nothing (no tick runs; a look at the server every few seconds
    draws no frame): a stretch of 3 s without an animation frame comes once the opening
    is done. A status timer left running draws 60 frames a second, and no such stretch
    ever comes. Deterministic where CPU time is not (2 busy cores)."""
    page.evaluate("window.__since = performance.now()")
    quiet = ("performance.now() - Math.max(window.__since, ...window.__frames.slice(-1))"
             f" >= {QUIET_GAP_MS}")
    try:  # polled by timers, not by animation frames
        page.wait_for_function(quiet, polling=250, timeout=IDLE_WINDOW_MS)
    except Exception:  # noqa: BLE001 - said as what the page drew
        frames = page.evaluate("window.__frames.filter(t => t > performance.now() - 3000)")
        raise AssertionError(f"no {QUIET_GAP_MS} ms without an animation frame in "
                             f"{IDLE_WINDOW_MS} ms; the last 3 s drew {len(frames)}") from None


def test_a_dropdown_left_with_tab_closes_its_options(page, tmp_path: Path) -> None:
    """Tab into the Captions dropdown opens its options; Tab on closes them (they stayed
    over the fields below). A click still opens them and picks an option."""
    page.locator("#ds-vae_cache input, #ds-vae_cache textarea").first.click()
    page.keyboard.press("Tab")  # into the Captions dropdown
    page.wait_for_function("document.activeElement.closest('#ds-caption') !== null")
    for _ in range(3):  # the instance prompt, the crop dropdown, the resolution
        page.keyboard.press("Tab")
    page.wait_for_function("document.activeElement.closest('#ds-resolution') !== null")
    page.wait_for_timeout(500)
    shown = page.evaluate("Array.from(document.querySelectorAll('ul.option-list'))"
                          ".filter(u => u.getBoundingClientRect().height > 0).length")
    page.screenshot(path=str(tmp_path / "dropdown-tab.png"))
    assert shown == 0, f"{shown} dropdown option list(s) left open"
    page.locator("#ds-crop input").click()
    page.locator("ul.option-list li").filter(has_text="random").first.click()
    page.wait_for_function("document.querySelector('#ds-crop input').value === 'random'")


def test_long_captions_show_whole_in_the_table_and_as_gallery_tooltips(app, page,
                                                                      tmp_path: Path) -> None:
    ctx, _, _ = app
    for text in sorted((ctx.workspace / "demo/shapes").glob("*.txt"))[:6]:
        text.write_text(f"{LONG} {text.stem}", encoding="utf-8")
    page.get_by_role("button", name="Refresh preview").click()
    page.wait_for_function("document.querySelector('#preview-captions')?.innerText"
                           ".includes('very long')", timeout=60_000)
    page.wait_for_timeout(1000)
    cut = page.evaluate("""(() => {
        const box = document.querySelector('#preview-captions').getBoundingClientRect();
        return Array.from(document.querySelectorAll('#preview-captions td'))
            .filter(td => td.innerText.includes('very long')
                          && td.getBoundingClientRect().height > 0)
            .filter(td => td.getBoundingClientRect().right > box.right + 1).length;
    })()""")
    page.locator("#preview-captions").screenshot(path=str(tmp_path / "preview-captions.png"))
    assert cut == 0, f"{cut} caption cell(s) run past the table's right edge"
    label = page.locator("#preview .caption-label").first
    label.hover()
    page.wait_for_function("document.querySelector('#preview .caption-label')?.title"
                           ".includes('cut short in any thumbnail')")


def test_a_loss_series_with_one_point_is_drawn_as_a_dot(app, tmp_path: Path) -> None:
    """A short run's only eval (step 0) beside a train curve: a line of no length, drawn
    as a round dot, whole in the plot's corner (step 0, the lowest loss)."""
    import gradio as gr
    import pandas as pd

    from ui import run_views
    from ui.app import CSS

    rows = [(s, 0.9 - s / 100, "train") for s in range(1, 11)] + [(0, 0.5, "eval")]
    frame = pd.DataFrame(rows, columns=["step", "loss", "series"])
    with gr.Blocks() as demo:
        plot = run_views.loss_plot()
        demo.load(lambda: frame, None, plot)
    demo.launch(server_port=free_port(), prevent_thread_lock=True, quiet=True, css=CSS)
    page = app[2].new_page(viewport={"width": 1000, "height": 700})
    try:
        page.goto(demo.local_url)
        marks = "#loss-plot path[aria-roledescription='line mark']"
        page.wait_for_function(f"document.querySelectorAll(\"{marks}\").length >= 2")
        widths = page.evaluate(f"""Array.from(document.querySelectorAll("{marks}"))
            .map(e => [(e.getAttribute('aria-label') || '').split('series: ')[1],
                       e.getAttribute('d'), getComputedStyle(e).strokeWidth,
                       getComputedStyle(e).strokeLinecap,
                       getComputedStyle(e.closest('g.mark-line')).clipPath])""")
        page.locator("#loss-plot").screenshot(path=str(tmp_path / "one-point.png"))
    finally:
        page.close()
        demo.close()
    (dot,) = [w for w in widths if w[0] == "eval"]
    assert dot[1].endswith("Z") and "L" not in dot[1], dot
    assert float(dot[2].removesuffix("px")) >= 8 and dot[3] == "round", dot
    assert dot[4] == "none", "a dot in the plot's corner is drawn whole, not a quarter"
    (train,) = [w for w in widths if w[0] == "train"]
    assert train[2] == "2px", "a line keeps its own width"


def changes(url: str) -> int:
    """The number the idle page's script watches (ui/idle.py)."""
    with urllib.request.urlopen(url.rstrip("/") + "/dt/changes", timeout=10) as reply:
        return json.load(reply)["changes"]


def test_an_idle_page_sends_no_event_yet_follows_a_run_started_elsewhere(app, page) -> None:
    """At idle the page's timer stops: for 12 s it sends no Gradio event (a queue join),
    only its looks at /dt/changes. A run the CLI starts (a registered live run) moves
    that number, and the page follows the run within a look and a tick of it. Last in
    the module: the run it leaves behind would be the run a later page opens on."""
    from ui.idle import POLL_S

    ctx, url, _ = app
    page.get_by_role("tab", name="Training").click()
    settle(page)
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request_name(request)))
    page.wait_for_timeout(12_000)
    events = [name for name in seen if name.startswith("join")]
    looks = [name for name in seen if "/dt/changes" in name]
    assert not events and len(looks) >= 2, seen
    before = changes(url)
    live, sleeper = fake_live_run(ctx.workspace, "elsewhere")
    try:
        while changes(url) == before:  # the server looks at most once a second
            time.sleep(0.1)
        moved = time.monotonic()
        page.wait_for_function("(document.querySelector('#train-progress')?.innerText || '')"
                               ".includes('now following runs/elsewhere')", timeout=30_000)
        shown_s = time.monotonic() - moved
    finally:
        sleeper.kill()
        sleeper.wait()
    # A look (every POLL_S) sees the new number, then one tick (about a second here).
    assert shown_s <= POLL_S + 4, f"the run showed {shown_s:.1f} s after the number moved"
