"""Ctrl-C in a blocking call: KeyboardInterrupt at once, and the tree torn down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import BACKEND, wait_gone

CHILD = r"""
import signal, sys, treecast
# A terminal's Ctrl-C, whatever the test was started under: a shell that runs a
# command in the background without job control (nohup ... &) has it ignore
# SIGINT, and Python then keeps it ignored instead of raising KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)
backend = sys.argv[1:]
with treecast.Network(local=2, topology="flat", backend=backend) as net:
    s = net.stream(filter="sum")
    print("ready", flush=True)
    try:
        s.recv()  # nothing is sent: waits until interrupted
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
"""


def test_sigint_in_a_blocking_recv_raises_keyboard_interrupt_and_tears_the_tree_down(no_process_left):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *BACKEND],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        time.sleep(0.3)  # in recv by now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().strip()
        took = time.monotonic() - sent
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert line == "interrupted", err
    assert "KeyboardInterrupt" in err
    assert child.returncode != 0
    # No wall-clock assertion (a loaded machine): recv has no limit, so an
    # interrupt that was not honoured would hang until pytest-timeout fails the test.
    print(f"KeyboardInterrupt {took * 1000:.0f} ms after SIGINT")
    assert not wait_gone(no_process_left), "the tree outlived the interrupted script"
    assert os.environ.get("TREECAST_PYTEST_MARK") == no_process_left
