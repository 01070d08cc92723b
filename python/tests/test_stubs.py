"""The type stubs shipped in the package match the compiled module (mypy's stubtest),
and the pure-Python part type-checks strictly against them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import treecast


def test_stubs_match_the_module():
    pytest.importorskip("mypy", reason="mypy is not installed: pip install mypy (tools/test does)")
    env = dict(os.environ, MYPY_CACHE_DIR=os.path.join(os.path.dirname(__file__), ".mypy_cache"))
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "treecast"], capture_output=True, text=True, env=env, cwd="/"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    pkg = os.path.dirname(treecast.__file__)
    assert os.path.isfile(os.path.join(pkg, "py.typed")) and os.path.isfile(os.path.join(pkg, "_native.pyi"))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "-p", "treecast"], capture_output=True, text=True, env=env, cwd="/"
    )
    assert out.returncode == 0, out.stdout + out.stderr
