"""One benchmark's rows as the harness's markdown table, on a chosen device: the speed
parts of ``make gpu-check`` that reuse the benchmarks of ``make bench`` (their rows).

    python -m benchmarks.gpu.bench_rows tta CASE [--device cuda] [--quick] [--reps N] [--no-tune]
    python -m benchmarks.gpu.bench_rows decode [--images N] [--rounds N] [--workers N] [--no-s3]
    python -m benchmarks.gpu.bench_rows resnet50 [--device cuda] [--quick] [--reps N]

Exit 0 with the table and an ``ok:`` line when every row was measured (a missed target is
a figure, not a failure); 1 naming the rows that failed.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.harness import table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("group", choices=["tta", "decode", "resnet50"])
    parser.add_argument("case", nargs="?", default="gpt_stdlib", help="tta: the case (digits_cnn, gpt_stdlib, ...)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=0, help="tta: seeds per side (0: the case's own); resnet50: runs")
    parser.add_argument("--no-tune", action="store_true", help="tta: no plain (tuned) side (its grid is long)")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args()
    if args.group == "tta":
        from benchmarks import tta

        rows = tta.one(args.case, args.quick, args.device, args.reps or None, tuned=not args.no_tune)
    elif args.group == "resnet50":  # its CUDA size on a GPU, else its full or --quick CPU size
        from benchmarks import resnet50

        rows = resnet50.one("cuda" if args.device == "cuda" else "quick" if args.quick else "full", args.reps or None)
    else:
        from benchmarks import decode_rows

        rows = decode_rows.table_rows(args.images, args.workers, args.rounds, s3=not args.no_s3)
    print(table(rows))
    failed = [r.name for r in rows if r.failed]
    if failed:
        print(f"FAILED: rows {', '.join(failed)}: {rows[0].failed if len(rows) == 1 else 'see the table'}")
        return 1
    met = [r for r in rows if r.met is not None]
    print(f"ok: {args.group} {len(rows)} rows, {sum(bool(r.met) for r in met)} of {len(met)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
