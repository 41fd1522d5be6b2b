#!/usr/bin/env bash
# Installs what building and testing Tarn needs, when it is missing.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
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
