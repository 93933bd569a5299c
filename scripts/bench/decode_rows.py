"""decode.py's rows in the harness: images/s of fwk's loader alone (no model) against
torchvision's PIL-based ImageFolder, same transforms, workers and batch, on folders of real
JPEGs at 64 and 224 px that it writes. Target (issue 11): >= 2x at both sizes.

decode.run gives each loader's median, min and max images/s over interleaved passes and
the ratio of the medians; the row shows that ratio, and each side's range in the notes.
"""

from __future__ import annotations

import os

from harness import Row, Side, check


def rows(quick: bool) -> list:
    from decode import run  # scripts/bench/decode.py (the data pipeline's benchmark)

    workers = max(1, min(2, (os.cpu_count() or 1)))
    got = run(sizes=(64,) if quick else (64, 224), images=64 if quick else 256, batch=32, workers=workers,
              rounds=2 if quick else 5)
    out = []
    for size in sorted({r["size"] for r in got}):
        by = {r["loader"]: r for r in got if r["size"] == size}
        ref = by["torchvision"]
        for name, r in by.items():
            if name == "torchvision":
                continue
            ratio = r["images_per_s"] / ref["images_per_s"]  # of the medians; [min, max] of the rounds' ratios
            target = ">= 2x" if name == "fwk" else ""
            out.append(Row(
                "decode", f"loader alone {size} px: {name} vs torchvision ImageFolder", f"{name}/torchvision images/s",
                ratio, min(r["round_ratios"]), max(r["round_ratios"]), Side(name, r["images_per_s"], "images/s"),
                Side("torchvision", ref["images_per_s"], "images/s"), target, check(ratio, target),
                f"{workers} workers, batch 32; {name} [{r['min']:.0f}, {r['max']:.0f}], torchvision "
                f"[{ref['min']:.0f}, {ref['max']:.0f}] images/s; worker CPU {r['user_ms_per_image']:.2f} vs "
                f"{ref['user_ms_per_image']:.2f} user ms/image",
            ))
    return out
