"""treecast from Python: start a tree of processes, run commands on every back-end,
reduce values through the tree, broadcast files; blocking or asyncio.

Every blocking call releases the GIL and honours Ctrl-C; its awaitable twin has the
same name with ``_async`` (``net.run_async``, ``s.recv_async``,
``Network.launch_async``). Errors are :class:`Error` and its subclasses, with the
messages of the Rust library (and of the ``treecast`` command).
"""

from __future__ import annotations

import atexit
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union, cast

from . import _native, hosts
from ._native import (
    FIRST_RESERVED_TAG,
    ArgumentError,
    BackEnd,
    BackEndStream,
    Error,
    FilterError,
    FormatError,
    LaunchError,
    NetworkClosed,
    Packet,
    RankSet,
    Stream,
    TimeoutError,
)

__all__ = [
    "FIRST_RESERVED_TAG",
    "ArgumentError",
    "BackEnd",
    "BackEndStream",
    "Error",
    "FilterError",
    "FormatError",
    "LaunchError",
    "Network",
    "NetworkClosed",
    "OutputClass",
    "Packet",
    "RankSet",
    "RunResult",
    "Stream",
    "TimeoutError",
    "binary",
    "hosts",
]

__version__: str = _native.__version__

Ranks = Union[RankSet, str, Sequence[int]]


def binary() -> str:
    """The ``treecast`` binary that came with this package: what comm nodes and the
    generic back-ends run (``treecast node``, ``treecast backend``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "treecast")
    if not os.access(path, os.X_OK):
        raise LaunchError(
            f"the treecast binary of this package is missing or not executable at {path}: "
            "reinstall the package (pip install ./python builds it)"
        )
    return path


@dataclass(frozen=True)
class OutputClass:
    """One distinct output of :meth:`Network.run` and the ranks that produced it."""

    ranks: RankSet
    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: int
    status: str
    hosts: str
    stdout_bytes: int
    stderr_bytes: int

    @property
    def output(self) -> str:
        """Standard output as text (invalid UTF-8 replaced)."""
        return self.stdout.decode("utf-8", "replace")


class RunResult:
    """What :meth:`Network.run` found: outputs grouped by equivalence class, ranks
    lost or silent, and the largest exit status."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.classes: list[OutputClass] = [OutputClass(**c) for c in raw["classes"]]
        self.lost: list[tuple[RankSet, str]] = list(raw["lost"])
        self.no_answer: list[tuple[RankSet, str]] = list(raw["no_answer"])
        self.ok: bool = raw["ok"]
        #: The largest exit status of any rank (128+N for a signal), or 255 when a rank
        #: was lost or did not answer and none is larger (as pdsh -S and clush report).
        self.max_status: int = raw["max_status"]
        self.backends: int = raw["backends"]
        self._failed_hosts: str = raw["failed_hosts"]

    def groups(self) -> Iterator[tuple[str, RankSet]]:
        """``(output, ranks)`` for each distinct output (stdout as text), like
        ClusterShell's ``iter_buffers``. Ranks are grouped by everything they wrote
        and how the command ended: see :attr:`classes` for stderr and status."""
        for c in self.classes:
            yield c.output, c.ranks

    def failed(self) -> RankSet:
        """Ranks whose command failed, that were lost or did not answer."""
        out = RankSet()
        for c in self.classes:
            if c.exit_code != 0:
                out = out | c.ranks
        for ranks, _ in self.lost + self.no_answer:
            out = out | ranks
        return out

    def failed_hosts(self) -> str:
        """The hosts of :meth:`failed` as a folded host list (``node[03,07]``), as
        pdsh and clush name them: hosts whose command failed, were lost or did not
        answer, each once. Empty when every rank succeeded. Ranks spawned while the
        tree ran add no host (they are not in the launch's topology)."""
        return self._failed_hosts

    def __repr__(self) -> str:
        return f"RunResult(classes={len(self.classes)}, lost={len(self.lost)}, max_status={self.max_status})"


_open: "weakref.WeakSet[Network]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # A script that ends without closing its networks leaves no process behind.
    for net in list(_open):
        try:
            net.close()
        except BaseException:  # noqa: BLE001  (best effort at exit)
            pass


def _ranks(ranks: Optional[Ranks]) -> Optional[RankSet]:
    if ranks is None or isinstance(ranks, RankSet):
        return ranks
    return RankSet(ranks)


class Network:
    """A tree of processes and its front-end.

    ``Network(local=16, topology="balanced:4x4")`` starts comm nodes and 16 local
    back-ends; ``hosts="node[01-64]", fanout=8, launcher="ssh"`` one back-end per
    host; ``attach=PATH`` waits for back-ends started by another launcher;
    ``route="udp"`` (multicast), ``"striped:N"`` or ``"mptcp"`` sets the links'
    route, among which each :meth:`stream` may choose (``route="tcp"``). The
    back-ends run ``backend`` (argv), by default the generic back-end of the
    ``treecast`` binary that came with the package, which :meth:`run` and
    :meth:`bcast_file` need. Use it as a context manager: it is closed on exit.
    """

    def __init__(
        self,
        local: Optional[int] = None,
        *,
        topology: Optional[str] = None,
        hosts: Optional[str] = None,
        exclude: Sequence[str] = (),
        fanout: int = 16,
        user: Optional[str] = None,
        per_host: int = 1,
        launcher: Optional[str] = None,
        ssh_args: Optional[str] = None,
        remote_path: Optional[str] = None,
        allow_missing: bool = False,
        attach: Optional[Union[str, os.PathLike[str]]] = None,
        attach_timeout: float = 300.0,
        connect_timeout: Optional[float] = None,
        dead_after: Optional[float] = None,
        rejoin_within: Optional[float] = None,
        route: Optional[str] = None,
        backend: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        plugins: Sequence[Union[str, os.PathLike[str]]] = (),
        _native_net: Any = None,
    ) -> None:
        if _native_net is None:
            _native_net = _native.Network.launch(
                binary(), **_launch_args(locals())
            )
        self._net = _native_net
        _open.add(self)

    @classmethod
    async def launch_async(cls, local: Optional[int] = None, **options: Any) -> "Network":
        """Awaitable constructor: ``net = await Network.launch_async(local=4)``."""
        args = _launch_args(dict(options, local=local))
        native = await _native.Network.launch(binary(), is_async=True, **args)
        return cls(_native_net=native)

    # -- context managers
    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Network":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    # -- properties
    @property
    def session(self) -> str:
        """The session id every process of the tree carries."""
        return str(self._net.session)

    @property
    def backends(self) -> int:
        """Back-ends started at launch."""
        return int(self._net.backends)

    @property
    def commnodes(self) -> int:
        """Comm nodes started at launch."""
        return int(self._net.commnodes)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return bool(self._net.closed)

    # -- commands
    def run(self, command: Sequence[str], timeout: Optional[float] = None, output_limit: int = 65536) -> RunResult:
        """Runs ``command`` (argv) on every back-end and groups the outputs; with a
        ``timeout`` (seconds) the back-ends kill it then. Needs the generic back-end."""
        return RunResult(self._net.run(list(command), timeout, output_limit))

    async def run_async(
        self, command: Sequence[str], timeout: Optional[float] = None, output_limit: int = 65536
    ) -> RunResult:
        """Awaitable :meth:`run`."""
        return RunResult(await self._net.run(list(command), timeout, output_limit, is_async=True))

    def stream(
        self,
        filter: str = "null",
        sync: str = "wait_for_all",
        ranks: Optional[Ranks] = None,
        down_filter: Optional[str] = None,
        route: Optional[str] = None,
    ) -> Stream:
        """Opens a stream to ``ranks`` (every back-end by default) whose packets
        coming up are reduced by ``filter`` (sum, min, max, avg, concat, eqclass,
        null, or a plug-in's name) in waves grouped by ``sync`` (``wait_for_all``,
        ``do_not_wait``, ``timeout:MS``). ``route`` keeps its frames to part of the
        network's route: ``tcp`` (whole, on one connection per link), ``udp``
        (multicast; needs ``route="udp"`` on the network), ``striped`` (needs
        striped links); ``None``: whatever the network's route does."""
        return cast(Stream, self._net.stream(filter, sync, _ranks(ranks), down_filter, route))

    async def stream_async(
        self,
        filter: str = "null",
        sync: str = "wait_for_all",
        ranks: Optional[Ranks] = None,
        down_filter: Optional[str] = None,
        route: Optional[str] = None,
    ) -> Stream:
        """Awaitable :meth:`stream`."""
        return cast(Stream, await self._net.stream(filter, sync, _ranks(ranks), down_filter, route, is_async=True))

    def bcast_file(
        self,
        src: Union[str, os.PathLike[str]],
        dst: Optional[Union[str, os.PathLike[str]]] = None,
        progress: Optional[Callable[[int, int], None]] = None,
        mode: str = "leave",
        ranks: Optional[Ranks] = None,
    ) -> dict[str, Any]:
        """Sends the file ``src`` to every back-end (or ``ranks``), written at
        ``dst`` (a folder when it ends with ``/``); ``progress(sent, size)`` is called
        from this thread as chunks go. Returns the transfer's report."""
        return dict(self._net.bcast_file(os.fspath(src), None if dst is None else os.fspath(dst), progress, mode,
                                         _ranks(ranks)))

    async def bcast_file_async(
        self,
        src: Union[str, os.PathLike[str]],
        dst: Optional[Union[str, os.PathLike[str]]] = None,
        mode: str = "leave",
        ranks: Optional[Ranks] = None,
    ) -> dict[str, Any]:
        """Awaitable :meth:`bcast_file` (no progress callback)."""
        return dict(await self._net.bcast_file(os.fspath(src), None if dst is None else os.fspath(dst), None, mode,
                                               _ranks(ranks), is_async=True))

    def spawn(self, n: int, command: Optional[Sequence[str]] = None) -> RankSet:
        """Starts ``n`` more back-ends while the tree runs (running ``command``, or
        the launch's back-end); returns their ranks."""
        return cast(RankSet, self._net.spawn(n, list(command or [])))

    async def spawn_async(self, n: int, command: Optional[Sequence[str]] = None) -> RankSet:
        """Awaitable :meth:`spawn`."""
        return cast(RankSet, await self._net.spawn(n, list(command or []), is_async=True))

    def events(self) -> list[dict[str, Any]]:
        """The events so far, oldest first (lost ranks, rejoins, filter errors): dicts
        with ``kind``, ``message`` and, as they apply, ``ranks``, ``reason``, ``node``."""
        return list(self._net.events())

    def next_event(self, timeout: Optional[float] = None) -> Optional[dict[str, Any]]:
        """The next event, waiting up to ``timeout`` seconds; None if none came or the
        network ended by itself; raises NetworkClosed if it was closed meanwhile."""
        return cast(Optional[dict[str, Any]], self._net.next_event(timeout))

    async def next_event_async(self, timeout: Optional[float] = None) -> Optional[dict[str, Any]]:
        """Awaitable :meth:`next_event`."""
        return cast(Optional[dict[str, Any]], await self._net.next_event(timeout, is_async=True))

    def clock(self) -> list[dict[str, Any]]:
        """The global clock table: every node's offset to the front-end's clock."""
        return list(self._net.clock())

    def wait_clock(self, rounds: int = 2, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Waits until every reachable node's clock was measured in ``rounds`` rounds
        (2 gives the drift), ``timeout`` seconds at most (:class:`TimeoutError`
        naming how many nodes are missing), then returns :meth:`clock`'s table."""
        return list(self._net.wait_clock(rounds, timeout))

    async def wait_clock_async(self, rounds: int = 2, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Awaitable :meth:`wait_clock`."""
        return list(await self._net.wait_clock(rounds, timeout, is_async=True))

    def lost_ranks(self) -> RankSet:
        """Ranks lost so far."""
        return cast(RankSet, self._net.lost_ranks())

    def flush(self, timeout: Optional[float] = 60.0) -> None:
        """Waits until everything sent so far (packets, stream commands) is written
        out to the links, ``timeout`` seconds at most (None: no limit); raises
        :class:`TimeoutError` when a peer stops reading."""
        self._net.flush(timeout)

    async def flush_async(self, timeout: Optional[float] = 60.0) -> None:
        """Awaitable :meth:`flush`."""
        await self._net.flush(timeout, is_async=True)

    def close(self) -> None:
        """Shuts the tree down and waits for its processes; again: nothing."""
        self._net.close()
        _open.discard(self)

    async def close_async(self) -> None:
        """Awaitable :meth:`close`."""
        await self._net.close(is_async=True)
        _open.discard(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<treecast.Network session={self.session} backends={self.backends} {state}>"


def _launch_args(options: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``Network`` as the native launch takes them."""
    out = {k: v for k, v in options.items() if k not in ("self", "_native_net", "__class__")}
    if out.get("attach") is not None:
        out["attach"] = os.fspath(out["attach"])
    if out.get("backend") is not None:
        out["backend"] = [os.fspath(a) for a in out["backend"]]
    if out.get("env") is not None:
        out["env"] = list(dict(out["env"]).items())
    out["exclude"] = list(out.get("exclude") or [])
    out["plugins"] = [os.fspath(p) for p in out.get("plugins") or []]
    return out
