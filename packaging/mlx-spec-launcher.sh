#!/usr/bin/env bash
# One-command launcher: installs mlx-spec as a uv tool on first use, then opens the app.
#   curl-free: run this file from a checkout, or copy it onto your PATH.
set -euo pipefail
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --user --quiet uv
fi
if ! command -v mlx-spec >/dev/null 2>&1; then
  here="$(cd "$(dirname "$0")/.." && pwd)"
  uv tool install "$here"
fi
exec mlx-spec "$@"
