#!/usr/bin/env bash
# System packages the test suite needs that pip cannot install: Chromium, for the HTML report
# test (tests/test_report.py loads the page in headless Chromium). Idempotent: a no-op (well
# under a second) when everything is there. Installs with apt-get on Debian/Ubuntu as root
# (or through sudo); elsewhere it says what is missing and the report test is skipped.
set -euo pipefail
have_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
have_chromium && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_test_deps: no chromium and no apt-get; install Chromium to run tests/test_report.py" >&2
    exit 0
fi
sudo=""
if [[ $(id -u) != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "setup_test_deps: not root and no sudo; install the 'chromium' package to run tests/test_report.py" >&2
        exit 0
    fi
fi
echo "setup_test_deps: installing chromium (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
have_chromium
