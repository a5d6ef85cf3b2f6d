#!/usr/bin/env bash
# The one command that runs Chital's tests on a fresh machine: installs what they need, then pytest.
# Docker/bubblewrap sandbox tests need root to install docker.io and bubblewrap; without it they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
if [ -x scripts/setup-sandbox.sh ] && [ "$(id -u)" = 0 ] && [ "${CHITAL_SKIP_SANDBOX_SETUP:-0}" != 1 ]; then
  bash scripts/setup-sandbox.sh || echo "sandbox setup failed: docker/bwrap tests will skip" >&2
fi
# Static checks first: a formatting slip or a type error fails in seconds, not after the suite.
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy ALL_PROXY all_proxy
exec python3 -m pytest -q -p no:cacheprovider "$@"
