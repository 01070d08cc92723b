#!/usr/bin/env python3
"""A tool written in Python at both ends: the front-end starts Python back-ends
(this same file, with ``backend``), asks each for a value, and reads the sum, the
minimum and the maximum reduced inside the tree, not at the front-end.

    python reduce_tool.py --local 16 --topology balanced:4x4
"""

from __future__ import annotations

import argparse
import os
import sys

import treecast

TAG_LOAD = 1
TAG_EXIT = 2


def backend() -> None:
    with treecast.BackEnd() as be:
        while True:
            stream, pkt = be.recv()
            if pkt.tag == TAG_EXIT:
                return
            # A value only this back-end knows: here, its rank scaled by the request.
            load = float(be.rank) * pkt.values[0]
            stream.send(TAG_LOAD, "%lf %d", load, os.getpid())


def frontend(local: int, topology: str) -> None:
    me = [sys.executable, os.path.abspath(__file__), "backend"]
    with treecast.Network(local=local, topology=topology, backend=me) as net:
        for name in ("sum", "min", "max"):
            s = net.stream(filter=name)
            s.send(TAG_LOAD, "%lf", 0.5)
            pkt = s.recv(timeout=60)
            print(f"{name} of {net.backends} back-ends: {pkt.values[0]:g}")
            s.close()
        bye = net.stream()
        bye.send(TAG_EXIT, "")


if __name__ == "__main__":
    if sys.argv[1:2] == ["backend"]:
        backend()
    else:
        p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--local", type=int, default=8)
        p.add_argument("--topology", default="kary:4")
        a = p.parse_args()
        frontend(a.local, a.topology)
