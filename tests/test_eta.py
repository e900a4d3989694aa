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


def test_earlier_measurements_read_the_last_rate_and_each_rounds_durations(tmp_path):
    from core.train.report import earlier_measurements

    events = tmp_path / "events.jsonl"
    lines = [{"type": "step", "step": 1, "it_s": None}, {"type": "step", "step": 2, "it_s": 4.0},
             {"type": "validation", "step": 2, "seconds": 6.0},
             {"type": "eval", "step": 2, "seconds": 1.5},
             {"type": "checkpoint", "step": 2, "seconds": 0.5},
             {"type": "step", "step": 3, "it_s": 2.0}]
    events.write_text("\n".join(json.dumps(e) for e in lines) + "\n{not json\n")
    assert earlier_measurements(events) == (0.5, {"validation": [6.0], "eval": [1.5],
                                                  "checkpoint": [0.5]})
    assert earlier_measurements(tmp_path / "missing.jsonl") == (None, {})


def test_a_resumed_launch_counts_the_rounds_to_come_from_its_first_step(tmp_path,
                                                                         monkeypatch):
    """An extended run said "ETA 5.4 s" and took 20.6 s: its new launch had measured no
    validation or eval yet, so the ETA counted the steps alone (or nothing at all)."""
    clock = iter([0.0, 2.0, 100.0])
    monkeypatch.setattr("core.train.report.time.monotonic", lambda: next(clock))
    every = {"validation": 5, "eval": 2}
    first = Reporter(tmp_path, True, 10, every=every)
    first.validation(0, [], [], 12.0)  # the events, then the times (as the loop does)
    first.took("validation", 12.0)
    first.step(1, 0.5, 1e-4, 0)
    first.eval(1, {"loss": 0.5, "loss_shuffled": 0.6}, 1.0)
    first.took("eval", 1.0)
    first.step(2, 0.5, 1e-4, 0)  # 1 s a step (2 s less 1 s of eval)

    second = Reporter(tmp_path, True, 20, every=every)  # extended to 20 steps
    second.continue_from()
    second.step(3, 0.5, 1e-4, 0)
    # 17 steps at 1 s, validation at 5, 10, 15, 20 (12 s), eval at 4, 6, ..., 20 (1 s).
    step = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert (step["step"], step["eta_s"], step["it_s"]) == (3, 17 + 48 + 9, None)
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["step"], status["eta_s"]) == (3, 17 + 48 + 9)


@pytest.mark.slow
def test_an_extended_run_reports_an_eta_with_its_validation_from_its_first_step(
        tmp_path, tiny_workspace):
    """The real trainer, extended from 2 to 4 steps: the first step of the new launch
    reports an ETA that counts the final validation (the earlier launch timed it)."""
    from conftest import small_config, train_in_process

    from core.config import save_config

    cfg = small_config(tmp_path, images=4)
    cfg.train.max_steps, cfg.train.checkpoint_every = 2, 2
    cfg.validation.every, cfg.train.eval_every = 2, 1000
    config = tmp_path / "run.toml"
    save_config(cfg, config)
    assert train_in_process(config, tiny_workspace) == 0
    cfg.train.max_steps = 4
    save_config(cfg, config)
    assert train_in_process(config, tiny_workspace, "--resume", "latest") == 0

    events = [json.loads(line) for line in
              (tmp_path / "runs/run/events.jsonl").read_text().splitlines()]
    resumed = next(i for i, e in enumerate(events) if e["type"] == "resume")
    validation = [e["seconds"] for e in events[:resumed] if e["type"] == "validation"]
    step3 = next(e for e in events[resumed:] if e["type"] == "step")
    assert step3["step"] == 3 and step3["eta_s"] is not None, step3
    assert step3["eta_s"] >= sum(validation) / len(validation), (step3, validation)
