"""decode.py's rows in the harness: images/s of the whole image pipeline at 224 px on
ImageNet-like photos (2,000 of 500x375 px, ~95 KB), fwk's image folder and fwk's streamed
shards (local, and from an S3-compatible server on loopback) against torchvision's
ImageFolder; and ``fwk data prepare``'s own images/s. Targets: the image folder
>= 2x torchvision, local shards >= 3x.

decode.run gives each pipeline's median, min and max images/s over interleaved passes and
the ratio of the medians; the row shows that ratio, with the rounds' ratios as its range.
"""

from __future__ import annotations

import os

from benchmarks.harness import Row, Side, check


def rows(quick: bool) -> list:
    workers = max(1, min(2, (os.cpu_count() or 1)))
    return table_rows(200 if quick else 2000, workers, 1 if quick else 3)


def table_rows(images: int, workers: int, rounds: int, s3: bool = True) -> list:
    from benchmarks.decode import run  # the data pipeline's benchmark

    got = run(images=images, workers=workers, rounds=rounds, s3=s3)
    by = {r["name"]: r for r in got["rows"]}
    ref = by.pop("torchvision")
    note = f"{got['images']} photos, {got['kb']:.0f} KB on average; {workers} workers, batch {got['batch']}"
    out = []
    for name, r in by.items():
        target = ">= 2x" if name == "fwk folder" else ">= 3x" if name.startswith("fwk shards") else ""
        ratio = r["ratio"]
        out.append(
            Row(
                "decode",
                f"224 px pipeline: {name} vs torchvision ImageFolder",
                f"{name}/torchvision images/s",
                ratio,
                min(r["round_ratios"]),
                max(r["round_ratios"]),
                Side(name, r["images_per_s"], "images/s"),
                Side("torchvision", ref["images_per_s"], "images/s"),
                target,
                check(ratio, target),
                f"{note}; {name} [{r['min']:.0f}, {r['max']:.0f}], torchvision [{ref['min']:.0f}, {ref['max']:.0f}] "
                f"images/s; first batch after {r['first_s']:.2f} s (torchvision {ref['first_s']:.2f} s)",
            )
        )
    for side, rate in got["prepare"].items():
        out.append(Row("decode", f"fwk data prepare --max-side {side}", "", notes=f"{rate:.0f} images/s, "
                       f"{workers} workers ({got['images']} photos + val)"))  # fmt: skip
    return out
