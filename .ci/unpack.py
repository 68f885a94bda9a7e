"""Unpack a folder of ``*.xz`` binaries (``../shared/envtest``, ``../shared/volcano-ref``) into a cache
outside the repository, check them against the folder's ``SHA256SUMS``, and print the cache path.

Run again, it unpacks nothing whose checksum already matches.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import sys
from pathlib import Path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(source: Path, dest: Path) -> Path:
    sums = dict(reversed(line.split()) for line in (source / "SHA256SUMS").read_text().splitlines() if line.strip())
    dest.mkdir(parents=True, exist_ok=True)
    for name, expected in sums.items():
        name = name.lstrip("*")
        target = dest / name
        if target.exists() and _sha256(target) == expected:
            continue
        partial = target.with_suffix(".partial")
        with lzma.open(source / f"{name}.xz") as packed, partial.open("wb") as out:
            while block := packed.read(1 << 20):
                out.write(block)
        if _sha256(partial) != expected:
            partial.unlink()
            raise SystemExit(f"unpack: {source / name}.xz does not match SHA256SUMS")
        partial.chmod(0o755)
        os.replace(partial, target)
    return dest


if __name__ == "__main__":
    print(unpack(Path(sys.argv[1]), Path(sys.argv[2])))
