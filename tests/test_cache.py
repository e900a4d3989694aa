"""Caches: incremental, invalidating exactly what changed, atomic, safe under SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, free_port, small_config, write_shapes

from core.cache.plan import plan_caches
from core.cache.stage import build_caches
from core.cache.store import (
    CacheReadError,
    CacheWriteError,
    atomic_save,
    is_fresh,
    load_entry,
    read_metadata,
)
from core.config import save_config


@pytest.fixture(scope="module")
def sd15(tiny_workspace: Path):
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    family = get_family("sd15")
    return family, family.load(str(materialize_tiny("sd15", tiny_workspace)))


def entries(folder: Path) -> dict[Path, int]:
    """Every cache file with its mtime (ns): a rewrite changes it."""
    return {p: p.stat().st_mtime_ns for p in sorted(folder.rglob("*.safetensors"))}


def test_first_build_writes_everything_second_writes_nothing(tmp_path: Path, sd15):
    family, comps = sd15
    cfg = small_config(tmp_path, images=5)
    report = build_caches(cfg, family, comps)
    assert (report.vae.written, report.text.written) == (5, 5)
    before = entries(tmp_path / "cache")
    assert len(before) == 10
    again = build_caches(cfg, family, comps)
    assert (again.stale_vae, again.stale_text, again.vae.written) == (0, 0, 0)
    assert entries(tmp_path / "cache") == before, "unchanged entries must not be rewritten"
    tensors, meta = load_entry(next(iter((tmp_path / "cache/vae0").glob("*.safetensors"))))
    assert tensors["latents"].shape == (4, 8, 8)
    assert meta["family"] == "sd15" and meta["bucket"] == "64x64"


def test_two_processes_each_encode_their_own_share(tmp_path: Path, sd15, monkeypatch):
    """build_caches as two processes of one group (two threads meeting at the group's
    barriers): each encodes its own half of the stale entries, none encodes another's.
    The entry lock would hide duplicate work in the written counts, so the encoder calls
    are counted, per process."""
    import threading
    from collections import Counter

    from core.startup import ProcessGroup

    family, comps = sd15
    cfg = small_config(tmp_path, datasets=2, images=7)
    encoded: dict[str, Counter] = {"vae": Counter(), "text": Counter()}
    one_at_a_time = threading.Lock()  # the shared tokenizers are not thread-safe
    encode_images, encode_prompts = family.encode_images, family.encode_prompts

    def counted_images(c, pixels, *args, **kwargs):
        encoded["vae"][threading.current_thread().name] += pixels.shape[0]
        with one_at_a_time:
            return encode_images(c, pixels, *args, **kwargs)

    def counted_prompts(c, prompts, *args, **kwargs):
        encoded["text"][threading.current_thread().name] += len(prompts)
        with one_at_a_time:
            return encode_prompts(c, prompts, *args, **kwargs)

    monkeypatch.setattr(family, "encode_images", counted_images)
    monkeypatch.setattr(family, "encode_prompts", counted_prompts)
    barrier = threading.Barrier(2, timeout=120)
    reports: dict[str, object] = {}

    def process(index: int) -> None:
        group = ProcessGroup(index=index, count=2, barrier=barrier.wait)
        reports[f"p{index}"] = build_caches(cfg, family, comps, group)

    threads = [threading.Thread(target=process, args=(i,), name=f"p{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert sorted(reports) == ["p0", "p1"], "a process failed (see the thread's traceback)"
    assert encoded["vae"] == {"p0": 7, "p1": 7}, encoded  # 14 images, 14 captions
    assert encoded["text"] == {"p0": 7, "p1": 7}, encoded
    assert [(r.vae.written, r.text.written) for r in reports.values()] == [(7, 7), (7, 7)]
    assert len(entries(tmp_path / "cache")) == 28


def test_changed_image_caption_or_setting_invalidates_exactly_those(tmp_path: Path, sd15):
    family, comps = sd15
    cfg = small_config(tmp_path, images=4)
    build_caches(cfg, family, comps)
    before = entries(tmp_path / "cache")
    image = tmp_path / "data0/img_002.png"
    write_shapes(tmp_path / "other", 4)
    image.write_bytes((tmp_path / "other/img_000.png").read_bytes())  # new pixels
    (tmp_path / "data0/img_001.txt").write_text("a brand new caption", encoding="utf-8")
    report = build_caches(cfg, family, comps)
    assert (report.stale_vae, report.stale_text) == (1, 1)
    after = entries(tmp_path / "cache")
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == {tmp_path / "cache/vae0/img_002.png.safetensors",
                       *[p for p in after if p not in before]}
    assert len(changed) == 2, changed
    cfg.datasets[0].resolution = 128  # every latent depends on it; text does not
    report = build_caches(cfg, family, comps)
    assert (report.stale_vae, report.stale_text) == (4, 0)


def test_another_model_invalidates_everything(tmp_path: Path, sd15):
    family, comps = sd15
    cfg = small_config(tmp_path, images=3)
    build_caches(cfg, family, comps)
    import dataclasses

    other = dataclasses.replace(comps, fingerprint="another-model")
    report = build_caches(cfg, family, other)
    assert (report.stale_vae, report.stale_text) == (3, 3)


def test_shared_captions_make_one_text_entry(tmp_path: Path, sd15):
    family, comps = sd15
    cfg = small_config(tmp_path, datasets=2, images=4, shared_captions=True)
    report = build_caches(cfg, family, comps)
    assert report.vae.written == 8
    assert report.text.written == 2
    assert len(entries(tmp_path / "cache/text")) == 2


def test_bad_image_is_skipped_and_named(tmp_path: Path, sd15):
    family, comps = sd15
    cfg = small_config(tmp_path, images=3)
    bad = tmp_path / "data0/img_001.png"
    bad.write_bytes(bad.read_bytes()[:60])  # header intact, pixels cut off
    report = build_caches(cfg, family, comps)
    assert report.vae.written == 2
    assert any(str(bad) in str(p) and "skipped" in str(p) for p in report.problems)


def test_truncated_entry_is_not_fresh_and_fails_loudly(tmp_path: Path):
    import torch

    path = tmp_path / "e.safetensors"
    atomic_save({"latents": torch.ones(4, 8, 8)}, {"source": "x"}, path)
    assert is_fresh(path, {"source": "x"}) and not is_fresh(path, {"source": "y"})
    path.write_bytes(path.read_bytes()[:-10])
    assert read_metadata(path) is None and not is_fresh(path, {"source": "x"})
    with pytest.raises(CacheReadError, match="deleted it so it is rebuilt"):
        load_entry(path)
    assert not path.exists()


def test_unwritable_cache_reports_and_leaves_no_partial(tmp_path: Path):
    import torch

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(CacheWriteError, match="not-a-folder"):
        atomic_save({"latents": torch.ones(2)}, {}, blocker / "sub" / "e.safetensors")


def test_write_that_runs_out_of_space_keeps_the_previous_entry(tmp_path: Path):
    """A file-size limit makes the write of a new version fail part-way, as a full disk
    does: the previous entry is still there and loads, and no partial or temp file
    remains (an entry written in place would be cut off)."""
    import torch

    target = tmp_path / "e.safetensors"
    atomic_save({"latents": torch.ones(4)}, {"source": "old"}, target)  # well under 4 KiB
    script = (
        "import resource, signal, sys, torch\n"
        "from pathlib import Path\n"
        "from core.cache.store import atomic_save, CacheWriteError\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    atomic_save({{'latents': torch.zeros(64, 64)}}, {{'source': 'new'}}, "
        f"Path({str(target)!r}))\n"
        "except CacheWriteError as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    done = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3, done.stderr
    assert "the partial file was removed" in done.stdout
    assert list(tmp_path.iterdir()) == [target], "no partial or temp file may remain"
    tensors, meta = load_entry(target)
    assert meta["source"] == "old" and torch.equal(tensors["latents"], torch.ones(4))


def test_a_rename_that_fails_keeps_the_previous_entry(tmp_path: Path, monkeypatch):
    """The write fails between the finished temp file and the rename: the previous entry
    is intact and readable, the temp file gone."""
    import errno

    import torch

    from core.cache import store

    target = tmp_path / "e.safetensors"
    atomic_save({"latents": torch.ones(8)}, {"source": "old"}, target)

    def failing_replace(src, dst):
        assert Path(src).name.startswith(store.TMP_PREFIX) and Path(src).stat().st_size > 0
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "replace", failing_replace)
    with pytest.raises(CacheWriteError, match="the disk is full"):
        atomic_save({"latents": torch.zeros(8)}, {"source": "new"}, target)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == [target]
    tensors, meta = load_entry(target)
    assert meta["source"] == "old" and torch.equal(tensors["latents"], torch.ones(8))


def _cache_command(config: Path, workspace: Path) -> list[str]:
    return [PYTHON, "-m", "core.cache.main", "--config", str(config), "--workspace",
            str(workspace)]


@pytest.mark.slow
def test_sigkill_mid_build_leaves_only_loadable_files(tmp_path: Path, tiny_workspace: Path):
    cfg = small_config(tmp_path, images=40)
    config = tmp_path / "run.toml"
    save_config(cfg, config)
    total = 40 + 40  # latents + captions
    for kill_after in (20, 50):  # entries seen on disk before the kill: latents, captions
        # At the lowest priority: on a loaded machine (three test workers) the build once
        # wrote its last 30 text entries before this loop, waiting for CPU, saw the 50th.
        child = subprocess.Popen(_cache_command(config, tiny_workspace), cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 preexec_fn=lambda: os.nice(19))
        deadline = time.monotonic() + 240
        while len(entries(tmp_path / "cache")) < kill_after and child.poll() is None:
            assert time.monotonic() < deadline, "cache build made no progress"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        found = list((tmp_path / "cache").rglob("*.safetensors"))
        assert len(found) < total, "the kill must land mid-build"
        for path in found:
            load_entry(path)  # raises (and deletes) if any entry were half-written
    done = subprocess.run(_cache_command(config, tiny_workspace), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = plan_caches(cfg, {"family": "sd15"})
    assert all(job.entry.exists() for job in plan.vae_jobs)
    assert all(job.entry.exists() for job in plan.text_jobs)


@pytest.mark.slow
def test_two_process_accelerate_build_writes_each_entry_once(tmp_path: Path,
                                                             tiny_workspace: Path):
    from core.models.tiny import materialize_tiny

    materialize_tiny("sd15", tiny_workspace)
    cfg = small_config(tmp_path, datasets=2, images=7, shared_captions=True)
    # launch.cpu as the launcher's ACCELERATE_USE_CPU says: with it false each process
    # built alone, as "process 0/1" (the summed writes below hid that).
    cfg.launch.cpu = True
    config = tmp_path / "run.toml"
    save_config(cfg, config)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1"}
    # A free port, not accelerate's 29500: another two-process run on the machine (a
    # parallel test, a user's run) must not take this one's rendezvous.
    command = [PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
               "2", "--num_machines", "1", "--main_process_port", str(free_port()),
               "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "core.cache.main",
               "--config", str(config), "--workspace", str(tiny_workspace),
               "--events", str(tmp_path / "events.jsonl")]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Each process's own progress: its share of the 14 images and 2 captions, not all.
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    shares = {(e["kind"], e["process"]): e["total"] for e in events}
    assert shares == {("vae", 0): 7, ("vae", 1): 7, ("text", 0): 1, ("text", 1): 1}, shares
    # (the two processes' lines may share a line of stdout: found by pattern)
    writes = sorted(re.findall(r"process (\d)/(\d): wrote (\d+) vae, (\d+) text",
                               done.stdout))
    assert writes == [("0", "2", "7", "1"), ("1", "2", "7", "1")], done.stdout
    assert len(entries(tmp_path / "cache/vae0")) == 7
    assert len(entries(tmp_path / "cache/vae1")) == 7
    assert len(entries(tmp_path / "cache/text")) == 2
    for path in (tmp_path / "cache").rglob("*.safetensors"):
        load_entry(path)


def test_entry_whose_image_went_bad_says_so_at_train_time(tmp_path: Path, sd15):
    from core.cache.build import build_vae_entries
    from core.cache.dataset import cached_datasets

    family, comps = sd15
    cfg = small_config(tmp_path, images=2)
    report = build_caches(cfg, family, comps)

    def rebuild(job):
        build_vae_entries(lambda px: family.encode_images(comps, px), [job])

    dataset = cached_datasets(cfg, report.plan, rebuild)[0]
    assert dataset.load(0)["latents"].shape == (4, 8, 8)
    item = dataset.items[1]
    item.vae.entry.write_bytes(b"not a safetensors file")
    item.vae.image.write_bytes(b"")  # and the image is gone bad too
    with pytest.raises(CacheReadError, match="could not be rebuilt"):
        dataset.load(1)
    assert not item.vae.entry.exists(), "the broken entry is never trained on"


def test_once_the_caches_are_built_the_memory_line_has_no_caching_phase(
        tmp_path: Path, sd15, tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """The check's lines of a GPU machine (forced: this one may have none) drop "building
    caches first" once every entry is cached and fresh (the check tells the estimate)."""
    import core.memory.estimate as memory
    from core.cache.status import caches_complete
    from core.check import run_check

    monkeypatch.setattr(memory, "cuda_available", lambda: True)
    family, comps = sd15
    cfg = small_config(tmp_path, images=3)
    assert not caches_complete(cfg, tiny_workspace)
    before = "\n".join(run_check(cfg, tiny_workspace).memory.lines())
    assert "building caches" in before or "building the caches" in before, before
    build_caches(cfg, family, comps)
    assert caches_complete(cfg, tiny_workspace)
    after = "\n".join(run_check(cfg, tiny_workspace).memory.lines())
    assert "caches" not in after and "encoding" not in after, after


def test_flip_caches_the_mirror_images_latents_and_turning_it_on_rebuilds(tmp_path: Path,
                                                                          sd15):
    """datasets.N.flip: each entry holds the mirror image's latents too (the VAE's own
    encoding of it, not mirrored latents), the dataset hands them out when a sample
    flips, and only turning flip on makes the entries stale (off reuses them)."""
    import torch

    from core.cache.build import load_pixels
    from core.cache.dataset import cached_datasets

    family, comps = sd15
    cfg = small_config(tmp_path, images=2)
    build_caches(cfg, family, comps)
    cfg.datasets[0].flip = True
    report = build_caches(cfg, family, comps)
    assert report.stale_vae == 2 and report.stale_text == 0
    job = report.plan.datasets[0].vae_jobs[0]
    tensors, meta = load_entry(job.entry)
    assert meta["flip"] == "1"
    with torch.no_grad():
        mirrored = family.encode_images(comps, load_pixels(job).flip(-1)[None])[0]
    torch.testing.assert_close(tensors["flipped_latents"], mirrored.float())
    assert not torch.allclose(tensors["latents"], tensors["flipped_latents"].flip(-1))
    dataset = cached_datasets(cfg, report.plan)[0]
    assert torch.equal(dataset.load(0, flipped=True)["latents"], tensors["flipped_latents"])
    assert torch.equal(dataset.load(0)["latents"], tensors["latents"])
    draws = [dataset.flips(0, cfg.train.seed, step, 0) for step in range(200)]
    assert 70 < sum(draws) < 130 and draws == [dataset.flips(0, cfg.train.seed, step, 0)
                                                for step in range(200)]
    cfg.datasets[0].flip = False
    off = build_caches(cfg, family, comps)
    assert off.stale_vae == 0
    assert not any(cached_datasets(cfg, off.plan)[0].flips(0, cfg.train.seed, step, 0)
                   for step in range(20))
