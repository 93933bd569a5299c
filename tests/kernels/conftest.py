"""Kernel tests need Triton (it comes with torch's Linux builds): skip without it, but fail
in CI, where everything must run. Kernel modules are imported inside the tests for that."""

import pytest

from fwk.kernels import available
from tests.conftest import require


@pytest.fixture(autouse=True)
def _needs_triton() -> None:
    require(available(), "Triton is needed for the kernel tests")
