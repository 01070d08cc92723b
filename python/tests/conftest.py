"""Fixtures: every test's tree is marked through the environment its processes
inherit, and the test fails if a marked process outlives it."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BACKEND = [sys.executable, str(HERE / "tool_be.py")]
MARK = "TREECAST_PYTEST_MARK"


def marked(mark: str) -> list[int]:
    """PIDs of processes (not this one) whose environment carries the mark."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_gone(mark: str, limit: float = 15.0) -> list[int]:
    deadline = time.monotonic() + limit
    left = marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(mark)
    return left


@pytest.fixture(autouse=True)
def no_process_left():
    """Marks the processes this test starts; fails if one is left after it."""
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark
    yield mark
    del os.environ[MARK]
    import gc

    gc.collect()
    left = wait_gone(mark)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def backend() -> list[str]:
    return list(BACKEND)
