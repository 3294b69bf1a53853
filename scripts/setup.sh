#!/usr/bin/env bash
# Installs what tandem needs on Debian 12, only what is missing. Idempotent.
# Run as root (CI and the dev machines are root); otherwise sudo is used if present.
set -euo pipefail

PKGS=(build-essential cmake pkg-config libopenblas-dev zlib1g-dev dataset-fashion-mnist openmpi-bin libopenmpi-dev)
# Golden fixtures are committed; python3-torch is needed only to regenerate them and for bench/.
if [[ "${TANDEM_SETUP_BENCH:-0}" == "1" ]]; then PKGS+=(python3-torch); fi
# The fuzz targets (make test runs each briefly, make fuzz longer) need clang's libFuzzer.
if [[ "${TANDEM_SETUP_FUZZ:-0}" == "1" ]]; then PKGS+=(clang libclang-rt-14-dev); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then exit 0; fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need root to install: ${missing[*]}" >&2; exit 1; fi
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
