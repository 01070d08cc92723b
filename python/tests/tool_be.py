"""A Python back-end for the tests: answers by tag.

1: sends (rank + 1) * value back (a sum over ranks 0..N-1 is value * N(N+1)/2)
2: echoes the packet's values with their own format
3: raises (the tree reports the rank lost, with the traceback's last line)
4: sends 1 back, then flushes (be.flush)
99: leaves
argv[1] == "raise": raises before joining.
argv[1] == "async": the same answers through the awaitable twins (asyncio).
"""

import asyncio
import sys

import treecast

if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise ValueError("boom before joining")


async def answer_async() -> None:
    be = await treecast.BackEnd.connect_async()
    while True:
        try:
            stream, pkt = await be.recv_async()
        except treecast.NetworkClosed:
            return
        if pkt.tag == 1:
            await stream.send_async(1, "%ld", (be.rank + 1) * pkt.values[0])
        elif pkt.tag == 2:
            await be.send_async(stream.id, 2, pkt.format, *pkt.values)
        elif pkt.tag == 4:
            await stream.send_async(4, "%d", 1)
            await be.flush_async(timeout=30)
        elif pkt.tag == 99:
            break
    await be.close_async()


if len(sys.argv) > 1 and sys.argv[1] == "async":
    asyncio.run(answer_async())
    sys.exit(0)

be = treecast.BackEnd()
try:
    while True:
        stream, pkt = be.recv()
        if pkt.tag == 1:
            stream.send(1, "%ld", (be.rank + 1) * pkt.values[0])
        elif pkt.tag == 2:
            stream.send(2, pkt.format, *pkt.values)
        elif pkt.tag == 4:
            stream.send(4, "%d", 1)
            be.flush(timeout=30)
        elif pkt.tag == 3:
            raise RuntimeError(f"rank {be.rank} was asked to fail")
        elif pkt.tag == 99:
            break
except treecast.NetworkClosed:
    pass
else:
    be.close()
