"""The examples of python/examples run, at a small size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_admin_prints_groups_and_failing_ranks():
    ok = run(str(EXAMPLES / "admin.py"), "--local", "4", "--", "echo", "hi")
    assert ok.returncode == 0, ok.stderr
    assert "0-3 (4) exit 0" in ok.stdout and "hi" in ok.stdout
    bad = run(str(EXAMPLES / "admin.py"), "--local", "4", "--", "sh", "-c", 'test "$TREECAST_RANK" -lt 3 || exit 4')
    assert bad.returncode == 4, bad.stderr
    # A local tree's back-ends all run on this host: it is the failing host.
    assert "failed: hosts localhost (ranks 3)" in bad.stderr


def test_reduce_tool_reduces_through_the_tree():
    out = run(str(EXAMPLES / "reduce_tool.py"), "--local", "4", "--topology", "balanced:2x2")
    assert out.returncode == 0, out.stderr
    # Loads are 0.5 * rank for ranks 0-3.
    assert "sum of 4 back-ends: 3" in out.stdout
    assert "min of 4 back-ends: 0" in out.stdout
    assert "max of 4 back-ends: 1.5" in out.stdout


def test_two_networks_at_once():
    out = run(str(EXAMPLES / "two_networks.py"), "--local", "3")
    assert out.returncode == 0, out.stderr
    assert "[run] 0-2: of 3" in out.stdout
    assert "[sum] round 3: 9" in out.stdout  # 3 back-ends * 3.0
