"""Start the web UI safely: logins, the refusal to serve publicly without them, launch.

- 127.0.0.1 by default; `--listen` serves on every interface; `--share` asks Gradio for
  a public share link.
- `--auth user:pass` (repeatable) and `--auth-file FILE` (one user:pass a line; blank
  lines and `#` comments skipped) turn the login on.
- `--listen` or `--share` without a login refuses to start, saying how to add one;
  `--no-auth` overrides that for trusted networks.

Gradio is imported only after these checks, so a refusal is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_REFUSED = 2


class AuthError(ValueError):
    """A login given on the command line or in the auth file cannot be used."""


def parse_login(text: str, where: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user.strip() or not password:
        raise AuthError(f"{where}: expected user:pass (a user name, a colon, a password)")
    return user.strip(), password


def read_auth_file(path: str | Path) -> list[tuple[str, str]]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthError(f"--auth-file {path}: cannot read it ({exc.strerror or exc})") from None
    logins = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            logins.append(parse_login(line, f"{path}:{number}"))
    if not logins:
        raise AuthError(f"--auth-file {path}: no user:pass line in it")
    return logins


def collect_auth(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Every login from --auth and --auth-file (the password is never printed)."""
    logins = [parse_login(item, "--auth") for item in args.auth]
    if args.auth_file:
        logins += read_auth_file(args.auth_file)
    return logins


def refusal(args: argparse.Namespace, logins: list[tuple[str, str]]) -> str | None:
    """Why the UI must not start as asked, or None."""
    if logins or args.no_auth or not (args.listen or args.share):
        return None
    how = "--share (a public link)" if args.share else "--listen (every network interface)"
    return (f"refusing to start: {how} without a login would let anyone who reaches it "
            "train on this machine and read its files.\n"
            "Add a login with --auth user:pass (repeatable) or --auth-file FILE (one "
            "user:pass a line), e.g.\n"
            f"  python app.py {'--share' if args.share else '--listen'} --auth alice:s3cret\n"
            "or, on a trusted network only, pass --no-auth.")


def serve(args: argparse.Namespace) -> int:
    try:
        logins = collect_auth(args)
    except AuthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    reason = refusal(args, logins)
    if reason:
        print(reason, file=sys.stderr)
        return EXIT_REFUSED
    workspace = Path(args.workspace).expanduser().absolute()
    workspace.mkdir(parents=True, exist_ok=True)
    # Files Gradio itself serves (thumbnails, downloads) live in the workspace too.
    os.environ.setdefault("GRADIO_TEMP_DIR", str(workspace / ".gradio"))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from ui.app import launch_app
    from ui.context import AppContext

    ctx = AppContext(workspace, secrets=[password for _, password in logins])
    host = "0.0.0.0" if args.listen else "127.0.0.1"
    print(f"workspace: {workspace}; serving on {host}:{args.port}"
          + (" with a login" if logins else " without a login"), flush=True)
    try:
        # quiet: Gradio's own banner tells the user to set `share=True` in launch(),
        # which is this app's --share flag.
        demo, url = launch_app(ctx, server_name=host, port=args.port, share=args.share,
                               auth=logins, prevent_thread_lock=True, quiet=True)
        print(banner(url, getattr(demo, "share_url", None), args.share), flush=True)
        demo.block_thread()
    finally:
        ctx.close()
    return 0


def banner(url: str, share_url: str | None, share: bool) -> str:
    """Where the UI is, in this app's terms (its flags, not Gradio's launch() arguments)."""
    lines = [f"Running on local URL: {url}"]
    if share_url:
        lines.append(f"Public share link: {share_url}")
    elif share:
        lines.append("No share link could be created (Gradio's share server unreachable?)")
    else:
        lines.append("For a public link, restart with --share (it needs --auth or "
                     "--auth-file).")
    return "\n".join(lines)
