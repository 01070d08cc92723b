#!/usr/bin/env python3
"""asyncio: two networks driven at once from one thread. One runs a command on
every back-end while the other reduces values through its tree.

    python two_networks.py --local 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import treecast

HERE = os.path.dirname(os.path.abspath(__file__))


async def commands(net: treecast.Network) -> None:
    res = await net.run_async(["sh", "-c", "echo rank $TREECAST_RANK of $TREECAST_SIZE | cut -d' ' -f3-"], timeout=30)
    for output, ranks in res.groups():
        print(f"[run] {ranks}: {output.strip()}")


async def reductions(net: treecast.Network, rounds: int) -> None:
    s = await net.stream_async(filter="sum")
    for k in range(1, rounds + 1):
        await s.send_async(1, "%lf", float(k))
        pkt = await s.recv_async(timeout=30)
        print(f"[sum] round {k}: {pkt.values[0]:g}")
    await s.close_async()
    await (await net.stream_async()).send_async(2, "")


async def main(local: int) -> None:
    python_be = [sys.executable, os.path.join(HERE, "reduce_tool.py"), "backend"]
    generic, tool = await asyncio.gather(
        treecast.Network.launch_async(local=local, topology="kary:4"),
        treecast.Network.launch_async(local=local, topology="kary:4", backend=python_be),
    )
    async with generic, tool:
        await asyncio.gather(commands(generic), reductions(tool, 3))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local", type=int, default=8)
    asyncio.run(main(p.parse_args().local))
