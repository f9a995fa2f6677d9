#!/usr/bin/env python3
"""Check (or apply, in this process) the verl patches TensorHub needs, and print one line per patch.

The patches themselves live in the package (``tensorhub_verl/verl/patches/verl_<version>_*.py``) so
that every Ray worker that imports the ``tensorhub`` backend applies them; this script is the shell-side
preflight used by ``recipes/``: it exits 1 if a patch does not fit the installed verl. On ``VERL_PLATFORM=cpu`` it
also checks the CPU harness's patches (``dev/tensorhub_dev/verl_cpu``, installed with ``pip install -e dev/``).

    python patches/verl/apply_patches.py --check
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any patch does not fit the installed verl")
    parser.add_argument("--verl-version", default=None, help="check against this verl version instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a script: configuring logging is ours
    from tensorhub_verl.settings import cpu_platform_selected
    from tensorhub_verl.verl.patches import apply_all, apply_patches

    results = apply_all(args.verl_version, now=True)
    if cpu_platform_selected():
        try:
            from tensorhub_dev.verl_cpu.plugin import PATCH_MODULES
        except ImportError:
            print("MISSING the CPU harness: VERL_PLATFORM=cpu needs dev/ installed (pip install -e dev/)")
            return 1
        results += apply_patches(PATCH_MODULES, args.verl_version, now=True)
    for r in results:
        # FITS: fits this verl, registered only where asked for (the placement patches); APPLIED: applied here.
        state = ("FITS" if r.reason.startswith("fits") else "APPLIED") if r.applied else "SKIPPED"
        print(f"{state} {r.name}: {r.reason}")
    return 1 if args.check and not all(r.applied for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
