"""core/files.py, the one write-to-temp-then-replace (issue 38 item 4): a target is the
old file or the new one, never half of one, and no temp is left behind either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.files import atomic_path, keep_first, replace_folder, write_json, write_text


def test_a_write_replaces_the_target_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    write_text(target, "old\n")
    write_json(target, {"step": 3}, temp=".status.json.7.tmp")
    assert json.loads(target.read_text(encoding="utf-8")) == {"step": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]
    with pytest.raises(ValueError):  # NaN is refused before anything is written
        write_json(target, {"loss": float("nan")})
    assert json.loads(target.read_text(encoding="utf-8")) == {"step": 3}


def test_a_failing_writer_keeps_the_old_target_and_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    (tmp_path / ".a.png.tmp").write_bytes(b"left by a killed writer")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert not tmp.exists()  # the stale temp went first
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]


def test_unique_temps_and_fsync(tmp_path: Path) -> None:
    target = tmp_path / "entry.safetensors"
    with atomic_path(target, unique=(".tmp-", ".part"), fsync=True) as tmp:
        assert tmp.name.startswith(".tmp-") and tmp.name.endswith(".part") and tmp.is_file()
        tmp.write_bytes(b"data")
    assert target.read_bytes() == b"data"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.safetensors"]


def test_folders_swap_in_whole(tmp_path: Path) -> None:
    final = tmp_path / "step_000002"
    (final).mkdir()
    (final / "old.pt").write_bytes(b"old")
    with atomic_path(final, temp=".tmp-step_000002", folder=True, swap=replace_folder) as tmp:
        (tmp / "new.pt").write_bytes(b"new")
    assert [p.name for p in final.iterdir()] == ["new.pt"]
    assert [p.name for p in tmp_path.iterdir()] == ["step_000002"]
    with atomic_path(final, unique=(".build.", ".tmp"), folder=True, swap=keep_first) as tmp:
        (tmp / "other.pt").write_bytes(b"another process's")
    assert [p.name for p in final.iterdir()] == ["new.pt"]  # the first build stays
    assert [p.name for p in tmp_path.iterdir()] == ["step_000002"]
