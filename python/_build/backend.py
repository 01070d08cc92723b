"""PEP 517 backend: maturin, after building the `treecast` binary into the package.

The tree a script starts runs comm nodes (`treecast node`) and, by default, generic
back-ends (`treecast backend`): native programs that need no Python on compute
nodes. The wheel carries that binary as `treecast/_bin/treecast`, and the package
passes its path to the tree, so no path has to be set by the user.

Profile: release, as maturin's own default; `MATURIN_PEP517_ARGS="--profile dev"`
(what tools/test sets) builds both the binary and the extension unoptimised.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import maturin
from maturin import *  # noqa: F401,F403  (every hook maturin provides)

HERE = Path(__file__).resolve().parent.parent  # python/
ROOT = HERE.parent  # the workspace


def _profile() -> str:
    args = shlex.split(os.environ.get("MATURIN_PEP517_ARGS", ""))
    for i, a in enumerate(args):
        if a == "--profile" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--profile="):
            return a.split("=", 1)[1]
    return "release"


def _build_binary() -> None:
    if not (ROOT / "Cargo.toml").is_file():
        raise RuntimeError(
            f"treecast's Cargo workspace is not at {ROOT}: build the package from a checkout "
            "(pip install ./python), not from a copy of python/ alone"
        )
    profile = _profile()
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "build", "--locked", "--profile", profile, "--bin", "treecast"]
    print("treecast: building the comm node binary:", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    out = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    import json

    target = Path(json.loads(out)["target_directory"])
    built = target / ("debug" if profile == "dev" else profile) / "treecast"
    dest = HERE / "treecast" / "_bin"
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / "treecast.tmp"
    shutil.copy2(built, tmp)
    tmp.chmod(0o755)
    if profile == "dev" and shutil.which("strip"):
        # Unoptimised builds carry ~100 MB of debug information: not worth a wheel.
        subprocess.run(["strip", "--strip-debug", str(tmp)], check=True)
    tmp.replace(dest / "treecast")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_binary()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_binary()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
