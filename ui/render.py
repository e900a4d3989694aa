"""HTML, table rows and browser snippets for the views: plain functions of plain data (no
gradio), so the same text reaches the browser and the tests. Everything user-provided is
escaped."""

from __future__ import annotations

import html
import time
from pathlib import Path

from core.ops import RunFolder
from core.problems import Problem, blocking, counted, errors, errors_first, warnings
from ui.state import field_label

BAR = ("<div class='dt-bar' style='background:#e5e7eb;border-radius:6px;height:14px;"
       "overflow:hidden'><div style='background:{color};height:100%;width:{pct:.1f}%'>"
       "</div></div>")
STATE_COLORS = {"done": "#16a34a", "failed": "#dc2626", "stopped": "#d97706",
                "stopping": "#d97706", "running": "#2563eb", "starting": "#6b7280"}


def esc(text: object) -> str:
    return html.escape(str(text))


def problems_html(problems: list[Problem], ok_text: str = "No problems found.") -> str:
    """Errors (they block launch) then warnings, each naming its key or path."""
    if not problems:
        return f"<div class='dt-ok' style='color:#16a34a'>✔ {esc(ok_text)}</div>"
    n_err, n_warn = len(errors(problems)), len(warnings(problems))
    head = (f"<b style='color:#dc2626'>{blocking(n_err, 'launch')}</b>" if n_err
            else "<b style='color:#16a34a'>no errors</b>")
    head += f", {counted(n_warn, 'warning')}" if n_warn else ""
    items = []
    for p in errors_first(problems):
        color = "#dc2626" if p.level == "error" else "#b45309"
        items.append(f"<li class='dt-{p.level}'><span style='color:{color}'>{p.level}</span>: "
                     f"{where_html(p.where)}: {esc(p.message)}</li>")
    return f"<div class='dt-problems'>{head}<ul>{''.join(items)}</ul></div>"


def where_html(where: str) -> str:
    """A problem's field as the form labels it, the config key after it in small print
    (the key is what the TOML and `--set` use); a key the form lacks, or a path, as is."""
    label = field_label(where)
    if label is None:
        return f"<code>{esc(where)}</code>"
    return (f"<b class='dt-label'>{esc(label)}</b> "
            f"<small style='color:#6b7280'><code>{esc(where)}</code></small>")


def message_html(text: str, level: str = "info", problems: list[Problem] | None = None) -> str:
    """`text`, then the problems behind it that it does not already say (a refusal that
    quotes its one problem is said once)."""
    color = {"error": "#dc2626", "warning": "#b45309", "info": "#1f2937",
             "ok": "#16a34a"}.get(level, "#1f2937")
    body = f"<div class='dt-msg dt-msg-{level}' style='color:{color}'>{esc(text)}</div>"
    problems = [p for p in problems or [] if p.message not in text]
    if problems:
        body += problems_html(problems)
    return body


def launch_summary_html(problems: list[Problem], limit: int = 4) -> str:
    """Beside Launch: how many errors block it and which fields, with the one error's
    whole message (the fields are marked where they are; the check panel lists all)."""
    found = errors(problems)
    if len(found) == 1:
        named = f"{where_html(found[0].where)}: {esc(found[0].message)}"
    else:
        named = ", ".join(where_html(p.where) for p in found[:limit])
        named += f" and {len(found) - limit} more" if len(found) > limit else ""
    # Wrapped, never cut: the message's end is the fix ("...; choose another folder").
    return (f"<div class='dt-launch-summary' style='white-space:normal;"
            f"overflow-wrap:anywhere'><b style='color:#dc2626'>"
            f"{blocking(len(found), 'launch')}</b>: {named}</div>")


def field_marks_html(marks: list[tuple[str, Problem]]) -> str:
    """A style sheet marking each (element id, problem): the field outlined in red
    (amber for a warning) and the problem written under it, wherever the field is."""
    by_id: dict[str, list[Problem]] = {}
    for elem_id, problem in marks:
        by_id.setdefault(elem_id, []).append(problem)
    rules = []
    for elem_id, found in by_id.items():
        color = "#dc2626" if errors(found) else "#b45309"
        text = _css_string(" · ".join(p.message for p in errors_first(found)))
        rules.append(f"#{elem_id} input, #{elem_id} textarea {{ outline: 2px solid {color} "
                     f"!important; outline-offset: -1px; }} #{elem_id}::after {{ content: {text}; "
                     f"display: block; color: {color}; font-size: 12px; margin-top: 4px; "
                     f"white-space: normal; overflow-wrap: anywhere; }}")
    return f"<style class='dt-field-marks'>{' '.join(rules)}</style>" if rules else ""


def _css_string(text: str) -> str:
    """`text` as a CSS string literal that cannot end the string or the <style>."""
    out = "".join(f"\\{ord(ch):x} " if ch in '"\\<>\n' else ch for ch in text)
    return f'"{out}"'


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def run_progress_html(progress, run_label: str) -> str:
    """Progress bar with step, it/s and ETA for a RunFollower's Progress."""
    total = progress.max_steps or "?"
    parts = [f"<b>{esc(progress.state)}</b>", f"step {progress.step}/{total}"]
    if progress.it_s:
        parts.append(f"{progress.it_s:.2f} it/s")
    if not progress.final:
        parts.append(f"ETA {fmt_seconds(progress.eta_s)}")
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    color = STATE_COLORS.get(progress.state, "#2563eb")
    bar = BAR.format(color=color, pct=progress.fraction * 100)
    reason = f"<div style='color:#dc2626'>{esc(progress.reason)}</div>" if (
        progress.reason and progress.state in ("failed", "stopped")) else ""
    return (f"<div class='dt-progress'><div><code>{esc(run_label)}</code> · "
            f"<span class='dt-progress-text'>{' · '.join(parts)}</span></div>{bar}{reason}"
            "</div>")


def cache_progress_html(job, state: str | None) -> str:
    """One bar per cache kind (vae, text) with done/total and an ETA."""
    if job is None:
        return "<div class='dt-cache-progress'>No cache build yet.</div>"
    label = state or "running"
    rows = [f"<div><b>cache build: {esc(label)}</b> (job {esc(job.job_dir.name)})</div>"]
    if not job.progress.kinds:
        rows.append("<div>starting (loading the model)…</div>")
    for kind, p in sorted(job.progress.kinds.items(), key=lambda kv: kv[0] != "vae"):
        pct = 100.0 * p.done / p.total if p.total else 100.0
        eta = "" if state else f" · ETA {fmt_seconds(p.eta_s())}"
        rows.append(f"<div>{esc(kind)}: {p.done}/{p.total}{eta}</div>"
                    + BAR.format(color="#2563eb", pct=pct))
    return f"<div class='dt-cache-progress'>{''.join(rows)}</div>"


def cache_rows(status) -> list[list[object]]:
    return [[d.id, d.images, d.vae.cached, d.vae.stale, d.vae.missing, d.text.cached,
             d.text.stale, d.text.missing, d.vae_dir] for d in status.datasets]


def cache_headers(video: bool) -> list[str]:
    """The cache table's columns; a video family's second counts samples, not images."""
    return [CACHE_HEADERS[0], "samples" if video else "images", *CACHE_HEADERS[2:]]


CACHE_HEADERS = ["dataset", "images", "VAE cached", "VAE stale", "VAE missing",
                 "text cached", "text stale", "text missing", "VAE folder"]
RUN_HEADERS = ["run folder", "state", "step", "started", "outputs", "note"]


def run_outputs(run_dir: Path) -> str:
    folder = RunFolder(run_dir)
    parts = []
    if folder.lora_weights.exists():
        parts.append("LoRA")
    elif folder.model.is_dir():
        parts.append("model")
    if folder.merged.is_dir():  # --stage merge (and merged.safetensors beside it)
        parts.append("merged" + (" + checkpoint file" if folder.merged_checkpoint.is_file()
                                 else ""))
    steps = folder.validation_rounds()
    if steps:
        parts.append(f"{len(steps)} validation step(s)")
    checkpoints = folder.checkpoint_folders()
    if checkpoints:
        parts.append(f"{len(checkpoints)} checkpoint(s)")
    saves = folder.lora_steps()
    if saves:
        parts.append(f"{len(saves)} LoRA(s) by step")
    return ", ".join(parts) or "-"


LORA_HEADERS = ["step", "folder", "files"]


def lora_rows(run_dir: Path, relative) -> list[list[object]]:
    """The run's saved LoRAs (lora/step_NNNNNN/), newest first, paths as the workspace
    names them."""
    from core.ops import saved_loras

    return [[s.step, relative(s.folder), ", ".join(f.name for f in s.files)]
            for s in reversed(saved_loras(run_dir))]


def tensorboard_markdown(run_dir: Path) -> str:
    """The command that shows the run in TensorBoard, or nothing when it does not log."""
    from core.ops import tensorboard_command

    command = tensorboard_command(run_dir)
    return f"TensorBoard: `{command}`" if command else ""


def run_rows(infos, relative) -> list[list[object]]:
    rows = []
    for info in infos:
        step = "-" if info.step is None else f"{info.step}/{info.max_steps or '?'}"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.started_at)) \
            if info.started_at else "-"
        state = info.state + (" (live)" if info.alive else "")
        rows.append([relative(info.run_dir), state, step, started,
                     run_outputs(info.run_dir), info.reason[:160]])
    return rows


def scroll_to_end(elem_id: str) -> str:
    """Browser-side: keep a log box scrolled to its newest line (unless the user is in it).
    Gradio's own autoscroll gives up after a burst of lines taller than 100 px."""
    return (f"() => {{ const t = document.querySelector('#{elem_id} textarea'); "
            "if (t && document.activeElement !== t) t.scrollTop = t.scrollHeight; }")


# Browser-side, once per page: a gallery caption cut short ("a blue sq...") shows whole
# as the hovered label's tooltip (Gradio gives the label none; the labels are redrawn
# with each new set of images, so the title is set when the pointer reaches one).
CAPTION_TOOLTIPS = ("() => { document.addEventListener('mouseover', (e) => { "
                    "const label = e.target.closest?.('.caption-label'); "
                    "if (label && label.title !== label.innerText) "
                    "label.title = label.innerText; }); }")


# Help under a label is read, not typed in: it scrolls (ui/app.py's .info-text), and
# Chromium makes a scrolling box a Tab stop, so Tab stopped on each help between two
# fields. Swept when Tab is pressed (before the browser moves the focus), so the idle
# page runs nothing and help redrawn since is caught too.
HELP_NOT_TABBED = ("() => { document.addEventListener('keydown', (e) => { "
                   "if (e.key !== 'Tab') return; "
                   "document.querySelectorAll('.info-text:not([tabindex])')"
                   ".forEach((h) => h.setAttribute('tabindex', '-1')); }, true); }")


GRID_COLUMNS = 8  # validation rounds the Training tab's grid shows


def validation_grid_html(steps: list[int], prompts: list[str],
                         cells: dict[tuple[int, int], str]) -> str:
    """The validation prompts (rows) by rounds (`steps`, columns): `cells` maps (prompt
    index, step) to an image URL; a cell not drawn yet is empty. Nothing before a first
    round."""
    if not steps:
        return ""
    head = "".join(f"<th>{'before (step 0)' if s == 0 else f'step {s}'}</th>" for s in steps)
    rows = []
    for n, prompt in enumerate(prompts):
        tds = "".join(f"<td><img src='{esc(cells[(n, s)])}' alt='{esc(prompt)}, step {s}' "
                      f"loading='lazy'></td>" if (n, s) in cells else "<td></td>"
                      for s in steps)
        rows.append(f"<tr><th class='dt-grid-prompt' title='{esc(prompt)}'>{esc(prompt)}"
                    f"</th>{tds}</tr>")
    return (f"<div class='dt-grid'><b>Validation grid</b> (prompt x step)<table><thead>"
            f"<tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
