#!/usr/bin/env bash
# Set Chital up on this machine: the package in a virtualenv, and bubblewrap, without which the
# agent's sandbox cannot run code. The README's set-up command:
#
#   bash scripts/setup.sh && .venv/bin/chital run
#
# A virtualenv (./.venv, or $CHITAL_VENV) because Debian and Ubuntu's own Python refuses
# `pip install` outside one. As root on Debian/Ubuntu, what is missing is apt-installed
# (bubblewrap; python3-venv when Python has no venv module); otherwise the exact command is
# printed: Chital still runs without bubblewrap, but `chital check` warns and the agent refuses
# to run commands. Idempotent. Tests are set up by scripts/test.sh, not this.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CHITAL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

say() { printf '[setup] %s\n' "$*" >&2; }
is_root() { [ "$(id -u)" = 0 ]; }
has_apt() { command -v apt-get >/dev/null 2>&1; }
apt_install() {
    say "apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}
how_to_install() {  # the command for this system's package manager
    if has_apt; then echo "sudo apt-get install $1"
    elif command -v dnf >/dev/null 2>&1; then echo "sudo dnf install $1"
    elif command -v pacman >/dev/null 2>&1; then echo "sudo pacman -S $1"
    elif command -v apk >/dev/null 2>&1; then echo "sudo apk add $1"
    else echo "install the package '$1' with your system's package manager"
    fi
}

# --- 1. Python >= 3.11 -------------------------------------------------------------------------
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    say "no $PYTHON: install Python 3.11 or newer ($(how_to_install python3)), or set PYTHON=/path/to/python3"
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    say "$("$PYTHON" -V 2>&1) is too old: Chital needs 3.11 or newer (set PYTHON=/path/to/python3.11)"
    exit 1
fi

# --- 2. the virtualenv and Chital in it --------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"  # a venv without pip (Debian's python3 lacks ensurepip) is of no use
        if is_root && has_apt; then
            apt_install python3-venv
            "$PYTHON" -m venv "$VENV"
        else
            say "$PYTHON cannot create a virtualenv: run \`$(how_to_install python3-venv)\`, then this again"
            exit 1
        fi
    fi
fi
say "installing Chital into $VENV"
# requirements.lock: the versions the test suite passed on (docs/deploy.md says how to refresh it).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c requirements.lock -e .

# --- 3. bubblewrap, for the agent's sandbox ----------------------------------------------------
if ! command -v bwrap >/dev/null 2>&1 && is_root && has_apt; then
    apt_install bubblewrap || say "apt-get could not install bubblewrap"
fi
if ! command -v bwrap >/dev/null 2>&1; then
    say "bubblewrap is missing: the agent cannot run code until you run \`$(how_to_install bubblewrap)\`"
    say "  (or use the docker sandbox provider: docs/sandbox.md)"
elif ! err="$(bwrap --ro-bind / / --unshare-all --new-session --die-with-parent true 2>&1)"; then
    # Typically unprivileged user namespaces are off (Ubuntu 24.04's AppArmor restriction, or the
    # kernel.unprivileged_userns_clone sysctl); docs/sandbox.md says what to do.
    say "bubblewrap is installed but cannot create a sandbox here: ${err:-unknown error} (docs/sandbox.md)"
else
    say "bubblewrap works: $(command -v bwrap)"
fi

say "ready: $VENV/bin/chital ($("$VENV/bin/python" -V 2>&1)). Next:"
say "  $VENV/bin/chital init -c ~/chital/config.yaml   # asks for channels, model and tokens, then checks"
say "  $VENV/bin/chital -c ~/chital/config.yaml run     # (\`. $VENV/bin/activate\` puts chital on PATH)"
