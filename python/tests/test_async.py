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


@pytest.mark.asyncio
async def test_the_other_twins_spawn_events_clock_files_and_backends(backend, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 100_000)
    async with await treecast.Network.launch_async(local=2, topology="flat", backend=backend + ["async"]) as net:
        # Back-ends answering through BackEnd.connect_async, recv_async, send_async,
        # flush_async and close_async.
        s = await net.stream_async(filter="sum")
        await s.send_async(1, "%ld", 5)
        assert (await s.recv_async(timeout=30)).values == [5 * (1 + 2)]
        await s.send_async(4, "")
        assert (await s.recv_async(timeout=30)).values == [2]
        # Two more, also asyncio back-ends; their arrival is an event.
        ranks = await net.spawn_async(2, backend + ["async"])
        assert str(ranks) == "2-3"
        joined = treecast.RankSet()
        while joined != ranks:  # one event per batch of ranks that joined
            event = await net.next_event_async(timeout=30)
            assert event is not None, f"ranks {ranks - joined} not seen joining within 30 s"
            if event["kind"] == "ranks_joined":
                joined = joined | event["ranks"]
        everyone = await net.stream_async(filter="sum")  # a stream's ranks are fixed when it opens
        await everyone.send_async(1, "%ld", 1)
        assert (await everyone.recv_async(timeout=30)).values == [1 + 2 + 3 + 4]
        table = await net.wait_clock_async(rounds=1, timeout=30)
        assert table and all(row["rounds"] >= 1 for row in table), table
        await everyone.send_async(99, "")
    (tmp_path / "out").mkdir()
    async with await treecast.Network.launch_async(local=2, topology="flat") as files:
        report = await files.bcast_file_async(src, f"{tmp_path}/out/")
        assert report["ok"], report
    assert (tmp_path / "out" / "f.bin").read_bytes() == src.read_bytes()
