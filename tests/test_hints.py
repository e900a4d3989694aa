"""Refusals carry their way out as data (issue 38 item 4): core's Hint says it as the CLI
did, and the UI words the same hint with the form's labels and buttons, rewriting none of
core's text."""

from __future__ import annotations

from pathlib import Path

from core.problems import Hint
from core.runs.extend import refusal
from ui.actions import _for_the_browser


def test_a_done_run_is_told_to_extend_in_each_front_ends_words() -> None:
    [problem] = refusal(Path("/w/runs/a"), 4, 4).problems
    assert problem.message == (
        "/w/runs/a is done: it trained all 4 steps, and train.max_steps = 4 adds none. "
        "Resuming it would only rewrite its final checkpoint and LoRA; to train it further, "
        "Extend it: give a larger train.max_steps (--set train.max_steps=8)")
    assert _for_the_browser(problem.message, problem.hint) == (
        "/w/runs/a is done: it trained all 4 steps, and Max steps = 4 adds none. "
        "Resuming it would only rewrite its final checkpoint and LoRA; to train it further, "
        "set Max steps higher (e.g. 8) and click Extend to Max steps")


def test_a_taken_folder_names_the_output_folder_and_resume() -> None:
    hint = Hint("runs/a holds a run; start one with {set}, or continue with {resume}",
                "output.dir", "runs/a-2").after("cannot launch: ")
    assert hint.cli() == ("cannot launch: runs/a holds a run; start one with "
                          "--set output.dir=runs/a-2, or continue with --resume")
    assert _for_the_browser(hint.cli(), hint) == (
        "cannot launch: runs/a holds a run; start one with Output folder = runs/a-2, "
        "or continue with Resume")
    listed = Hint("1 error blocks launch; fix it first{listed}")
    assert listed.cli() == "1 error blocks launch; fix it first"
    assert _for_the_browser(listed.cli(), listed).startswith(
        "1 error blocks launch; fix it first (each is marked at its field")
    assert _for_the_browser("as core says it", None) == "as core says it"
