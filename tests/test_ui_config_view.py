"""The Config tab's TOML view under overlapping checks (ui/tab_config.py `toml_view`):
the live check runs on every change and again after a fill, so the view a check reads
may still be an earlier check's text. Only text no check wrote is a user's edit."""

from __future__ import annotations

from types import SimpleNamespace

from core.config import load_config
from core.presets import preset_path

TAB = SimpleNamespace(toml="view", rendered="written")


def _view(cfg, shown: str, written) -> dict:
    from ui.tab_config import toml_view

    return toml_view(cfg, {TAB.toml: shown, TAB.rendered: written}, TAB)


def _skipped(update: dict) -> bool:
    return isinstance(update[TAB.toml], dict)  # gr.skip(): the view is left as it is


def _configs():
    from ui import presets

    first = load_config(preset_path("demo"))
    second = load_config(preset_path("demo"))
    second.datasets[0].id = "triangles"
    return first, second, presets.toml_text(first).strip(), presets.toml_text(second).strip()


def test_a_reloaded_page_gets_its_forms_toml_when_a_second_check_overtakes_the_first():
    """After a reload a first check wrote the demo's TOML (the view still empty in the
    browser) and the restored form's check comes next: it must write, not keep "edits"."""
    _, restored, first_text, restored_text = _configs()
    update = _view(restored, "", (first_text,))
    assert update[TAB.toml].strip() == restored_text
    assert update[TAB.rendered] == (first_text, restored_text)
    # the view showing an earlier check's text is no edit either
    assert _view(restored, first_text, ("older", first_text))[TAB.toml].strip() == restored_text


def test_a_users_edit_stays_until_apply_and_an_unchanged_toml_is_not_resent():
    first, restored, first_text, _ = _configs()
    edited = first_text.replace("max_steps = 400", "max_steps = 321")
    assert _skipped(_view(restored, edited, (first_text,))), "the edit is kept"
    # a check whose TOML did not change sends nothing (a slow one cannot undo a new edit)
    assert _skipped(_view(first, first_text, (first_text,)))
    # the first check of a page writes whatever the view holds
    assert _view(first, "", ())[TAB.toml].strip() == first_text
