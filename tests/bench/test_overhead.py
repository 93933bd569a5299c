"""benchmarks/overhead.py's fixed cost per step: both steps run, and the row says fwk's cost."""

import re

from benchmarks import overhead


def test_the_fixed_cost_row_times_both_steps_and_names_the_share_of_a_digits_step() -> None:
    (row,) = overhead.fixed_rows(quick=True)
    assert row.name == "fixed cost per step (digits_cnn 1 channel, batch 1)"
    assert row.a.unit == row.b.unit == "us/step" and row.a.value > 0 and row.b.value > 0
    found = re.match(
        r"fwk - plain: ([+-]\d+) us a step, (-?[\d.]+)% of a digits_cnn step \(([\d.]+) ms at batch 64", row.notes
    )
    assert found, row.notes
    cost, share, step_ms = int(found[1]), float(found[2]), float(found[3])
    assert abs(cost - (row.a.value - row.b.value)) <= 1
    assert abs(share - 100 * cost / (1000 * step_ms)) < 0.2
    assert re.search(r"and the rollback snapshots: [+-]\d+ us \(measured against fwk's step without them\)", row.notes)
