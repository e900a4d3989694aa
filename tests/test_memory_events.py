"""Memory events: the trainer's tracker (core/train/memory.py), the one-line summary
(core/runs/memory.py) and the run view that shows it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.runs.memory import GIB, MIB, fmt_bytes, format_memory, memory_phases
from core.train import memory as memory_mod
from core.train.memory import MEMORY_PHASES, MemoryTracker, host_rss_bytes

FIELDS = {"phase", "device_bytes", "device_peak_bytes", "host_rss_bytes"}


def mem(phase: str, device: int | None = None, peak: int | None = None,
        host: int | None = None) -> dict:
    return {"type": "memory", "phase": phase, "device_bytes": device,
            "device_peak_bytes": peak, "host_rss_bytes": host, "time": 0.0}


# ---------------------------------------------------------------- the tracker


def test_cpu_tracker_reports_host_memory_only():
    import torch

    tracker = MemoryTracker(torch.device("cpu"))
    snaps = {phase: tracker.snapshot(phase) for phase in MEMORY_PHASES}
    for phase, snap in snaps.items():
        assert set(snap) == FIELDS and snap["phase"] == phase
        assert snap["device_bytes"] is None and snap["device_peak_bytes"] is None
        assert isinstance(snap["host_rss_bytes"], int) and snap["host_rss_bytes"] > 0
    # "peak" is the process's high-water mark: never below what an earlier phase saw.
    assert all(snaps["peak"]["host_rss_bytes"] >= s["host_rss_bytes"] for s in snaps.values())
    json.dumps(snaps)  # the fields go into events.jsonl as they are


def test_a_device_given_as_text_works_too():
    assert MemoryTracker("cpu").snapshot("loaded")["device_bytes"] is None


def test_host_rss_without_proc_falls_back_to_getrusage(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(memory_mod, "PROC_STATUS", tmp_path / "missing")
    assert host_rss_bytes() == host_rss_bytes(peak=True) == memory_mod.max_rss_bytes() > 0


class FakeAllocator:
    """torch.cuda's allocator counters, driven by the test."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.resets = 0

    def hold(self, n: int) -> None:
        self.now = n
        self.peak = max(self.peak, n)

    def reset(self, device=None) -> None:
        self.peak = self.now
        self.resets += 1


def test_cuda_tracker_on_faked_cuda_counters_splits_peaks_and_keeps_the_run_peak(monkeypatch):
    """torch.cuda's allocator counters are faked (FakeAllocator): this checks the
    tracker's bookkeeping, not a GPU's figures (bench/gpu_memory.py measures those)."""
    import torch

    fake = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.now)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
    tracker = MemoryTracker(torch.device("cuda", 0))  # no GPU needed to name one

    fake.hold(9 * GIB)  # loading in full precision, then cast down
    fake.hold(5 * GIB)
    loaded = tracker.snapshot("loaded")
    assert (loaded["device_bytes"], loaded["device_peak_bytes"]) == (5 * GIB, 9 * GIB)
    fake.hold(7 * GIB)  # caching with the encoders on the GPU, then off it
    fake.hold(4 * GIB)
    cached = tracker.snapshot("cached")
    assert (cached["device_bytes"], cached["device_peak_bytes"]) == (4 * GIB, 7 * GIB)
    fake.hold(8 * GIB)  # the first step's activations
    fake.hold(6 * GIB)
    first = tracker.snapshot("first_step")
    assert (first["device_bytes"], first["device_peak_bytes"]) == (6 * GIB, 8 * GIB)
    final = tracker.snapshot("peak")  # nothing bigger since: the load's 9 GiB stays the peak
    assert final["device_bytes"] == 9 * GIB and final["device_peak_bytes"] == 6 * GIB
    assert final["host_rss_bytes"] > 0 and fake.resets == 4

    fake.hold(10 * GIB)  # the steps after the first: the run's peak, in no phase of its own
    fake.hold(6 * GIB)
    tracker.close_interval()  # an eval starts
    fake.hold(7 * GIB)
    evaluation = tracker.snapshot("eval")
    assert (evaluation["device_bytes"], evaluation["device_peak_bytes"]) == (7 * GIB, 7 * GIB)
    assert tracker.snapshot("peak")["device_bytes"] == 10 * GIB


@pytest.mark.slow
def test_a_launch_measures_its_first_eval_validation_and_checkpoint_apart(tmp_path: Path):
    """Each launch: the four phases, and its first eval, validation round and checkpoint
    once each, though the run has several of each (a resume measures its own)."""
    from core.config import save_config
    from tests.conftest import small_config, train_in_process

    cfg = small_config(tmp_path, images=2)
    cfg.launch.cpu = True
    cfg.train.max_steps, cfg.train.eval_every, cfg.train.checkpoint_every = 2, 1, 1
    cfg.train.eval_before_training = cfg.validation.before_training = True
    cfg.validation.every, cfg.validation.steps, cfg.validation.prompts = 1, 1, ["a"]
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    cfg.train.max_steps = 3
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path, "--resume", "latest") == 0

    events = [json.loads(line) for line in
              (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()]
    phases = [e["phase"] for e in events if e["type"] == "memory"]
    assert phases == ["loaded", "cached", "eval", "validation", "first_step", "checkpoint",
                      "peak", "loaded", "cached", "first_step", "eval", "validation",
                      "checkpoint", "peak"]
    assert all(e["host_rss_bytes"] > 0 for e in events if e["type"] == "memory")
    assert [e["step"] for e in events if e["type"] == "eval"] == [0, 1, 2, 3]


# ---------------------------------------------------------------- the summary line


def test_gpu_line_names_the_peak_the_first_step_and_the_host():
    events = [{"type": "step", "step": 1}, mem("loaded", 3 * GIB, 4 * GIB, 2 * GIB),
              mem("cached", 3 * GIB, 5 * GIB, 3 * GIB),
              mem("first_step", 12 * GIB, int(13.9 * GIB), int(6.1 * GIB)),
              mem("peak", int(14.2 * GIB), 12 * GIB, int(6.1 * GIB))]
    assert format_memory(events) == (
        "memory: peak 14.2 GiB on the GPU (first step 13.9 GiB) · host 6.1 GiB")


def test_gpu_line_names_the_part_of_the_run_that_held_the_peak():
    events = [mem("loaded", 3 * GIB, 4 * GIB), mem("cached", 3 * GIB, 5 * GIB),
              mem("eval", 12 * GIB, 13 * GIB), mem("first_step", 12 * GIB, 13 * GIB),
              mem("validation", 12 * GIB, 15 * GIB), mem("checkpoint", 12 * GIB, 12 * GIB)]
    assert format_memory([*events, mem("peak", 15 * GIB)]) == (
        "memory: peak 15.0 GiB on the GPU, in validation (first step 13.0 GiB)")
    # A peak in the steps after the first belongs to no measured part: no name.
    assert format_memory([*events, mem("peak", 16 * GIB)]) == (
        "memory: peak 16.0 GiB on the GPU (first step 13.0 GiB)")


def test_a_live_run_shows_the_most_seen_so_far():
    events = [mem("loaded", 3 * GIB, 4 * GIB, GIB), mem("cached", 2 * GIB, 5 * GIB, GIB)]
    assert format_memory(events) == (
        "memory: peak 5.0 GiB on the GPU, while building the caches · host 1.0 GiB")


def test_cpu_line_is_host_memory_only():
    events = [mem("loaded", host=GIB), mem("first_step", host=2 * GIB),
              mem("peak", host=3 * GIB)]
    assert format_memory(events) == "memory: peak 3.0 GiB host RSS (first step 2.0 GiB)"


def test_no_memory_events_no_line():
    assert format_memory([]) is None
    assert format_memory([{"type": "step", "step": 1, "loss": 0.1}]) is None
    assert format_memory([mem("loaded")]) is None  # nothing measured


def test_a_resume_starts_the_figures_again():
    first_launch = [mem("loaded", GIB, 20 * GIB, GIB), mem("peak", 20 * GIB, GIB, GIB)]
    resumed = [mem("loaded", GIB, 2 * GIB, GIB), mem("first_step", 3 * GIB, 4 * GIB, GIB)]
    assert set(memory_phases(first_launch + resumed)) == {"loaded", "first_step"}
    assert format_memory(first_launch + resumed).startswith(
        "memory: peak 4.0 GiB on the GPU (first step 4.0 GiB)")


def test_odd_values_are_ignored_not_fatal():
    events = [{"type": "memory"}, {"type": "memory", "phase": "loaded",
                                   "device_bytes": "lots", "host_rss_bytes": True},
              mem("cached", host=300 * MIB)]
    assert format_memory(events) == "memory: peak 300 MiB host RSS"


def test_fmt_bytes():
    assert fmt_bytes(512 * MIB) == "512 MiB" and fmt_bytes(GIB) == "1.0 GiB"


# ---------------------------------------------------------------- the run view


def test_the_run_view_shows_the_line_as_the_events_arrive(tmp_path: Path):
    from core.runs.follow import RunFollower
    from ui.run_views import Following, progress_html

    events = tmp_path / "events.jsonl"
    f = Following(RunFollower(tmp_path))
    ctx = SimpleNamespace(relative=lambda p: Path(p).name)
    f.memory.poll()
    assert f.memory.version == 0 and "dt-memory" not in progress_html(ctx, f)

    line = json.dumps(mem("first_step", 2 * GIB, 3 * GIB, GIB))
    events.write_text(json.dumps({"type": "step", "step": 1}) + "\n" + line[:20])
    f.memory.poll()  # a half-written line waits
    assert f.memory.version == 0
    with events.open("a") as fh:
        fh.write(line[20:] + "\n")
    f.memory.poll()
    assert f.memory.version == 1
    assert ("memory: peak 3.0 GiB on the GPU (first step 3.0 GiB) · host 1.0 GiB"
            in progress_html(ctx, f))


def test_the_peak_line_names_one_figure(tmp_path: Path, capsys):
    """The "peak" phase's line gives the run's peak alone: its interval's own peak,
    smaller, read as a contradiction ("GPU 23.25 GiB (peak 22.48 GiB)") on an H200."""
    from core.train.report import Reporter

    reporter = Reporter(tmp_path, is_main=True, max_steps=1)
    reporter.memory({"phase": "first_step", "device_bytes": 6 * GIB,
                     "device_peak_bytes": 8 * GIB, "host_rss_bytes": GIB})
    reporter.memory({"phase": "peak", "device_bytes": 9 * GIB,
                     "device_peak_bytes": 6 * GIB, "host_rss_bytes": GIB})
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "memory, first_step: GPU 6.00 GiB (peak 8.00 GiB), host 1.00 GiB",
        "memory, peak: GPU 9.00 GiB, host 1.00 GiB"]
