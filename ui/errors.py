"""Every error reaches the browser: handlers are wrapped so that an unexpected exception
becomes a visible `gr.Error` (a toast naming what failed) instead of a console-only
traceback, and `ActionError`s (expected refusals) keep their message and problems.

A refusal the user can fix (tick the box first, choose a run first) is not an error:
with `inline`, it shows as a message in that component, beside the control, and the
server logs no traceback. Toasts stay for what actually failed."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import gradio as gr

from ui import render
from ui.actions import ActionError

log = logging.getLogger("ui")


def describe(exc: BaseException) -> str:
    if isinstance(exc, ActionError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc} ({exc.filename})"
    return f"{type(exc).__name__}: {exc}"


def refusal_html(exc: ActionError) -> str:
    """A refusal as the message shown beside its control."""
    return render.message_html(exc.message, "error", exc.problems)


def guarded(what: str, inline: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: any exception leaving the handler is shown in the browser as
    "<what> failed: ..." (the traceback goes to the server log as well). With `inline`
    (one of the event's outputs), an `ActionError` is shown there instead, and nothing
    else the event outputs changes."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def handler(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except gr.Error:
                raise
            except ActionError as exc:
                if inline is not None:
                    return {inline: refusal_html(exc)}
                raise gr.Error(f"{what}: {describe(exc)}", print_exception=False) from None
            except Exception as exc:
                log.exception("%s failed", what)
                raise gr.Error(f"{what} failed: {describe(exc)}",
                               print_exception=False) from None

        return handler

    return wrap
