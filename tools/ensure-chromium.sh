#!/usr/bin/env bash
# The browser test drives Debian's chromium through the playwright package
# (`playwright install` cannot download here). Install it when we may; otherwise say how,
# and the browser test skips with the same advice.
set -u
if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: chromium not found and no apt-get; the browser test will be skipped" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if sudo -n true 2>/dev/null; then SUDO="sudo"; else
        echo "note: chromium not found; install it with 'sudo apt-get install -y chromium'" \
             "to run the browser test (skipped for now)" >&2
        exit 0
    fi
fi
echo "installing chromium for the browser test (apt-get, about 40 s)"
$SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
