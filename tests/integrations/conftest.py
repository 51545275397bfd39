"""Integration tests: no test leaves Accelerate's process-wide state to the next one."""

from __future__ import annotations

from typing import Iterator

import pytest

from _frameworks import reset_accelerate


@pytest.fixture(autouse=True)
def _fresh_accelerate() -> Iterator[None]:
    reset_accelerate()
    yield
    reset_accelerate()
