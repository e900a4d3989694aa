"""Write docs/config.md, the config-key reference, from the config's field metadata.

    .venv/bin/python tools/config_reference.py          # rewrite docs/config.md
    .venv/bin/python tools/config_reference.py --check  # exit 1 when it is out of date

The same metadata drives validation, `--set` and the UI form, so the reference cannot say
something the code does not do. tests/test_docs.py runs the check.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.config import Config, DatasetConfig  # noqa: E402

DOC = ROOT / "docs" / "config.md"
HEADER = """# Config keys (contract)

A run is one TOML file with `version = 1`. Keys below are fixed (more may be added);
an unknown key is an error that names it and its line. Relative paths resolve against the workspace.
Generated from the field metadata in `core/config/schema.py` by `tools/config_reference.py`;
do not edit by hand.
"""


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value).replace("'", '"')


def _allowed(meta: dataclasses.Field) -> str:
    info = meta.metadata
    if info.get("choices"):
        return " \\| ".join(f"`{c}`" for c in info["choices"])
    low, high = info.get("min"), info.get("max")
    if low is None and high is None:
        return ""
    left = ">" if info.get("min_exclusive") else "≥"
    right = "<" if info.get("max_exclusive") else "≤"
    parts = [f"{left} {low:g}" if low is not None else "", f"{right} {high:g}" if high else ""]
    return ", ".join(p for p in parts if p)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def section_rows(name: str, cls: type) -> list[str]:
    header = f"[[{name}]]" if name == "datasets" else f"[{name}]"
    prefix = f"{name}.N" if name == "datasets" else name  # as --set spells it
    rows = [f"## `{header}`", "", "| key | default | allowed | label: help |",
            "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        info = f.metadata
        text = info.get("label", "")
        if info.get("help"):
            text += f": {info['help']}"
        if info.get("family"):
            text += f" *({info['family']} only: its options.py)*"
        if info.get("advanced"):
            text += " *(advanced)*"
        text = text.replace("|", "\\|")
        rows.append(f"| `{prefix}.{f.name}` | `{_default(_field_default(f))}` | "
                    f"{_allowed(f)} | {text} |")
    return rows + [""]


def render() -> str:
    lines = [HEADER]
    for f in dataclasses.fields(Config):
        if f.name == "version":
            continue
        default = _field_default(f)
        # Every section is a dataclass; `datasets` is a list of DatasetConfig tables.
        cls = DatasetConfig if isinstance(default, list) else type(default)
        lines += section_rows(f.name, cls)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is out of date: run .venv/bin/python tools/config_reference.py")
            return 1
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
