"""Writes a copy of a NIXL wheel without the parts TensorHub never loads, its RECORD kept valid.

    python scripts/slim_wheel.py SRC.whl DST.whl      # prints one JSON line: bytes before and after, entries dropped
    python scripts/slim_wheel.py --check WHEEL.whl    # exits 1 naming every RECORD problem

Dropped (``DROP``): the expert-parallel kernels (``nixl_ep_cu<N>/``, built for other torch releases and imported
by nothing here), the C++ headers, pkg-config data and example programs (``*.data/``, ``nixl_cu<N>.scripts/``) and
UCX's perftest modules (loaded only by the ``ucx_perftest`` tool). Everything the Python binding, its plugins and
UCX's transports load stays. The copy keeps the wheel's name and metadata; its RECORD lists exactly the files it
holds, each with its sha256 and size, so ``pip install`` and ``--check`` accept it.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import re
import sys
import zipfile
from pathlib import Path

DROP = (
    re.compile(r"^nixl_ep_cu\d+/"),
    re.compile(r"^[^/]+\.data/(headers|scripts|data)/"),
    re.compile(r"^nixl_cu\d+\.scripts/"),
    re.compile(r"^nixl_cu\d+\.libs/ucx/libucx_perftest_"),
)


def dropped(name: str) -> bool:
    """Whether a wheel entry goes."""
    return any(p.search(name) for p in DROP)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record_name(names: list[str]) -> str:
    records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if len(records) != 1:
        raise ValueError(f"a wheel holds exactly one *.dist-info/RECORD, found {records}")
    return records[0]


def slim(src: Path, dst: Path) -> dict:
    """Copies ``src`` to ``dst`` without the entries ``dropped`` selects, with a RECORD rewritten to match."""
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        record = _record_name(names)
        kept = [n for n in names if n != record and not dropped(n)]
        rows = []
        tmp = dst.with_name(dst.name + ".part")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for name in kept:
                info = zin.getinfo(name)
                data = zin.read(name)
                out = zipfile.ZipInfo(name, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out, data, compresslevel=9)
                rows.append((name, _record_hash(data), str(len(data))))
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            writer.writerows(rows)
            writer.writerow((record, "", ""))
            out = zipfile.ZipInfo(record, date_time=zin.getinfo(record).date_time)
            out.external_attr = zin.getinfo(record).external_attr
            zout.writestr(out, text.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(dst)
    return {"wheel": dst.name, "bytes_before": src.stat().st_size, "bytes_after": dst.stat().st_size,
            "entries_dropped": len(names) - 1 - len(kept)}


def record_problems(wheel: Path) -> list[str]:
    """Every way ``wheel``'s RECORD disagrees with its contents (empty: valid)."""
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        record = _record_name(names)
        listed = {}
        for row in csv.reader(io.StringIO(z.read(record).decode())):
            if row:
                listed[row[0]] = row[1:]
        for name in names:
            if name == record:
                continue
            if name not in listed:
                problems.append(f"{name}: in the wheel, not in RECORD")
                continue
            data = z.read(name)
            digest, size = listed[name]
            if digest != _record_hash(data) or size != str(len(data)):
                problems.append(f"{name}: RECORD says {digest} {size}, the file is {_record_hash(data)} {len(data)}")
        problems += [f"{n}: in RECORD, not in the wheel" for n in listed if n not in names]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check WHEEL's RECORD instead of slimming")
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        bad = [f"{w.name}: {p}" for w in args.paths for p in record_problems(w)]
        print("\n".join(bad) if bad else f"RECORD valid: {', '.join(w.name for w in args.paths)}")
        return 1 if bad else 0
    if len(args.paths) != 2:
        parser.error("slimming takes SRC.whl DST.whl")
    print(json.dumps(slim(*args.paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
