"""The front-end: trees, run, streams with Python back-ends, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import treecast


def test_rank_sets_fold_as_the_cli_prints_them():
    assert str(treecast.RankSet("0-15")) == "0-15"
    assert str(treecast.RankSet([3, 0, 1, 2, 7])) == "0-3,7"
    r = treecast.RankSet("0-3,8")
    assert len(r) == 5 and 8 in r and 4 not in r and list(r) == [0, 1, 2, 3, 8]
    assert r | treecast.RankSet([4]) == treecast.RankSet("0-4,8")
    with pytest.raises(ValueError):
        treecast.RankSet("x-y")


def test_the_generic_backend_echoes_a_tools_own_tags():
    # Tags below FIRST_RESERVED_TAG are the tool's: tag 1 once ran a command there.
    assert treecast.FIRST_RESERVED_TAG == 0x7FFFFF00
    with treecast.Network(local=4, topology="flat") as net:
        s = net.stream(filter="sum")
        for tag in (1, 5, 100):
            s.send(tag, "%d", 5)
            pkt = s.recv(timeout=30)
            assert (pkt.tag, pkt.values) == (tag, [20])


@pytest.mark.parametrize("hosts", ["node[01-04],node07", "a,b,c[1-3]", "n[1-3]x[1-2]"])
def test_host_lists_match_treecast_hosts(hosts):
    cli = [treecast.binary(), "hosts"]
    fold = subprocess.run(cli + [hosts], capture_output=True, text=True, check=True).stdout.strip()
    expand = subprocess.run(cli + ["-e", hosts], capture_output=True, text=True, check=True).stdout.split()
    count = subprocess.run(cli + ["-c", hosts], capture_output=True, text=True, check=True).stdout.strip()
    assert treecast.hosts.fold(hosts) == fold
    assert treecast.hosts.expand(hosts) == expand
    assert treecast.hosts.count(hosts) == int(count)
    assert treecast.hosts.fold(hosts, exclude=expand[0]) == treecast.hosts.fold(expand[1:])


def test_run_groups_outputs_and_reports_the_largest_status():
    with treecast.Network(local=6, topology="balanced:2x3") as net:
        assert net.backends == 6
        res = net.run(["uname", "-s"], timeout=30)
        groups = list(res.groups())
        assert len(groups) == 1
        out, ranks = groups[0]
        assert out.strip() == "Linux" and str(ranks) == "0-5"
        assert res.max_status == 0 and res.ok
        # Ranks 0-2 exit 0, 3-5 exit 3: two classes, status 3, failing ranks named.
        res = net.run(["sh", "-c", 'test "$TREECAST_RANK" -lt 3 || exit 3'], timeout=30)
        assert res.max_status == 3 and not res.ok
        assert str(res.failed()) == "3-5"
        assert sorted(c.exit_code for c in res.classes) == [0, 3]


def test_a_reduction_through_the_tree_with_python_backends(backend):
    with treecast.Network(local=4, topology="balanced:2x2", backend=backend) as net:
        s = net.stream(filter="sum", sync="wait_for_all")
        for k in (1, 5):
            s.send(1, "%ld", k)
            pkt = s.recv(timeout=30)
            assert pkt.tag == 1 and pkt.values == [k * (1 + 2 + 3 + 4)]
        s2 = net.stream(filter="max", ranks=[1, 2])
        s2.send(1, "%ld", 10)
        assert s2.recv(timeout=30).values == [30]
        # A stream may keep to part of the network's route, among those it carries.
        s3 = net.stream(filter="sum", route="tcp")
        s3.send(1, "%ld", 2)
        assert s3.recv(timeout=30).values == [2 * (1 + 2 + 3 + 4)]
        with pytest.raises(ValueError, match="--route udp"):
            net.stream(filter="sum", route="udp")
        with pytest.raises(ValueError, match="tcp, udp, striped"):
            net.stream(filter="sum", route="ib")
        s.send(99, "")


def test_streams_choose_among_the_routes_of_a_multicasting_network(backend):
    with treecast.Network(local=4, topology="balanced:2x2", backend=backend, route="udp") as net:
        for route in (None, "tcp", "udp"):
            s = net.stream(filter="sum", route=route)
            s.send(1, "%ld", 3)
            assert s.recv(timeout=30).values == [3 * (1 + 2 + 3 + 4)], route
        with pytest.raises(ValueError, match="--route striped"):
            net.stream(filter="sum", route="striped")
    with pytest.raises(ValueError, match="striped:N"):
        treecast.Network(local=2, route="ib")


def test_a_matched_recv_skips_packets_without_losing_them(backend):
    with treecast.Network(local=4, topology="balanced:2x2", backend=backend) as net:
        s = net.stream()  # the null filter: every back-end's answer comes up alone
        s.send(1, "%d", 10)  # answered with tag 1, (rank + 1) * 10
        s.send(2, "%d", 5)  # echoed with tag 2
        pkt = s.recv(timeout=30, tag=2, rank=3)
        assert (pkt.tag, pkt.rank, pkt.values) == (2, 3, [5])
        pkt = s.recv(timeout=30, tag=1, rank=0)
        assert (pkt.tag, pkt.rank, pkt.values) == (1, 0, [10])
        seen = {(2, 3), (1, 0)}
        for _ in range(6):
            pkt = s.recv(timeout=30)
            assert (pkt.tag, pkt.rank) not in seen
            seen.add((pkt.tag, pkt.rank))
            assert pkt.values == ([(pkt.rank + 1) * 10] if pkt.tag == 1 else [5])
        assert len(seen) == 8
        with pytest.raises(treecast.TimeoutError):
            s.recv(timeout=0.2, tag=7)
        s.send(99, "")


def test_values_of_every_kind_come_back_as_python_objects(backend):
    with treecast.Network(local=1, topology="flat", backend=backend) as net:
        s = net.stream()
        cases = [
            ("%d", [-7]),
            ("%uld", [2**64 - 1]),
            ("%lf", [2.5]),
            ("%s", ["héllo"]),
            ("%b", [b"\x00\xffraw"]),
            ("%ad %as %alf", [[1, 2, 3], ["a", "b"], [0.5, 1.5]]),
            ("%d %s %b", [1, "two", b"3"]),
        ]
        for fmt, values in cases:
            s.send(2, fmt, *values)
            pkt = s.recv(timeout=30)
            assert pkt.values == values, fmt
            assert pkt.rank == 0 and pkt.stream == s.id


def test_bad_input_raises_clear_errors(backend):
    with treecast.Network(local=2, topology="flat", backend=backend) as net:
        s = net.stream(filter="sum")
        with pytest.raises(treecast.FormatError, match="bad format string"):
            s.send(1, "%q", 1)
        with pytest.raises(treecast.FormatError, match="must be an int") as e:
            s.send(1, "%d", "seven")
        assert isinstance(e.value, TypeError) and isinstance(e.value, treecast.Error)
        with pytest.raises(treecast.FormatError, match="names 2 values but 1 were given"):
            s.send(1, "%d %d", 1)
        with pytest.raises(treecast.FilterError, match="no-such-filter"):
            net.stream(filter="no-such-filter")
        with pytest.raises(treecast.TimeoutError):
            s.recv(timeout=0.2)
        with pytest.raises(ValueError, match="sync"):
            net.stream(sync="sometimes")
    with pytest.raises(treecast.NetworkClosed, match="closed"):
        net.run(["true"])
    with pytest.raises(treecast.NetworkClosed):
        net.stream()
    net.close()  # again: nothing


def test_a_launch_that_fails_raises_launch_error_and_leaves_nothing():
    with pytest.raises(treecast.LaunchError):
        treecast.Network(local=2, backend=["/nonexistent/backend"], connect_timeout=10)
    with pytest.raises(treecast.LaunchError):
        treecast.Network(local=2, topology="nonsense:9")


def test_a_backend_script_that_raises_is_reported_lost_with_its_traceback(backend):
    with treecast.Network(local=2, topology="flat", backend=backend) as net:
        s = net.stream(ranks=[1])
        s.send(3, "")
        event = net.next_event(timeout=30)
        while event is not None and event["kind"] != "ranks_lost":
            event = net.next_event(timeout=30)
        assert event is not None, "no event within 30 s"
        assert str(event["ranks"]) == "1"
        assert "RuntimeError: rank 1 was asked to fail" in event["reason"], event
        assert 1 in net.lost_ranks()


def test_a_backend_that_raises_before_joining_fails_the_launch_with_its_traceback(backend):
    with pytest.raises(treecast.LaunchError, match="ValueError: boom before joining"):
        treecast.Network(local=2, topology="flat", backend=backend + ["raise"])


def next_of_kind(net: treecast.Network, kind: str, limit: float = 30.0) -> dict:
    """The next event of ``kind``, skipping others; fails after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        event = net.next_event(timeout=left)
        if event is not None and event["kind"] == kind:
            return event
    raise AssertionError(f"no {kind} event within {limit} s")


def test_spawn_events_and_clock():
    with treecast.Network(local=2, topology="flat") as net:
        ranks = net.spawn(2)
        assert str(ranks) == "2-3"
        joined = treecast.RankSet()
        while joined != ranks:  # one event per batch of ranks that joined
            joined = joined | next_of_kind(net, "ranks_joined")["ranks"]
        res = net.run(["true"], timeout=30)
        assert str(res.classes[0].ranks) == "0-3"
        table = net.wait_clock(rounds=1, timeout=30)
        assert table, "an empty clock table"
        for row in table:
            assert {"node_id", "name", "offset_ns", "error_ns", "drift_ppm", "rounds"} <= row.keys()
            assert row["rounds"] >= 1 and row["name"], row
        assert {row["node_id"] for row in net.clock()} >= {row["node_id"] for row in table}
        with pytest.raises(treecast.TimeoutError, match="clock"):
            net.wait_clock(rounds=10_000, timeout=0.2)


def test_spawn_with_a_command_joins_python_backends_to_the_reduction(backend):
    with treecast.Network(local=2, topology="flat", backend=backend) as net:
        assert str(net.spawn(2, backend)) == "2-3"
        s = net.stream(filter="sum")
        s.send(1, "%ld", 1)
        assert s.recv(timeout=30).values == [1 + 2 + 3 + 4]
        s.send(99, "")


def test_run_reports_timeouts_lost_ranks_and_their_hosts():
    with treecast.Network(local=3, topology="flat") as net:
        # Rank 1 outlives the time limit: the back-end kills it, status 124.
        res = net.run(["sh", "-c", 'if [ "$TREECAST_RANK" = 1 ]; then sleep 60; fi'], timeout=1)
        assert res.max_status == 124 and str(res.failed()) == "1", res.classes
        assert res.failed_hosts() == "localhost"
        # Rank 2's back-end (the parent of the command's parent) dies under its
        # command: the rank is lost, status 255.
        die = 'if [ "$TREECAST_RANK" = 2 ]; then read -r _ _ _ be _ < /proc/$PPID/stat; kill -9 "$be"; fi'
        res = net.run(["sh", "-c", die], timeout=30)
        assert res.max_status == 255 and str(res.failed()) == "2"
        assert [str(r) for r, _ in res.lost] == ["2"], res.lost
        assert res.failed_hosts() == "localhost"
        # Later runs name the lost rank again, at once.
        again = net.run(["true"], timeout=30)
        assert str(again.classes[0].ranks) == "0-1" and [str(r) for r, _ in again.lost] == ["2"]
    with treecast.Network(local=2, topology="flat") as net:
        assert net.run(["true"], timeout=30).failed_hosts() == ""


def test_a_plugin_filter_is_used_by_name_and_its_errors_are_events(backend, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build examples/filters/sum.c")
    root = Path(__file__).resolve().parents[2]
    so = tmp_path / "libsum.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-I", str(root / "include"), "-o", str(so),
         str(root / "examples" / "filters" / "sum.c")],
        check=True,
    )
    with treecast.Network(local=4, topology="balanced:2x2", backend=backend, plugins=[so]) as net:
        s = net.stream(filter="plugin_sum")
        s.send(2, "%d", 5)  # echoed by every back-end, added by the plug-in at each level
        assert s.recv(timeout=30).values == [20]
        s.send(2, "%s", "five")  # not what plugin_sum takes: it refuses, an event says so
        event = next_of_kind(net, "filter_error")
        assert event["stream"] == s.id and "expected" in event["reason"], event
        with pytest.raises(treecast.FilterError, match="no-such-plugin"):
            net.stream(filter="no-such-plugin@2")
        s.send(99, "")


def test_bad_arguments_are_treecast_errors_and_value_errors():
    with pytest.raises(treecast.ArgumentError, match='launcher="pbs"') as e:
        treecast.Network(local=2, launcher="pbs")
    assert isinstance(e.value, ValueError) and isinstance(e.value, treecast.Error)
    with pytest.raises(treecast.ArgumentError, match="rank set"):
        treecast.RankSet("x-y")
    with treecast.Network(local=1, topology="flat") as net:
        with pytest.raises(treecast.ArgumentError, match="timeout="):
            net.run(["true"], timeout=-1)
        with pytest.raises(treecast.ArgumentError, match="names no command"):
            net.run([])


def test_bcast_file_writes_on_every_backend(tmp_path):
    src = tmp_path / "tool.bin"
    src.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    dst = tmp_path / "out"
    dst.mkdir()
    seen = []
    with treecast.Network(local=3, topology="flat") as net:
        report = net.bcast_file(src, f"{dst}/", progress=lambda sent, size: seen.append((sent, size)))
        assert report["ok"], report
    assert (dst / "tool.bin").read_bytes() == src.read_bytes()
    assert seen and seen[-1][1] == src.stat().st_size


def test_a_network_left_open_is_closed_when_collected():
    net = treecast.Network(local=2, topology="flat")
    assert not net.closed
    del net  # the fixture checks that its processes went away


def test_backends_started_elsewhere_attach_through_a_file(tmp_path, backend):
    import threading
    import time

    path = tmp_path / "tree.attach"
    got: dict[str, object] = {}

    def launch() -> None:
        try:
            got["net"] = treecast.Network(local=2, topology="flat", attach=path, attach_timeout=60)
        except BaseException as e:  # noqa: BLE001  (reported below)
            got["error"] = e

    t = threading.Thread(target=launch)
    t.start()
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.05)
    code = (
        "import sys, treecast\n"
        "be = treecast.BackEnd(attach=sys.argv[1], rank=int(sys.argv[2]))\n"
        "stream, pkt = be.recv()\n"
        "stream.send(pkt.tag, '%ld', (be.rank + 1) * pkt.values[0])\n"
        "be.close()\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code, str(path), str(r)]) for r in range(2)]
    try:
        t.join(60)
        assert "error" not in got, got.get("error")
        net = got["net"]
        assert isinstance(net, treecast.Network)
        with net:
            s = net.stream(filter="sum")
            s.send(4, "%ld", 10)
            assert s.recv(timeout=30).values == [30]
        for c in children:
            assert c.wait(timeout=30) == 0
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()


def test_a_rank_set_too_large_to_list_iterates_lazily():
    import itertools

    whole = treecast.RankSet("0-4294967295")
    assert len(whole) == 2**32 and 4294967295 in whole
    assert list(itertools.islice(whole, 3)) == [0, 1, 2]
    r = treecast.RankSet("2-3,7,4294967294-4294967295")
    assert list(r) == r.to_list() == [2, 3, 7, 4294967294, 4294967295]
    assert list(treecast.RankSet()) == [] and treecast.RankSet().to_list() == []
