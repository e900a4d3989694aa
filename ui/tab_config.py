"""Presets and config files: load a preset or a saved config into the form (top bar),
save the form as TOML that `python app.py --no-ui --config FILE` accepts unchanged,
export it as a download (one click), import a TOML file, and see the form as TOML live,
where a config can also be edited or pasted and applied to the form (its problems shown
beside Apply)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ui import presets, render
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form


@dataclass
class PresetBar:
    source: gr.Dropdown
    load: gr.Button
    message: gr.HTML
    undo: gr.Button  # shown after a load or an import replaced the form
    before: gr.State  # the form's config before that, which Undo puts back


@dataclass
class ConfigTab:
    name: gr.Textbox
    save: gr.Button
    export: gr.Button
    download: gr.File
    upload: gr.File
    toml: gr.Code
    message: gr.HTML
    apply: gr.Button  # the TOML view, edited or pasted, into the form
    apply_message: gr.HTML  # beside Apply: what was wrong with the TOML
    # The TOML the app last wrote into the view: a view that differs holds the user's
    # edits, which the live check must not overwrite before they are applied.
    rendered: gr.State


def build_bar(ctx: AppContext) -> PresetBar:
    choices = presets.sources(ctx)
    default = presets.PRESET_PREFIX + "demo"
    # Buttons of their own size (not the dropdown's height): Launch stays the page's
    # largest control.
    with gr.Row(equal_height=False):
        source = gr.Dropdown(label="Preset or saved config", choices=choices,
                             value=default if default in choices else None, scale=3,
                             elem_id="preset-source")
        load = gr.Button("Load into the form", scale=0, min_width=180,
                         elem_id="preset-load")
        undo = gr.Button("Undo the load", visible=False, scale=0, min_width=160,
                         elem_id="preset-undo")
    message = gr.HTML("", elem_id="preset-message")
    return PresetBar(source, load, message, undo, gr.State(None))


# The texts the checks wrote into the view that still count as theirs: checks overlap
# (the live check on each change, and again after a fill), so the view a check reads may
# be one an earlier check wrote, not yet replaced by the last one's.
WRITTEN_KEPT = 8


def written_texts(value: Any) -> tuple[str, ...]:
    """The view's texts the checks wrote, oldest first (the `rendered` State)."""
    if isinstance(value, str):
        return (value.strip(),) if value.strip() else ()
    return tuple(value or ())


def toml_view(cfg: Any, data: dict[Any, Any], tab: ConfigTab) -> dict[Any, Any]:
    """The TOML view's update for the form's config `cfg`: the config's TOML, unless
    the view holds edits not yet applied (text no check wrote there), which stay until
    Apply. An empty view, or one an earlier check wrote, is no edit: a page opened or
    reloaded shows its form's TOML even when a second check overtakes the first."""
    # The browser's editor may give the text back without its final newline.
    shown, written = (data[tab.toml] or "").strip(), written_texts(data[tab.rendered])
    if shown and written and shown not in written:
        return {tab.toml: gr.skip(), tab.rendered: gr.skip()}
    text = presets.toml_text(cfg)
    # Unchanged: nothing sent, so a check that read the view just before the user typed
    # (a slow one, in flight) cannot put the old text back over the edit.
    if written and text.strip() == written[-1]:
        return {tab.toml: gr.skip(), tab.rendered: gr.skip()}
    return {tab.toml: text, tab.rendered: (*written, text.strip())[-WRITTEN_KEPT:]}


def build_tab() -> ConfigTab:
    with gr.Row():
        name = gr.Textbox(label="Save as (name)", value="my-config", scale=2,
                          elem_id="config-name")
        save = gr.Button("Save to workspace/configs", scale=1, elem_id="config-save")
        export = gr.Button("Export (download)", scale=1, elem_id="config-export")
    message = gr.HTML("", elem_id="config-message")
    with gr.Row():
        download = gr.File(label="Exported config", interactive=False, elem_id="config-file")
        upload = gr.File(label="Import a config (.toml)", file_types=[".toml"],
                         type="filepath", elem_id="config-upload")
    with gr.Row():
        apply = gr.Button("Apply the TOML to the form", scale=0, elem_id="config-apply")
        apply_message = gr.HTML("", elem_id="config-apply-message")
    toml = gr.Code(label="The form as TOML (what Save writes; edit or paste a config here, "
                         "then Apply)", language=None, lines=20, interactive=True,
                   elem_id="config-toml", buttons=["copy"])
    return ConfigTab(name, save, export, download, upload, toml, message, apply,
                     apply_message, gr.State(()))


# After Export wrote the file into the File box: its link clicked, so one click downloads.
CLICK_DOWNLOAD = ("() => { const a = document.querySelector('#config-file a[download]');"
                  " if (a) a.click(); }")


# A message beside a control that refused or warned (ui/render.py's levels): about the
# form it was given, so it goes when a preset, a file or Undo replaces that form.
STALE_LEVELS = ("dt-msg-error", "dt-msg-warning")


def stale_cleared(messages: list[Any], data: dict[Any, Any]) -> dict[Any, Any]:
    """Each of `messages` that holds a refusal or a warning emptied; the others (a build
    started, a caption saved) kept as they are."""
    return {m: "" if any(level in (data.get(m) or "") for level in STALE_LEVELS)
            else gr.skip() for m in messages}


def wire(ctx: AppContext, form: Form, bar: PresetBar, tab: ConfigTab,
         after_fill: list[Any], stale: list[Any] = ()) -> None:
    """The bar's and the tab's events; `stale`: the messages beside other tabs' controls
    that a new form clears (`stale_cleared`)."""
    stale = [*stale, tab.message, tab.apply_message]
    fill_outs = [*form.outputs(), bar.message, bar.undo, bar.before, bar.source, *stale]

    def filled(cfg: Any, notes: list[str], data: dict[Any, Any],
               source: str | None = None) -> dict[Any, Any]:
        """The form replaced by `cfg`, what it held kept for Undo; the dropdown names
        `source` (the preset or saved config loaded), nothing for an imported file; the
        earlier form's refusals and warnings go."""
        out = {**stale_cleared(stale, data), **form.fill(cfg)}
        out[bar.source] = gr.Dropdown(value=source)
        undo = " (Undo the load puts the form back as it was)"
        out[bar.message] = render.message_html("; ".join(notes) + undo, "ok")
        out[bar.before] = form.read(data)[0]
        out[bar.undo] = gr.Button(visible=True)
        return out

    @guarded("Load preset", inline=bar.message)
    def load(data: dict[Any, Any]) -> dict[Any, Any]:
        if not data[bar.source]:
            raise ActionError("choose a preset or a saved config first")
        cfg, notes = presets.load_source(ctx, data[bar.source])
        return filled(cfg, notes, data, data[bar.source])

    @guarded("Import config", inline=bar.message)
    def imported(data: dict[Any, Any]) -> dict[Any, Any]:
        path = data[tab.upload]
        if not path:
            return {bar.message: gr.skip()}
        name = presets.uploaded_name(path)
        cfg = presets.read_config_file(path, shown_as=name)
        return filled(cfg, [f"imported {name}"], data)

    @guarded("Apply the TOML", inline=tab.apply_message)
    def applied(data: dict[Any, Any]) -> dict[Any, Any]:
        from core.config import loads_config
        from core.problems import ConfigError

        try:
            cfg = loads_config(data[tab.toml] or "")
        except ConfigError as exc:
            raise ActionError("the TOML is not a valid config; nothing was applied",
                              exc.problems) from None
        return {**filled(cfg, ["applied the TOML to the form"], data),
                tab.apply_message: render.message_html("the form now holds this TOML", "ok"),
                # Applied: no edits left, so the check writes the form's TOML again.
                tab.rendered: written_texts(data[tab.toml] or "")}

    @guarded("Undo the load", inline=bar.message)
    def undo(data: dict[Any, Any]) -> dict[Any, Any]:
        before = data[bar.before]
        out = {**stale_cleared(stale, data), **(form.fill(before) if before is not None
                                                 else {})}
        text = "the form is back as it was before the load"
        # The form is what it held before, no longer the preset the dropdown named.
        return {**out, bar.message: render.message_html(text, "ok"), bar.before: None,
                bar.undo: gr.Button(visible=False), bar.source: gr.Dropdown(value=None)}

    def valid(data: dict[Any, Any]) -> Any:
        """The form's config; refused when a field does not convert."""
        cfg, problems = form.read(data)
        if problems:
            raise ActionError("the form has invalid values", problems)
        return cfg

    @guarded("Save config", inline=tab.message)
    def save(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg = valid(data)
        path = presets.save_named(ctx, cfg, data[tab.name])
        gr.Info(f"saved {path}")
        text = (f"saved {path} (run it with: python app.py --no-ui --config {path} "
                f"--workspace {ctx.workspace})")
        return {tab.message: render.message_html(text, "ok"),
                bar.source: gr.Dropdown(choices=presets.sources(ctx))}

    @guarded("Export config", inline=tab.message)
    def export(data: dict[Any, Any]) -> dict[Any, Any]:
        path = presets.export(ctx, valid(data), data[tab.name])
        return {tab.download: str(path),
                tab.message: render.message_html(f"exported {path}", "ok")}

    ins = form.inputs() | set(stale)
    for event in (bar.load.click(load, ins | {bar.source}, fill_outs, api_visibility="private"),
                  tab.upload.upload(imported, ins | {tab.upload}, fill_outs,
                                    api_visibility="private"),
                  bar.undo.click(undo, {bar.before, *stale}, fill_outs,
                                 api_visibility="private"),
                  tab.apply.click(applied, ins | {tab.toml},
                                  [*fill_outs, tab.rendered],
                                  api_visibility="private")):
        for then in after_fill:
            event.then(**then)
    tab.save.click(save, form.inputs() | {tab.name}, [tab.message, bar.source],
                   api_visibility="private")
    tab.export.click(export, form.inputs() | {tab.name}, [tab.download, tab.message],
                     api_visibility="private").success(None, None, None, js=CLICK_DOWNLOAD)


def wire_opening(demo: gr.Blocks, ctx: AppContext, form: Form, bar: PresetBar,
                 after_fill: list[Any]) -> None:
    """When the page opens, fill the form: as last edited (a refresh loses nothing), or
    else with the demo preset, so the dropdown's "preset: demo" is what the form holds."""

    @guarded("Open the page")
    def opened() -> dict[Any, Any]:
        cfg, notes, restored = presets.opening(ctx)
        out = form.fill(cfg)
        out[bar.message] = render.message_html("; ".join(notes), "ok")
        if restored:  # the form is the person's own now, not the preset's
            out[bar.source] = gr.Dropdown(value=None)
        return out

    event = demo.load(opened, None, [*form.outputs(), bar.message, bar.source],
                      api_visibility="private")
    for then in after_fill:
        event = event.then(**then)
