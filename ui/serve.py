"""Starts the Gradio app (built in a later issue); refuses unsafe serving first."""

from __future__ import annotations

import argparse
import sys


def serve(args: argparse.Namespace) -> int:
    print("The web UI is not built yet; use `python app.py --no-ui --preset demo` "
          "or `--no-ui --config FILE`.", file=sys.stderr)
    return 2
