#!/usr/bin/env python3
"""Run a command on a host list, print the grouped output and the failing hosts.

    python admin.py --hosts 'node[01-64]' -- uname -r
    python admin.py --local 16 -- sh -c 'test $TREECAST_RANK -lt 12'

Exits with the largest exit status (255: a host was lost or did not answer), as
``pdsh -S`` and ``clush`` do.
"""

from __future__ import annotations

import argparse
import sys

import treecast


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="host list, e.g. node[01-64]")
    where.add_argument("--local", type=int, help="N back-ends on this machine")
    p.add_argument("--fanout", type=int, default=16)
    p.add_argument("--timeout", type=float, default=60, help="seconds the command may run")
    p.add_argument("command", nargs="+")
    args = p.parse_args()

    if args.hosts:
        print(f"{treecast.hosts.count(args.hosts)} hosts: {treecast.hosts.fold(args.hosts)}", file=sys.stderr)
    with treecast.Network(local=args.local, hosts=args.hosts, fanout=args.fanout) as net:
        res = net.run(args.command, timeout=args.timeout)
    for c in res.classes:
        print(f"---------------- {c.hosts if args.hosts else c.ranks} ({len(c.ranks)}) {c.status}")
        sys.stdout.write(c.output)
        if c.stderr:
            sys.stdout.write(c.stderr.decode("utf-8", "replace"))
    failed = res.failed()
    if failed:
        print(f"failed: hosts {res.failed_hosts()} (ranks {failed})", file=sys.stderr)
        for ranks, why in res.lost + res.no_answer:
            print(f"  {ranks}: {why}", file=sys.stderr)
    return res.max_status


if __name__ == "__main__":
    sys.exit(main())
