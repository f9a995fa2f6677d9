#!/usr/bin/env bash
# Emulated cluster on this machine (needs root + iproute2). Thin wrapper over the Python module:
#   scripts/netlab.sh selftest [--nixl]        measure shaped vs achieved rates, print JSON
#   scripts/netlab.sh up --dcs 2 --hosts 2 --nic-mbit 200 --wan-mbit 100   hold a lab until Ctrl-C
#   scripts/netlab.sh cleanup [--force]        remove namespaces left by killed runs
# PYTHON selects the interpreter (default: python3 on PATH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${ROOT}:${ROOT}/dev${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m tensorhub_dev.netlab "$@"
