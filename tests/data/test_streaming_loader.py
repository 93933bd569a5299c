"""data=streaming through its loaders: loader=auto times litdata's own loader on copies of
the set, a loader worker forked after this process read the set fetches its own chunks, a
chunk that does not arrive ends in one line, and training resumes bit-exactly, from local
shards and from a real S3-compatible server on loopback (moto's), on 1 and 2 processes,
with the workers as set and as loader=auto measured them."""

from __future__ import annotations

import gc
import io
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from fwk.data.configs import StreamingConfig
from tests.conftest import require, run_fwk
from tests.data.conftest import S3_URI, use_s3
from tests.s3server import stalling

# A tiny CNN on tiny images, a few steps: what is tested is the data's path, not the model; loader=auto.
AUTO = ["train", "data=streaming", "data.image_size=16", "data.val_resize=18", "model=small_cnn"]
AUTO += ["model.in_channels=3", "model.num_classes=3", "train.batch_size=8", "train.max_steps=8"]
AUTO += ["train.eval_every=4", "train.log_every=2", "checkpoint.every=3", "checkpoint.keep=10", "jit=off"]
STALLED = "did not arrive from {endpoint} in {seconds} s (the server stalled or is unreachable); check it, or "
STALLED += "set MAX_WAIT_TIME=<seconds> (litdata's wait) to wait longer"


def _measured(out: str) -> tuple[int, dict[int, float]]:
    """loader=auto's choice and the items/s it measured for each worker count, from its line."""
    line = next(t for t in out.splitlines() if t.startswith("loader=auto: ") and " measured " in t)
    chosen = int(line.split()[1])
    rate = float(re.search(r"measured ([\d,]+) items/s", line)[1].replace(",", ""))  # type: ignore[index]
    others = {int(n): float(r.replace(",", "")) for r, n in re.findall(r"([\d,]+) with (\d+) worker", line)}
    return chosen, {chosen: rate, **others}


def _stalled(chunk: str, endpoint: str) -> str:
    """The one line of a chunk that did not arrive (its seconds: litdata's wait, as a pattern)."""
    text = f"data.uri={S3_URI}: chunk {S3_URI}/{chunk} " + STALLED.format(endpoint=endpoint, seconds="SECONDS")
    return re.escape(text).replace("SECONDS", r"\d+")


def _candidates(processes: int) -> set[int]:
    """The worker counts loader=auto times on this machine (the cores the tests may use)."""
    from fwk.data.loader_plan import Host, worker_candidates

    return {0, *worker_candidates(Host(len(os.sched_getaffinity(0)), processes, cuda=False))}


def _second_chunk(shards: Path, split: str) -> str:
    """The split's chunk without item 0 (what example_input reads at the start of a run)."""
    return json.loads((shards / split / "index.json").read_text())["chunks"][1]["filename"]


@pytest.mark.parametrize("remote", [False, True], ids=["local", "s3"])
def test_auto_times_litdatas_loader_on_copies_and_forked_readers_fetch_their_own_chunks(
    remote: bool, prepared: tuple[Path, Path], request: pytest.FixtureRequest, tmp_path: Path, monkeypatch
) -> None:
    from litdata.streaming import item_loader

    from fwk.data.loader import val_loader
    from fwk.data.loader_plan import LoaderPlan, measure_rate, trial
    from fwk.data.streaming import StreamLoader, streaming

    uri = str(prepared[1])
    if remote:
        use_s3(request.getfixturevalue("s3"), monkeypatch, tmp_path)
        uri = S3_URI
    monkeypatch.setattr(item_loader, "_MAX_WAIT_TIME", 10)  # a reader without its download thread: 10 s, not 120
    bundle = streaming(StreamingConfig(uri=uri, image_size=16, val_resize=18), seed=3)
    batch, make = trial(bundle, 8)
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    rates = {n: measure_rate(make, n, batch, 0.3) for n in (0, 1, 2)}  # in this process first, as loader=auto does
    assert torch.equal(torch.rand(2), expected) and all(rate > 0 for rate in rates.values()), rates
    assert bundle.train.cache is None  # the run's own set was not read: its loader starts where it would have
    loader = StreamLoader(bundle.train, 8, 1, {"num_workers": 2}, None)
    epoch = list(itertools.islice(loader, 4))  # 2 workers x 18 items: 2 full batches each
    assert [tuple(images.shape) for images, _ in epoch] == [(8, 3, 16, 16)] * 4
    assert loader.state_dict()["litdata"]["num_samples_yielded"] == 32
    assert bundle.val[0][0].shape == (3, 16, 16)  # read here first, as a run's example_input does
    labels = [int(y) for _, ys in val_loader(bundle.val, 2, 0, 1, LoaderPlan(num_workers=1)) for y in ys]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # a forked worker read both chunks, each item once


@pytest.mark.parametrize("refuse", [False, True], ids=["stalls", "refuses"])
def test_a_chunk_that_cannot_be_read_in_litdatas_workers_is_one_line(
    refuse: bool, s3: dict[str, str], moto: str, prepared: tuple[Path, Path], tmp_path: Path, monkeypatch, capfd
) -> None:
    """stalls: no answer within litdata's wait; refuses: S3's AccessDenied, which kills
    litdata's download thread at once (as a server gone does after the client's retries)."""
    from litdata.streaming import item_loader

    from fwk.data.loader import LoadError
    from fwk.data.streaming import StreamLoader, streaming

    use_s3(s3, monkeypatch, tmp_path)
    # litdata's wait (MAX_WAIT_TIME), as forks inherit it; AccessDenied ends the wait sooner
    monkeypatch.setattr(item_loader, "_MAX_WAIT_TIME", 10 if refuse else 1)
    chunks = [c["filename"] for c in json.loads((prepared[1] / "train" / "index.json").read_text())["chunks"]]
    with stalling(moto, lambda path: "/train/chunk-" in path, refuse) as endpoint:  # the index is answered
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        bundle = streaming(StreamingConfig(uri=S3_URI, image_size=16, val_resize=18), seed=3)
        loader = StreamLoader(bundle.train, 2, 1, {"num_workers": 1}, None)  # a loader worker: forked
        with pytest.raises(LoadError) as err:
            list(itertools.islice(loader, 8))
        line = str(err.value)
    del err, loader
    gc.collect()  # its workers stop here, their stalled reads let go (not in a later test)
    refused = re.escape(f"data.uri={S3_URI}: chunk {S3_URI}/train/CHUNK could not be read from {endpoint} (")
    refused += r"(PermissionDeniedError|ClientError): .*403.*\); check the server"  # obstore's, or boto3's after a fork
    said = [refused.replace("CHUNK", re.escape(c)) if refuse else _stalled(f"train/{c}", endpoint) for c in chunks]
    named = [c for c, pattern in zip(chunks, said, strict=True) if re.fullmatch(pattern, line)]
    assert len(named) == 1 and "\n" not in line, line  # the chunk a worker waited for
    assert "PrepareChunksThread CRASHED" not in capfd.readouterr().err  # litdata's own report (a traceback): left out


@pytest.mark.parametrize("workers", [0, 2])
def test_the_stream_loader_resumes_exactly_mid_epoch_and_into_the_next(workers: int, prepared: tuple) -> None:
    from fwk.data.streaming import StreamLoader, streaming

    def loader() -> StreamLoader:
        bundle = streaming(StreamingConfig(uri=str(prepared[1]), image_size=16, val_resize=18), seed=3)
        return StreamLoader(bundle.train, 8, 1, {"num_workers": workers}, None)

    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    straight = [images for images, _ in itertools.islice(loader(), 7)]  # 36 items: 4 batches an epoch
    assert torch.equal(torch.rand(2), expected)  # its epochs draw nothing from the run's random streams
    first = loader()
    head = [images for images, _ in itertools.islice(first, 3)]
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)  # as a checkpoint keeps it, and loads it back
    resumed = loader()
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    got = head + [images for images, _ in itertools.islice(resumed, 4)]
    assert all(torch.equal(a, b) for a, b in zip(straight, got, strict=True))
    assert not any(torch.equal(straight[4], a) for a in straight[:4])  # the next epoch reshuffles and recrops


def test_another_process_count_resumes_at_the_start_of_the_next_epoch(
    prepared: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    from fwk.data.streaming import StreamLoader, streaming

    def loader(world: int) -> StreamLoader:  # (litdata splits by torch.distributed's world: none here)
        bundle = streaming(StreamingConfig(uri=str(prepared[1]), image_size=16, val_resize=18), seed=3)
        return StreamLoader(bundle.train, 8, world, {"num_workers": 0}, None)

    straight = [images for images, _ in itertools.islice(loader(1), 12)]  # 4 batches an epoch
    first = loader(2)  # as two processes would have saved it, one batch into the second epoch
    state = [first.state_dict() for _ in itertools.islice(first, 5)][-1]
    resumed = loader(1)
    with caplog.at_level("INFO", logger="fwk.data.streaming"):
        resumed.load_state_dict(state)
    assert "taken with 2 processes x 0 workers, this run has 1 x 0; resuming at the start of epoch" in caplog.text
    got = [images for images, _ in itertools.islice(resumed, 4)]
    assert all(torch.equal(a, b) for a, b in zip(straight[8:12], got, strict=True))  # the third epoch, whole


def test_an_epoch_without_a_full_batch_is_one_line(prepared: tuple[Path, Path]) -> None:
    from fwk.data.streaming import StreamLoader, streaming
    from fwk.errors import UserError

    bundle = streaming(StreamingConfig(uri=str(prepared[1]), image_size=16, val_resize=18), seed=3)
    loader = StreamLoader(bundle.train, 40, 1, {"num_workers": 2}, None)  # 36 items in all
    with pytest.raises(UserError, match=f"^data.uri={prepared[1]}: an epoch gives no full batch of 40 to any of this"):
        next(iter(loader))  # not an endless wait


def test_two_processes_stream_from_s3_with_loader_auto_and_resume_bit_exactly(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trained straight, then resumed from its own step-3 checkpoint as if it had died there
    (two launches: a two-process launch costs ~30 s on a busy 2-core machine)."""
    import torch.distributed as dist

    from fwk.components.checkpoint import model_weights

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    use_s3(s3, monkeypatch, tmp_path)
    args = [*AUTO, f"data.uri={S3_URI}", "parallel=ddp", "parallel.nproc_per_node=2", "train.batch_size=4"]
    straight = run_fwk(*args, runs=tmp_path / "runs")
    assert straight.returncode == 0, straight.stdout + straight.stderr
    chosen, rates = _measured(straight.stdout)  # timed on each rank's share; rank 0's choice on both
    assert set(rates) == _candidates(2) and rates[0] > 0 and rates[chosen] > 0, rates
    (run,) = (tmp_path / "runs").glob("*/")
    expected = model_weights(run / "checkpoints/step-00000008")
    evaluated = json.loads((run / "summary.json").read_text())["eval"]
    for later in ("step-00000006", "step-00000008"):
        shutil.rmtree(run / "checkpoints" / later)
    (run / "summary.json").unlink()
    resumed = run_fwk(*args, runs=tmp_path / "runs")
    assert resumed.returncode == 0 and f"resumed run {run.name} from step-00000003 (step 3)" in resumed.stdout, (
        resumed.stdout + resumed.stderr
    )
    got = model_weights(run / "checkpoints/step-00000008")
    assert expected.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in expected.items())
    assert json.loads((run / "summary.json").read_text())["eval"] == evaluated


def test_a_stalled_chunk_ends_the_run_in_one_line_and_it_resumes_bit_exactly_from_its_checkpoint(
    s3: dict[str, str], moto: str, prepared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process, loader=auto; the server stops answering for a validation chunk, first read
    by the final evaluation, after the step-3 checkpoint."""
    from fwk.components.checkpoint import model_weights

    use_s3(s3, monkeypatch, tmp_path)
    args = [*AUTO, f"data.uri={S3_URI}", "train.max_steps=6", "train.eval_every=0"]
    chunk = _second_chunk(prepared[1], "val")
    with stalling(moto, lambda path: path.endswith(f"/val/{chunk}")) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("MAX_WAIT_TIME", "3")  # litdata's wait for a chunk, in seconds
        stalled = run_fwk(*args, runs=tmp_path / "stopped")
    assert stalled.returncode == 2, stalled.stdout + stalled.stderr
    assert re.fullmatch("fwk: error: " + _stalled(f"val/{chunk}", endpoint), stalled.stderr.strip()), stalled.stderr
    chosen, rates = _measured(stalled.stdout)
    assert set(rates) == _candidates(1) and rates[0] > 0 and rates[chosen] > 0, rates
    (run,) = (tmp_path / "stopped").glob("*/")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000003"]  # the eval is before the save
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto)  # the server answers again
    monkeypatch.delenv("MAX_WAIT_TIME")
    resumed = run_fwk(*args, runs=tmp_path / "stopped")
    assert resumed.returncode == 0 and f"resumed run {run.name} from step-00000003 (step 3)" in resumed.stdout, (
        resumed.stdout + resumed.stderr
    )
    straight = run_fwk(*args, runs=tmp_path / "straight")
    assert straight.returncode == 0 and f"loader=auto: {chosen} worker" in straight.stdout, straight.stdout
    (first,) = (tmp_path / "straight").glob("*/")
    expected, got = (model_weights(r / "checkpoints/step-00000006") for r in (first, run))
    assert expected.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in expected.items())
    evals = [json.loads((r / "summary.json").read_text())["eval"] for r in (first, run)]
    assert evals[0] == evals[1]
