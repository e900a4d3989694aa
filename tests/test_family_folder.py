"""Issue 22: a family is one folder (core/models/families/<name>/). Copying a family's
folder under a new name and changing the name inside that folder only gives a family
the whole app accepts: `--stage check`, its caches and a tiny training run. These are
the steps docs/adding-a-family.md gives; nothing outside the folder names a family."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from core.config import save_config
from core.models.families import EXTRA_PATH_VARIABLE
from tests.conftest import PYTHON, REPO, small_config

FAMILIES = REPO / "core/models/families"
NEW = "sd15copy"


def copy_family(source: str, name: str, dest: Path) -> Path:
    """The family folder `source` copied to dest/<name>, `source` renamed to `name` in its
    Python files (its FAMILY's name and its own imports)."""
    folder = dest / name
    shutil.copytree(FAMILIES / source, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path in folder.rglob("*.py"):
        path.write_text(path.read_text(encoding="utf-8").replace(source, name),
                        encoding="utf-8")
    return folder


def app(*args: str, workspace: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "app.py", "--no-ui", "--workspace", str(workspace), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def test_shared_code_names_no_family_and_asks_none_what_it_is():
    """Outside core/models/families/, no family name as a string and no getattr on a
    family: what shared code reads of a family is a protocol member (core/models/base.py)."""
    from core.models.registry import list_families

    names = "|".join(map(re.escape, list_families()))
    quoted = re.compile(rf"""["']({names})["']""")
    asks = re.compile(r"getattr\((get_)?family\b")
    found = []
    for path in sorted([*(REPO / "core").rglob("*.py"), *(REPO / "ui").rglob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("core/models/families/"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if quoted.search(code) or asks.search(code):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []


def test_an_unknown_family_folder_is_refused_at_check(tmp_path: Path):
    """Without its folder the copy's name is an invalid model.family (exit 2, the key
    named): the run below passes because of the folder, not despite the check."""
    cfg = small_config(tmp_path, images=2, family=NEW)
    save_config(cfg, tmp_path / "run.toml")
    done = app("--config", str(tmp_path / "run.toml"), "--stage", "check",
               workspace=tmp_path / "ws", env=dict(os.environ))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "model.family" in done.stdout + done.stderr


@pytest.mark.slow
def test_a_copied_family_folder_checks_caches_and_trains(tmp_path: Path):
    copy_family("sd15", NEW, tmp_path / "families")
    env = {**os.environ, EXTRA_PATH_VARIABLE: str(tmp_path / "families")}
    workspace = tmp_path / "ws"
    cfg = small_config(tmp_path, images=4, family=NEW)
    cfg.train.max_steps = 2
    cfg.train.eval_every = 2
    cfg.validation.every = 2
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    for stage in ("check", "cache", "train"):
        done = app("--config", str(tmp_path / "run.toml"), "--stage", stage,
                   workspace=workspace, env=env)
        assert done.returncode == 0, stage + done.stdout[-3000:] + done.stderr[-3000:]
    assert (workspace / f"models/tiny-{NEW}").is_dir()  # its own tiny:<name> build
    run_dir = Path(cfg.output.dir)
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    steps = [e["step"] for e in map(json.loads, lines) if e["type"] == "step"]
    assert steps == [1, 2]
    assert (run_dir / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run_dir / "validation/step_000002/00.png").is_file()
