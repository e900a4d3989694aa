"""The trainer's ETA counts the eval, validation and checkpoint rounds still to come, not
only the steps (a run that said "ETA 0s" then validated for 12 s more)."""

from __future__ import annotations

import json

import pytest

from core.train.report import Reporter, eta_seconds, rounds_left


@pytest.mark.parametrize(("step", "max_steps", "every", "left"), [
    (1, 400, 50, 8),     # at 50, 100, ..., 400 (the last is also the final round)
    (50, 400, 50, 8),    # the round at the step just reported has not run yet
    (51, 400, 50, 7),
    (400, 400, 50, 1),   # the final round
    (1, 10, 4, 3),       # at 4, 8 and the final one at 10
    (9, 10, 4, 1),
    (10, 10, 100, 1),    # every beyond the run: the final round only
    (3, 10, 1, 8),
])
def test_rounds_left_counts_the_round_at_this_step_and_the_final_one(step, max_steps,
                                                                     every, left):
    assert rounds_left(step, max_steps, every) == left


def test_eta_adds_the_mean_measured_duration_of_each_kind_of_round():
    rounds = {"eval": (50, [2.0, 4.0]), "validation": (100, [10.0]), "checkpoint": (250, [])}
    # Step 100 done: 300 steps at 0.1 s, eval at 100, 150, ..., 400 (7 rounds at 3 s, the
    # mean), validation at 100, ..., 400 (4 at 10 s); checkpoints not measured add nothing.
    assert eta_seconds(100, 400, 0.1, rounds) == pytest.approx(30 + 21 + 40)
    assert eta_seconds(400, 400, 0.1, rounds) == pytest.approx(3 + 10)
    assert eta_seconds(100, 400, None, rounds) is None
    assert eta_seconds(100, 400, 0.1, {}) == pytest.approx(30)


def test_reporter_step_events_count_the_measured_rounds_and_rates_leave_them_out(
        tmp_path, monkeypatch):
    clock = iter([0.0, 1.0, 4.0, 5.0])
    monkeypatch.setattr("core.train.report.time.monotonic", lambda: next(clock))
    reporter = Reporter(tmp_path, True, 10, every={"validation": 5, "eval": 2})
    reporter.took("validation", 12.0)  # the one before training
    reporter.step(1, 0.5, 1e-4, 0)
    reporter.step(2, 0.5, 1e-4, 0)
    reporter.took("eval", 2.0)  # 3 s from step 2 to step 3, 2 of them eval
    reporter.step(3, 0.5, 1e-4, 0)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "step"]
    assert [e["it_s"] for e in steps] == [None, 1.0, 1.0]
    # 1 s a step: at step 2, 8 steps and validation at 5 and 10 (12 s each) are left (no
    # eval measured yet); at step 3, 7 steps, the same validation, eval at 4, 6, 8, 10.
    assert [e["eta_s"] for e in steps] == [None, 8 + 24, 7 + 24 + 8]
