"""`--help` of every command works, and the CLI starts without importing torch."""

import subprocess
import sys

import pytest

COMMANDS = [[], ["train"], ["doctor"], ["export"], ["profile"], ["replay"], ["data"], ["data", "preview"], ["serve"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fwk")
def test_help(command: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "fwk", *command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout
    if not command:
        assert "train" in out.stdout


def test_cli_start_does_not_import_torch() -> None:
    code = "import sys, fwk.cli; print('torch' in sys.modules, 'hydra' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
