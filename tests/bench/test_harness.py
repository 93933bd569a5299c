"""The pure parts of benchmarks/harness.py (make bench): no real benchmark runs here."""

import datetime
import json
import platform
import sys
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.harness import Row, Side, check, measure_pair, ratio_row, table


def test_measure_pair_warms_up_then_alternates_who_goes_first():
    calls: list[str] = []
    pair = measure_pair(lambda: calls.append("a") or 2.0, lambda: calls.append("b") or 1.0, reps=5, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert pair.order == calls[2:]
    assert pair.a == [2.0] * 5 and pair.b == [1.0] * 5
    assert pair.ratios() == [2.0] * 5 and pair.ratios(invert=True) == [0.5] * 5


def test_measure_pair_times_sides_that_return_nothing():
    pair = measure_pair(lambda: None, lambda: None, reps=3, warmup=0)
    assert len(pair.a) == len(pair.b) == 3 and all(t >= 0 for t in pair.a + pair.b)


def test_ratio_row_takes_median_min_max_and_checks_the_target():
    sides = Side("fwk", 1, "s"), Side("plain", 1, "s")
    row = ratio_row("g", "n", [1.0, 1.3, 0.9, 1.01, 1.02], *sides, "fwk/plain", "<= 1.02x")
    assert (row.median, row.lo, row.hi) == (1.01, 0.9, 1.3)
    assert row.met is True
    assert check(2.1, ">= 2x") is True and check(0.06, "< 5%") is False and check(1.0, "") is None


def test_table_shows_each_row_and_a_failed_one_with_its_reason():
    rows = [
        ratio_row("overhead", "step", [1.0, 1.1, 1.2], Side("fwk", 3.0, "ms"), Side("plain", 2.9, "ms"), "fwk/plain"),
        harness.failed("decode", "decode", "ImportError: no module\n named decode"),
    ]
    text = table(rows)
    lines = text.splitlines()
    assert len(lines) == 4
    assert "| overhead | step | fwk/plain | 1.10x [1.00, 1.20] | fwk 3 ms | plain 2.9 ms |" in lines[2]
    assert "failed" in lines[3] and "ImportError: no module named decode" in lines[3]


def test_a_failing_group_becomes_a_failed_row_and_json_is_written(tmp_path, monkeypatch):
    rows = harness.guarded("g", "boom", lambda: 1 / 0)
    assert rows[0].failed == "ZeroDivisionError: division by zero"
    ok = Row("g", "fine", "a/b", 1.0, 1.0, 1.0, Side("a", 1.0, "s"), Side("b", 1.0, "s"))
    info = {"host": "vm", "cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cores": 2}
    started = datetime.datetime(2026, 12, 1, 14, 51, 7)
    path = harness.write_json([ok, *rows], tmp_path, info, 1.5, quick=False, started=started, command="make bench")
    assert path == tmp_path / "2026-12-01-145107-intel-xeon-platinum-8375c.json"
    doc = json.loads(path.read_text())
    assert doc["machine"] == info and doc["wall_s"] == 1.5 and doc["command"] == "make bench"
    assert [r["name"] for r in doc["rows"]] == ["fine", "boom"]
    assert harness.from_dict(doc["rows"][0]) == ok


def test_a_group_that_crashes_or_overruns_in_its_child_is_a_failed_row():
    (row,) = harness.run_isolated("no_such_group", quick=True, budget=60)  # the child raises KeyError
    assert row.failed == "KeyError: 'no_such_group'"
    (row,) = harness.run_isolated("no_such_group", quick=True, budget=0.01)
    assert row.failed == "over its budget of 0 s"


def test_rows_of_finished_parts_are_kept_for_the_parent(tmp_path, monkeypatch):
    partial = tmp_path / "partial.jsonl"
    monkeypatch.setenv("FWK_BENCH_PARTIAL", str(partial))
    ok = Row("g", "first part", "a/b", 1.0, 1.0, 1.0, Side("a", 1.0, "s"), Side("b", 1.0, "s"))
    harness.guarded("g", "first part", lambda: [ok])
    harness.guarded("g", "second part", lambda: 1 / 0)
    kept = [harness.from_dict(json.loads(line)) for line in partial.read_text().splitlines()]
    assert kept[0] == ok and kept[1].failed == "ZeroDivisionError: division by zero"
    with pytest.raises(ValueError):
        measure_pair(lambda: None, lambda: None, reps=0)


def test_only_picks_groups_and_the_cases_named_after_a_colon():
    got = harness.selection("tta:gpt_stdlib+digits_cnn,overhead")
    assert got == [("tta", ["gpt_stdlib", "digits_cnn"]), ("overhead", [])]
    assert harness.selection("") == [(g, []) for g in harness.GROUPS]
    cases = "digits_cnn,resnet_digits,gpt_stdlib,hf_llama_stdlib"
    with pytest.raises(SystemExit, match=f"^--only tta:nope: tta has the cases {cases}$"):
        harness.selection("tta:nope")
    with pytest.raises(SystemExit, match="^--only overhead:x: overhead has the cases"):
        harness.selection("overhead:x")
    with pytest.raises(SystemExit, match="^--only nope: unknown group"):
        harness.selection("nope")


def test_a_group_runs_only_the_cases_named(monkeypatch):
    from benchmarks import ablation, tta

    for module in (tta, ablation):
        monkeypatch.setattr(module, "one", lambda name, quick: [Row("g", name)])
    assert [r["name"] for r in harness.run_group("tta", True, ["gpt_stdlib"])] == ["gpt_stdlib"]
    assert [r["name"] for r in harness.run_group("tta", True)] == list(tta.CASES)
    assert [r["name"] for r in harness.run_group("ablation", False, ["gpt_stdlib"])] == ["gpt_stdlib"]


INFO = {"host": "vm", "cpu": "AMD EPYC 7B13 64-Core Processor", "cores": 2, "torch": "2.x", "device": "cpu"}


def test_an_existing_result_is_never_written_over(tmp_path):
    started = datetime.datetime(2026, 12, 1, 9, 0, 0)
    taken = tmp_path / "2026-12-01-090000-amd-epyc-7b13-64-core-processor.json"
    taken.write_text("the committed results\n")
    first = harness.write_json([], tmp_path, INFO, 1.0, quick=False, started=started)
    second = harness.write_json([], tmp_path, INFO, 2.0, quick=False, started=started)
    assert (first.name, second.name) == (f"{taken.stem}-2.json", f"{taken.stem}-3.json")
    assert taken.read_text() == "the committed results\n"
    assert [json.loads(p.read_text())["wall_s"] for p in (first, second)] == [1.0, 2.0]


def test_two_runs_in_a_row_make_two_files_and_the_txt_starts_with_the_command(tmp_path, monkeypatch, capsys):
    """The whole main() with a fake group: each run its own JSON, the txt exactly what it printed."""
    measured = iter([1.25, 0.75])

    def fake_group(group, quick, budget, cases=None):
        sides = Side("fwk", 2.0, "ms"), Side("plain", 1.6, "ms")
        return [ratio_row(group, "fake step", [next(measured)], *sides, "a/b")]

    monkeypatch.setattr(harness, "run_isolated", fake_group)
    monkeypatch.setattr(harness, "machine", lambda: {**INFO, "load_average": (0.5, 0.5, 0.5)})
    txt = tmp_path / "cpu" / "overhead.txt"
    argv = ["--only", "overhead", "--out", str(tmp_path / "results"), "--txt", str(txt)]
    printed = []
    for _ in range(2):
        harness.main(argv)
        printed.append(capsys.readouterr().out)
    # each run names its file last; in the same second, the second is <name>-2.json
    results = [Path(text.rstrip().rpartition("Results: ")[2]) for text in printed]
    assert sorted(results) == sorted((tmp_path / "results").glob("*.json")) and results[0] != results[1]
    assert [json.loads(p.read_text())["rows"][0]["median"] for p in results] == [1.25, 0.75]
    first, *rest = txt.read_text().splitlines(keepends=True)
    assert first == f"$ {harness.command_line(argv)}\n"
    assert first.split()[1:4] == [harness.shown(sys.executable), "-m", "benchmarks"]
    assert first.endswith(f"--only overhead --out {tmp_path / 'results'} --txt {txt}\n")
    assert "".join(rest) == printed[1]  # the second run's text, verbatim
    assert "| overhead | fake step | a/b | 0.75x | fwk 2 ms | plain 1.6 ms |" in printed[1]


def test_cpu_model_reads_cpuinfo_else_the_platform(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    assert harness.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert harness.cpu_model(tmp_path / "none") == "arm"
    assert harness.slug("Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz") == "intel-core-i7-9750h"
    assert harness.slug("") == "unknown-cpu"


def test_a_partial_run_says_what_it_left_out_and_never_replaces_a_whole_record(tmp_path, monkeypatch, capsys):
    def fake_group(group, quick, budget, cases=None):
        if group == "auto":
            return [harness.failed(group, "auto", "over its budget of 420 s")]
        return [ratio_row(group, "fake", [1.0], Side("fwk", 1.0, "s"), Side("plain", 1.0, "s"), "a/b")]

    monkeypatch.setattr(harness, "run_isolated", fake_group)
    monkeypatch.setattr(harness, "machine", lambda: {**INFO, "load_average": (0.5, 0.5, 0.5)})
    whole = tmp_path / "bench.txt"
    whole.write_text("$ .venv/bin/python -m benchmarks --txt bench.txt\n| overhead | step | a/b | 1.00x |\n")
    out = ["--out", str(tmp_path / "results")]
    with pytest.raises(SystemExit) as refused:  # refused before any group runs
        harness.main(["--only", "overhead,tta:digits_cnn", *out, "--txt", str(whole)])
    left_out = ", ".join(g for g in harness.GROUPS if g not in ("overhead", "tta"))
    assert str(refused.value) == (
        f"--txt {harness.shown(whole)} holds a whole record, and this run's is partial (left out {left_out}; "
        "only the cases tta:digits_cnn): write it to another file, or run every group"
    )
    assert not (tmp_path / "results").exists() and whole.read_text().startswith(
        "$ .venv/bin/python -m benchmarks --txt"
    )
    with pytest.raises(SystemExit, match=r"this run's is partial \(failed in auto\)"):  # every group, one failed
        harness.main([*out, "--txt", str(whole)])
    assert len(list((tmp_path / "results").glob("*.json"))) == 1  # its rows are kept there
    assert whole.read_text().count("\n") == 2
    elsewhere = tmp_path / "partial.txt"
    harness.main(["--only", "overhead", *out, "--txt", str(elsewhere)])
    assert f"\nPartial record: left out {', '.join(list(harness.GROUPS)[1:])}.\nA, B: " in elsewhere.read_text()
    harness.main(["--only", "overhead", *out, "--txt", str(elsewhere)])  # a partial record replaces a partial one
    assert not harness.holds_whole_record(elsewhere)
    capsys.readouterr()
