#!/usr/bin/env python3
"""Check (or apply, in this process) the verl patches TensorHub needs, and print one line per patch.

The patches themselves live in the package (``tensorhub_verl/verl/patches/verl_<version>_*.py``) so
that every Ray worker that imports the ``tensorhub`` backend applies them; this script is the shell-side
preflight used by ``recipes/``: it exits 1 if a patch does not fit the installed verl.

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
    from tensorhub_verl.verl.patches import apply_all

    results = apply_all(args.verl_version, now=True)
    for r in results:
        print(f"{'APPLIED' if r.applied else 'SKIPPED'} {r.name}: {r.reason}")
    return 1 if args.check and not all(r.applied for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
