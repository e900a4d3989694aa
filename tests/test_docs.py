"""The repository documents itself: the contracts in docs/ say what the code does."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import PYTHON, REPO


def test_config_reference_is_generated_from_the_current_fields():
    done = subprocess.run([PYTHON, str(REPO / "tools/config_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cli_page_names_every_flag_and_exit_code():
    from app import build_parser
    from core import exits

    text = (REPO / "docs/cli.md").read_text(encoding="utf-8")
    flags = {opt for action in build_parser()._actions for opt in action.option_strings
             if opt.startswith("--") and opt != "--help"}
    assert flags and {f for f in flags if f not in text} == set()
    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_")}
    assert {c for c in codes if not re.search(rf"^\| {c} \|", text, re.M)} == set()


def test_run_folder_page_names_every_file_and_status_field():
    import dataclasses

    from core.runs.folder import RunFolder
    from core.runs.status import EVENT_TYPES, STATES, RunStatus

    text = (REPO / "docs/run-folder.md").read_text(encoding="utf-8")
    folder = RunFolder(REPO / "x")
    names = {folder.config.name, folder.command.name, folder.log.name, folder.events.name,
             folder.status.name, folder.stop_file.name, folder.validation.name,
             folder.checkpoints.name, folder.lora_weights.name, folder.model.name,
             RunFolder(REPO / "x", kind="cache").log.name, folder.shared_token.name,
             folder.machine(1).root.relative_to(folder.root).as_posix(),
             folder.lora_step(250).relative_to(folder.root).as_posix(),
             folder.tensorboard.name, folder.wandb.name, folder.merged_checkpoint.name}
    assert {n for n in names if n not in text} == set()
    assert {t for t in EVENT_TYPES if f"| `{t}` |" not in text} == set()
    assert {s for s in STATES if f"`{s}`" not in text} == set()
    fields = {f.name for f in dataclasses.fields(RunStatus)}
    assert {f for f in fields if f"`{f}`" not in text} == set()
