"""flush, and close while another thread or task waits on the same object."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import treecast


def test_flush_waits_for_what_was_sent_and_is_bounded(backend):
    with treecast.Network(local=2, topology="flat", backend=backend) as net:
        s = net.stream(filter="sum")
        s.send(4, "")
        net.flush(timeout=30)
        net.flush(None)
        assert s.recv(timeout=30).values == [2]  # each back-end flushed after its send
        with pytest.raises(ValueError):
            net.flush(timeout=-1)
        s.send(99, "")
    with pytest.raises(treecast.NetworkClosed):
        net.flush()


@pytest.mark.asyncio
async def test_flush_async(backend):
    async with await treecast.Network.launch_async(local=1, topology="flat", backend=backend) as net:
        await net.flush_async(timeout=30)


def _waiting(call: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, errors


def test_close_ends_a_recv_and_a_next_event_waiting_without_a_limit(backend):
    net = treecast.Network(local=1, topology="flat", backend=backend)
    s = net.stream()
    recv, recv_errors = _waiting(lambda: s.recv())
    event, event_errors = _waiting(lambda: net.next_event())
    recv.join(0.3)
    assert recv.is_alive() and event.is_alive()
    s.close()  # would wait for ever for the lock the recv holds
    recv.join(30)
    assert not recv.is_alive()
    assert len(recv_errors) == 1 and isinstance(recv_errors[0], treecast.NetworkClosed), recv_errors
    net.close()  # would wait for ever for the lock next_event holds
    event.join(30)
    assert not event.is_alive()
    assert len(event_errors) == 1 and isinstance(event_errors[0], treecast.NetworkClosed), event_errors


@pytest.mark.asyncio
async def test_close_async_ends_a_pending_recv_async(backend):
    net = await treecast.Network.launch_async(local=1, topology="flat", backend=backend)
    s = await net.stream_async()
    pending = asyncio.ensure_future(s.recv_async())
    await asyncio.sleep(0.2)
    await asyncio.wait_for(s.close_async(), 30)
    with pytest.raises(treecast.NetworkClosed):
        await asyncio.wait_for(pending, 30)
    await asyncio.wait_for(net.close_async(), 30)
