"""`fwk train --cfg`, `--dry-run`, a run that is already complete and `fwk runs plot` answer without torch.

Importing torch takes seconds on a small machine; these paths only compose, validate and
read the run dir. Each command runs in a subprocess that reports the torch modules it
loaded (no timing: machines are noisy).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import run_fwk
from tests.track.fake_runs import make_run

# Runs the real CLI entry point, then prints which torch modules were imported.
PROBE = """
import json, sys
from fwk.cli import main
sys.argv = ["fwk", *sys.argv[1:]]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("LOADED " + json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def probe(*args: str, runs: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {**os.environ, "FWK_RUNS": str(runs)}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, env=env)
    line = [x for x in out.stderr.splitlines() if x.startswith("LOADED ")][-1]
    return out, json.loads(line.removeprefix("LOADED "))


# The real CLI entry point once per command line (a JSON list), in one process: each one's
# exit status and stderr, then the torch modules the process imported.
PROBE_EACH = """
import contextlib, io, json, sys
from fwk.cli import main
said = []
for argv in json.loads(sys.argv[1]):
    sys.argv, err, code = ["fwk", *argv], io.StringIO(), 0
    with contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
    said.append([code, err.getvalue()])
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps({"said": said, "loaded": loaded}))
"""


def probe_each(commands: list[list[str]], runs: Path) -> tuple[list[tuple[int, str]], list[str]]:
    """``probe`` for many command lines in one process (each a command's own ~1 s of startup
    otherwise): their (exit status, stderr), and the torch modules imported by all of them."""
    env = {**os.environ, "FWK_RUNS": str(runs)}
    argv = [sys.executable, "-c", PROBE_EACH, json.dumps(commands)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    return [tuple(x) for x in got["said"]], got["loaded"]


def test_config_modules_import_no_torch() -> None:
    code = (
        "import sys\n"
        "from fwk.config.validate import registries\n"
        "names = {k: r.names() for k, r in registries().items()}\n"
        "[r.config(n) for r in registries().values() for n in r.names()]\n"
        "import fwk.models.configs, fwk.data.configs, fwk.optim, fwk.models, fwk.data\n"
        "assert 'small_cnn' in names['model'] and 'digits' in names['data'], names\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_cfg_and_dry_run_import_no_torch(runs: Path) -> None:
    out, loaded = probe("train", "--cfg", "recipe=gpt_stdlib", runs=runs)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model"]["name"] == "gpt"
    assert loaded == []
    out, loaded = probe("train", "--dry-run", runs=runs)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("run ")
    assert loaded == []
    assert not runs.exists()  # a dry run creates nothing


def test_sweep_cfg_and_dry_run_import_no_torch(runs: Path) -> None:
    """-m: each combination printed (bf16 is composed and planned here, never trained)."""
    sweep = ["optim.lr=0.1,0.01", "precision=fp32,bf16", "parallel.nproc_per_node=2"]
    out, loaded = probe("train", "-m", "--cfg", *sweep, runs=runs)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [(d["optim"]["lr"], d["precision"]["name"]) for d in docs] == [
        (0.1, "fp32"),
        (0.1, "bf16"),
        (0.01, "fp32"),
        (0.01, "bf16"),
    ]
    assert loaded == []
    out, loaded = probe("train", "-m", "--dry-run", *sweep, runs=runs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sweep ") and lines[0].endswith(": 4 runs over optim.lr, precision")
    assert "run 4/4: optim.lr=0.01 precision=bf16 -> run " in lines[-6]  # run, code, mesh, data, launch
    assert out.stdout.count("torch.distributed.run --nproc-per-node=2 --standalone") == 4
    assert loaded == []
    assert not runs.exists()  # a dry run creates nothing, not even the sweep's record


# The launcher of a run of several workers, torchrun replaced by a stand-in that starts nothing.
LAUNCHER = PROBE.replace(
    "from fwk.cli import main\n",
    "from fwk.cli import main\nimport fwk.launch.launcher as launcher\n"
    "launcher.run_torchrun = lambda argv, logs, n, keep_fds=(): print('torchrun', *argv[1:3]) or 0\n",
)


def test_the_launcher_of_several_workers_imports_torch_only_for_a_check_that_needs_it(runs: Path) -> None:
    """torchrun's agent and each worker import torch anyway: the launcher does only for a
    check the config asks for (fwk/config/asks.py), such as a module pattern typed."""
    two = ["train", "parallel=ddp", "parallel.nproc_per_node=2"]
    env = {**os.environ, "FWK_RUNS": str(runs)}
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *two], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "torchrun -m torch.distributed.run" in out.stdout and "LOADED []" in out.stderr
    typed = [*two, "precision.keep_fp32=[head.9]"]
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *typed], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "torchrun" not in out.stdout
    assert "precision.keep_fp32: 'head.9' matches no module of the model" in out.stderr.splitlines()[0]


# The real CLI; at exit (fwk skips the interpreter's teardown, not the atexit handlers) it
# says whether the process imported litdata.
LITDATA_PROBE = """
import atexit, sys
atexit.register(lambda: print(f"litdata imported: {'litdata' in sys.modules}", file=sys.stderr))
from fwk.cli import main
sys.argv = ["fwk", *sys.argv[1:]]
main()
"""


def test_a_run_that_streams_nothing_does_not_import_litdata(runs: Path) -> None:
    """litdata costs every process ~0.4 s to import: only a streamed set's does (fwk/data/registry.py)."""
    env = {**os.environ, "FWK_RUNS": str(runs)}
    argv = [sys.executable, "-c", LITDATA_PROBE, "train", "train.max_steps=2", "train.eval_every=0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert " complete: step 2" in out.stdout and "litdata imported: False" in out.stderr, out.stderr


def test_already_complete_imports_no_torch_and_tags_keep_the_run(runs: Path) -> None:
    first = run_fwk("train", "train.max_steps=2", "train.eval_every=0", "tags=[baseline,lr-sweep]", runs=runs)
    assert first.returncode == 0, first.stderr
    (run_dir,) = runs.glob("*/")
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["tags"] == ["baseline", "lr-sweep"]
    # other tags, written with Hydra's `+`: the same training, so the same (complete) run
    out, loaded = probe("train", "train.max_steps=2", "train.eval_every=0", "+tags=[other]", runs=runs)
    assert out.returncode == 0, out.stderr
    assert f"run {run_dir.name} is already complete" in out.stdout
    assert loaded == []
    assert [p.name for p in runs.glob("*/")] == [run_dir.name]


def test_target_without_custom_just_works(runs: Path) -> None:
    out = run_fwk("train", "--cfg", "model._target_=my_pkg.MyNet", "model.width=64", runs=runs)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model"] == {"_target_": "my_pkg.MyNet", "width": 64}


def test_target_with_a_registered_model_says_what_to_write(runs: Path) -> None:
    out = run_fwk("train", "--cfg", "model=gpt", "model._target_=my_pkg.MyNet", runs=runs)
    assert out.returncode == 2
    assert "write model=custom model._target_=pkg.Class" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_runs_plot_imports_no_torch(runs: Path) -> None:
    make_run(runs, "a1b2c3d4e5", losses=(2.3, 1.9, 1.2), evals={3: {"val_loss": 1.4, "val_acc": 0.6}})
    out, loaded = probe("runs", "plot", "a1b", runs=runs)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == (runs / "plots" / "a1b2c3d4e5.png").resolve()
    assert Path(out.stdout.strip()).stat().st_size > 10_000  # three panels, drawn
    assert loaded == []
