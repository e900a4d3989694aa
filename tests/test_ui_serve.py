"""Serving safely: logins, the refusal to serve publicly without one, and an app with a
login that gives nothing to a request without credentials."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, app_and_loaded_modules
from test_ui_support import free_port, running_app

from ui.serve import AuthError, collect_auth, read_auth_file, refusal


def args(*argv: str) -> argparse.Namespace:
    from app import build_parser

    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("flag", ["--share", "--listen"])
def test_public_serving_without_a_login_refuses_and_says_how_to_add_one(tmp_path, flag):
    done, loaded = app_and_loaded_modules(flag, "--workspace", str(tmp_path / "ws"),
                                          modules=("gradio",), timeout=60)
    assert done.returncode == 2
    assert "refusing to start" in done.stderr
    for hint in ("--auth user:pass", "--auth-file FILE", "--no-auth"):
        assert hint in done.stderr
    # The refusal comes at once: before the seconds gradio takes to import.
    assert loaded == [], done.stderr[-2000:]


def test_a_login_or_no_auth_lifts_the_refusal_and_localhost_needs_none(tmp_path):
    assert refusal(args("--share"), []) is not None
    assert refusal(args("--share", "--auth", "a:b"), [("a", "b")]) is None
    assert refusal(args("--listen", "--no-auth"), []) is None
    assert refusal(args(), []) is None


def test_auth_file_lines_comments_and_colons_in_passwords(tmp_path):
    path = tmp_path / "users.txt"
    path.write_text("# team logins\nalice:s3:cret\n\n  bob:pw  \n")
    assert read_auth_file(path) == [("alice", "s3:cret"), ("bob", "pw")]
    both = collect_auth(args("--auth", "carol:x", "--auth-file", str(path)))
    assert both[0] == ("carol", "x") and len(both) == 3
    path.write_text("alice:ok\nbroken-line\n")
    with pytest.raises(AuthError, match=r"users.txt:2: expected user:pass"):
        read_auth_file(path)
    with pytest.raises(AuthError, match="cannot read it"):
        read_auth_file(tmp_path / "missing.txt")
    done = subprocess.run([PYTHON, "app.py", "--listen", "--auth", "nopassword"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--auth: expected user:pass" in done.stderr


def test_with_auth_on_a_request_without_credentials_gets_nothing(tmp_path):
    import httpx
    from gradio_client import Client

    secret_file = tmp_path / "ws" / "secret.txt"
    secret_file.parent.mkdir(parents=True)
    secret_file.write_text("workspace file content")
    with running_app(tmp_path / "ws", auth=[("alice", "pa55word-xyz")]) as (_, url):
        base = url.rstrip("/")
        for path in ("/config", "/gradio_api/info", f"/gradio_api/file={secret_file}",
                     "/gradio_api/queue/status", "/dt/changes"):
            response = httpx.get(base + path, timeout=10)
            assert response.status_code == 401, path
            assert "workspace file content" not in response.text
        login_page = httpx.get(base + "/", timeout=10).text
        assert "pa55word-xyz" not in login_page and "Diffusion fine-tuning" not in login_page
        with pytest.raises(Exception, match="credentials"):
            Client(url, verbose=False)
        client = Client(url, auth=("alice", "pa55word-xyz"), verbose=False)
        assert client.predict(api_name="/runs") == []
        with httpx.Client(base_url=base, timeout=10) as http:
            http.post("/login", data={"username": "alice", "password": "pa55word-xyz"})
            config = http.get("/config")
            assert config.status_code == 200 and "pa55word-xyz" not in config.text
            # The idle page's look (ui/idle.py): a number and a flag, nothing else.
            changes = http.get("/dt/changes")
            assert changes.status_code == 200
            assert set(changes.json()) == {"changes", "watch"}, changes.text
            served = http.get(f"/gradio_api/file={secret_file}")
            assert served.status_code == 200, "the workspace is served to a logged-in user"
            outside = http.get(f"/gradio_api/file={Path(REPO) / 'app.py'}")
            assert outside.status_code == 403, "nothing outside the workspace is served"


@pytest.mark.slow
def test_the_start_banner_names_this_apps_share_flag_not_gradios_argument(tmp_path):
    import select

    port = free_port()
    proc = subprocess.Popen([PYTHON, "app.py", "--port", str(port), "--workspace",
                             str(tmp_path / "ws")], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out, deadline, fd = "", time.monotonic() + 90, proc.stdout.fileno()
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([fd], [], [], 1.0)[0]:
                out += os.read(fd, 65536).decode(errors="replace")
            if "--share" in out:  # our banner's last line; give Gradio a second more
                time.sleep(1.0)
                if select.select([fd], [], [], 0.2)[0]:
                    out += os.read(fd, 65536).decode(errors="replace")
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert f"Running on local URL: http://127.0.0.1:{port}" in out, out
    assert "restart with --share" in out and "share=True" not in out, out


@pytest.mark.slow  # six seconds of watching an idle server
def test_an_idle_server_leaves_the_cpu_alone(tmp_path):
    """With no page open and nothing running the server wakes rarely: under 4% of a core.
    (Gradio's queue looked for a new event every millisecond: about 9%.)"""
    with running_app(tmp_path / "ws"):
        time.sleep(1)  # the start settles
        before = time.process_time()  # this process's threads, the server's among them
        time.sleep(5)
        used = time.process_time() - before
    assert used < 0.2, f"the idle server used {used:.2f} CPU-s in 5 s"
