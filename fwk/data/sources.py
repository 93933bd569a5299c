"""Where the registered data sets read their files, and a fingerprint of what they read.

This module is torch-free. The launcher fingerprints a run's data before any worker starts,
and the fingerprint enters the run id, so the same config over other data is another run.
A fingerprint hashes a file's bytes where the data is small, as digits is one file. Else it
hashes the file list with sizes and modification times. That is what an image folder gets,
since hashing a million JPEGs would take longer than a short run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sysconfig
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fwk.errors import UserError

# Directories skipped anywhere below the stdlib root: third-party code, the test suites
# (huge and repetitive), IDLE and lib2to3 (unusual style, fixtures), and bytecode caches.
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
# The extensions torchvision's ImageFolder reads (torchvision.datasets.folder.IMG_EXTENSIONS),
# compared lower-cased: ImageNet ships ".JPEG". The image folder's scan and its fingerprint
# both use this list.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Fingerprint:
    """The fingerprint of a run's data.

    ``digest`` is 16 hex digits. ``what`` says what was hashed, for people, in meta.json and
    `fwk runs show`. ``how`` says whether it was computed now or taken from a cache, and
    ``--dry-run`` prints it."""

    digest: str
    what: str
    how: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if k != "how" or v}  # how: only when there is one


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def of_content(path: Path) -> Fingerprint:
    """Return the sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return Fingerprint(digest.hexdigest()[:16], f"sha256 of {path} ({_size(path.stat().st_size)})")


def of_files(root: Path, files: Iterable[Path]) -> Fingerprint:
    """Hash the files' paths relative to ``root``, their sizes and their modification times in ns."""
    digest = hashlib.sha256()
    count = total = 0
    for path in files:
        st = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        count += 1
        total += st.st_size
    what = f"{count:,} files, {_size(total)} under {root} (names, sizes, mtimes)"
    return Fingerprint(digest.hexdigest()[:16], what)


def walk(root: Path, suffixes: tuple[str, ...], excluded: frozenset[str] = frozenset()) -> list[Path]:
    """Return the files under ``root`` whose lowercased suffix is in ``suffixes``.

    Files in ``excluded`` folders are left out. They are sorted by relative posix path, so the order
    does not depend on the file system."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded]  # prune: never walk into them
        found.extend(Path(dirpath, f) for f in filenames if os.path.splitext(f)[1].lower() in suffixes)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def stdlib_root() -> Path:
    """Return the directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """Return all ``*.py`` files under ``root`` outside EXCLUDED_DIRS, sorted by relative posix path."""
    return walk(root, (".py",), EXCLUDED_DIRS)


def digits_file() -> Path:
    """Return scikit-learn's copy of the digits data, found without importing scikit-learn, which is slow."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise UserError("data=digits needs scikit-learn; install it with `pip install scikit-learn`")
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
