#!/usr/bin/env bash
# Builds the offline wheelhouse of the core for a GPU host without a package index (run on a connected machine):
# every wheel of requirements/gpu-wheels.txt for the host's Python and CUDA major, hash-checked, the NIXL wheel
# slimmed (scripts/slim_wheel.py), a SHA256SUMS of what is written, the list and the total printed. Fails when
# the total passes --max-mib (40 by default: the repository and the wheelhouse together must fit in 64 MiB).
#   bash scripts/gpu_wheels.sh                                # CPython 3.12, CUDA 13, into .gpu_wheels/
#   bash scripts/gpu_wheels.sh --python 3.11 --cuda 12 --dest DIR
# On the GPU host: bash scripts/gpu_check.sh --wheels .gpu_wheels --out DIR (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=3.12
CUDA=13
DEST=.gpu_wheels
MAX_MIB=40
PYTHON=${PYTHON:-python3}
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY_VERSION=${2:?--python needs a version, e.g. 3.12}; shift 2 ;;
    --cuda) CUDA=${2:?--cuda needs a CUDA major, 12 or 13}; shift 2 ;;
    --dest) DEST=${2:?--dest needs a folder}; shift 2 ;;
    --max-mib) MAX_MIB=${2:?--max-mib needs a number}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_wheels.sh: unknown argument '$1' (accepted: --python X.Y, --cuda 12|13, --dest DIR, --max-mib N)" >&2
       exit 2 ;;
  esac
done
case "$CUDA" in 12|13) ;; *) echo "gpu_wheels.sh: --cuda must be 12 or 13 (NIXL ships nixl-cu12 and nixl-cu13), got '$CUDA'" >&2; exit 2 ;; esac
case "$PY_VERSION" in 3.11|3.12) ;; *) echo "gpu_wheels.sh: --python must be 3.11 or 3.12 (requirements/gpu-wheels.txt holds hashes for those), got '$PY_VERSION'" >&2; exit 2 ;; esac

OTHER=$([ "$CUDA" = 13 ] && echo 12 || echo 13)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The list without the other CUDA major's NIXL line (a requirement and its --hash continuation lines).
awk -v drop="nixl-cu$OTHER==" 'index($0, drop) == 1 {skip = 1; next} skip && /^ / {next} {skip = 0; print}' \
  requirements/gpu-wheels.txt > "$WORK/wheels.txt"

# The index alone, as for a GPU host: no local find-links folder, no site-wide pip configuration.
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
  --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WORK/dl" -r "$WORK/wheels.txt"

rm -rf "$DEST"
mkdir -p "$DEST"
for whl in "$WORK"/dl/*.whl; do
  case "$(basename "$whl")" in
    nixl_cu*) "$PYTHON" scripts/slim_wheel.py "$whl" "$DEST/$(basename "$whl")" >/dev/null
              "$PYTHON" scripts/slim_wheel.py --check "$DEST/$(basename "$whl")" >/dev/null ;;
    *) cp "$whl" "$DEST/" ;;
  esac
done
(cd "$DEST" && sha256sum -- *.whl > SHA256SUMS)

"$PYTHON" - "$DEST" "$MAX_MIB" "$PY_VERSION" "$CUDA" <<'EOF'
import json, sys
from pathlib import Path
dest, max_mib = Path(sys.argv[1]), float(sys.argv[2])
files = sorted(dest.glob("*.whl"))
total = sum(f.stat().st_size for f in files)
for f in files:
    print(f"{f.stat().st_size / 2**20:8.2f} MiB  {f.name}")
print(f"{total / 2**20:8.2f} MiB  total, {len(files)} wheels in {dest}/ (limit {max_mib:g} MiB)")
print(json.dumps({"wheelhouse": str(dest), "python": sys.argv[3], "cuda": int(sys.argv[4]), "wheels": len(files),
                  "total_mib": round(total / 2**20, 2), "limit_mib": max_mib,
                  "files": {f.name: f.stat().st_size for f in files}}))
if total > max_mib * 2**20:
    sys.exit(f"gpu_wheels.sh: {total / 2**20:.2f} MiB is over the {max_mib:g} MiB limit")
EOF
