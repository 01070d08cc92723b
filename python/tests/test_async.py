"""The awaitable twins."""

from __future__ import annotations

import asyncio

import pytest

import treecast


@pytest.mark.asyncio
async def test_two_networks_at_once(backend):
    a, b = await asyncio.gather(
        treecast.Network.launch_async(local=2, topology="flat", backend=backend),
        treecast.Network.launch_async(local=3, topology="flat", backend=backend),
    )
    async with a, b:
        sa, sb = await asyncio.gather(a.stream_async(filter="sum"), b.stream_async(filter="sum"))
        await asyncio.gather(sa.send_async(1, "%ld", 1), sb.send_async(1, "%ld", 1))
        pa, pb = await asyncio.gather(sa.recv_async(timeout=30), sb.recv_async(timeout=30))
        assert (pa.values, pb.values) == ([3], [6])
    assert a.closed and b.closed
    # run needs the generic back-end: a third network, run while a stream waits.
    async with await treecast.Network.launch_async(local=2, topology="flat") as c:
        res = await c.run_async(["sh", "-c", "echo $TREECAST_RANK"], timeout=30)
        assert sorted(out.strip() for out, _ in res.groups()) == ["0", "1"]
        assert res.max_status == 0


@pytest.mark.asyncio
async def test_a_cancelled_recv_leaves_the_stream_usable(backend):
    async with await treecast.Network.launch_async(local=2, topology="flat", backend=backend) as net:
        s = await net.stream_async(filter="sum")
        waiting = asyncio.ensure_future(s.recv_async())
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await s.send_async(1, "%ld", 2)
        assert (await s.recv_async(timeout=30)).values == [6]
        with pytest.raises(treecast.TimeoutError):
            await s.recv_async(timeout=0.1)


@pytest.mark.asyncio
async def test_send_to_one_rank_and_backend_send_async(backend):
    async with await treecast.Network.launch_async(local=3, topology="flat", backend=backend) as net:
        s = await net.stream_async(sync="do_not_wait")
        await s.send_to_async(2, 2, "%s", "only you")
        pkt = await s.recv_async(timeout=30)
        assert (pkt.rank, pkt.values) == (2, ["only you"])
        s.send_to(1, 2, "%d", 5)
        assert (s.recv(timeout=30).rank, s.recv_async is not None) == (1, True)
