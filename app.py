"""Entry point: the Gradio app by default, or the headless twin with --no-ui.

Only argparse and the standard library load here, so `python app.py --help` is instant;
torch, diffusers and gradio are imported by the code paths that use them.
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    # The registry's names (no torch import): a new family shows up here by itself.
    from core.models.registry import list_families

    parser = argparse.ArgumentParser(
        prog="app.py",
        description=f"Fine-tune diffusion image models ({', '.join(list_families())}) on "
                    "your own pictures. Starts the web UI unless --no-ui is given.",
        epilog="Exit codes (--no-ui): 0 done, 2 invalid config or datasets, 1 run failed, "
               "130 stopped by the user.",
    )
    ui = parser.add_argument_group("web UI")
    ui.add_argument("--listen", action="store_true",
                    help="serve on all interfaces (0.0.0.0) instead of 127.0.0.1; needs auth")
    ui.add_argument("--port", type=int, default=7860, help="port for the UI (default 7860)")
    ui.add_argument("--share", action="store_true",
                    help="create a public Gradio share link; needs auth")
    ui.add_argument("--auth", metavar="USER:PASS", action="append", default=[],
                    help="require this login (repeatable)")
    ui.add_argument("--auth-file", metavar="FILE",
                    help="file with one user:pass a line")
    ui.add_argument("--no-auth", action="store_true",
                    help="allow --listen/--share without auth (trusted networks only)")

    headless = parser.add_argument_group("headless")
    headless.add_argument("--no-ui", action="store_true",
                          help="run headless: check, cache and train from a config")
    source = headless.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help="TOML config to run")
    source.add_argument("--preset", metavar="NAME",
                        help="a preset from presets/ (e.g. demo) or a path to one")
    headless.add_argument("--stage", choices=("check", "cache", "train", "all", "caption", "merge"),
                          default="all",
                          help="which stage to run (default all: check, cache, train; "
                               "caption writes captions with [captioning].model; merge "
                               "fuses the run's final LoRA into the base: "
                               "<output.dir>/merged/)")
    headless.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                          default=[], help="override a config key, e.g. train.max_steps=20 "
                                           "or datasets.0.repeats=3 (repeatable)")
    headless.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                          help="resume the run in output.dir from its latest (or the named) "
                               "checkpoint")
    parser.add_argument("--workspace", default="workspace", metavar="DIR",
                        help="folder that relative config paths resolve against; runs, "
                             "caches and demo data live here (default ./workspace)")
    return parser


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """`own_process`: this is `python app.py` itself, not a caller (a test) in whose
    process more may run afterwards."""
    args = build_parser().parse_args(argv)
    if args.no_ui:
        from core.headless import run_headless

        return run_headless(args, own_process=own_process)
    from ui.serve import serve

    return serve(args)


if __name__ == "__main__":
    from core.exits import exit_with

    exit_with(main(own_process=True))
