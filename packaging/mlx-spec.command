#!/usr/bin/env bash
# Double-click in Finder: macOS opens this in Terminal, which runs the app (installing it with uv
# on first use, see mlx-spec-launcher.sh). Keep it next to mlx-spec-launcher.sh.
cd "$(dirname "$0")" || exit 1
printf '\e[8;30;110t'  # ask Terminal for a window wide enough for the side panel
exec ./mlx-spec-launcher.sh
