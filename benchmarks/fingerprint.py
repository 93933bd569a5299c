"""The image folder's fingerprint on a large folder: a full walk against the per-folder cache.

    .venv/bin/python -m benchmarks.fingerprint [--files 200000] [--classes 1000]

Writes a folder of ``--files`` small files (train/ and val/, ``--classes`` class folders,
9:1), then times, as whole commands, ``fwk train data=imagefolder data.root=... --dry-run``
(the launcher's path of an "already complete" run: compose, validate, fingerprint, plan,
without torch) with an empty cache (a full walk: every file stat'ed) and with the cache
filled (only the folders stat'ed), interleaved over ``--reps`` rounds. Target: the
cached command under 1 s at 200k files. The harness's ``fingerprint`` rows call ``run``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_folder(root: Path, files: int, classes: int) -> None:
    per_class = max(1, files // classes)
    for c in range(classes):
        for split, share in (("train", 0.9), ("val", 0.1)):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(max(1, round(per_class * share))):
                (folder / f"{k:06d}.JPEG").write_bytes(b"\xff\xd8\xff")


def _dry_run(root: Path, cache: Path, runs: Path) -> tuple[float, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "FWK_RUNS": str(runs)}
    fwk = [sys.executable, "-m", "fwk", "train"]
    argv = [*fwk, "data=imagefolder", f"data.root={root}", "model=resnet18", "--dry-run"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("data ")), "")
    return time.perf_counter() - t0, line


def run(files: int = 200_000, classes: int = 1000, reps: int = 3) -> dict:
    with tempfile.TemporaryDirectory(prefix="fwk-bench-fingerprint-") as tmp:
        root, cache, runs = Path(tmp) / "data", Path(tmp) / "cache", Path(tmp) / "runs"
        t0 = time.perf_counter()
        make_folder(root, files, classes)
        written = time.perf_counter() - t0
        cold, warm, lines = [], [], {}
        for _ in range(reps):
            shutil.rmtree(cache, ignore_errors=True)
            seconds, lines["cold"] = _dry_run(root, cache, runs)  # an empty cache: the full walk
            cold.append(seconds)
            seconds, lines["warm"] = _dry_run(root, cache, runs)  # the cache just written
            warm.append(seconds)
        count = sum(len(names) for _, _, names in os.walk(root))
    return {
        "files": count,
        "write_s": written,
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
        "cold": cold,
        "warm": warm,
        "lines": lines,
    }


def rows(quick: bool) -> list:
    from benchmarks.harness import Row, Side, check

    files = 20_000 if quick else 200_000
    got = run(files, 100 if quick else 1000, 2 if quick else 3)
    target = "< 1" if not quick else ""
    return [
        Row(
            "fingerprint",
            f"fwk train --dry-run on a {got['files']:,}-file image folder, fingerprint cached",
            "seconds of the whole command, cache filled",
            got["warm_s"],
            min(got["warm"]),
            max(got["warm"]),
            Side("cache filled", got["warm_s"], "s"),
            Side("empty cache (full walk)", got["cold_s"], "s"),
            target,
            check(got["warm_s"], target),
            f"the launcher's path of an already complete run (no torch); {len(got['warm'])} interleaved rounds",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    got = run(args.files, args.classes, args.reps)
    print(f"{got['files']:,} files written in {got['write_s']:.1f} s")
    print(f"fwk train --dry-run, empty cache (full walk): {got['cold_s']:.2f} s (median of {got['cold']})")
    print(f"fwk train --dry-run, cache filled:            {got['warm_s']:.2f} s (median of {got['warm']})")
    print(f"target: cached < 1 s: {'met' if got['warm_s'] < 1 else 'NOT met'}")
    for kind, line in got["lines"].items():
        print(f"{kind}: {line}")


if __name__ == "__main__":
    main()
