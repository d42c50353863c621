#!/usr/bin/env python3
"""What an attacker costs an `ldm7 serve` (issue #16 item 4): idle connections and an
oversized record, measured as the server's resident memory (VmRSS from /proc).

Usage (a server on loopback, its pid known):

    ldm7 queue create -q /tmp/dos/q.pq --size 50M
    printf 'ALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\\n' > /tmp/dos/ldmd.conf
    ldm7 serve -c /tmp/dos/ldmd.conf -q /tmp/dos/q.pq -P 38800 --max-clients 1000 &
    experiments/ldm6-dos.py --pid $! --port 38800 idle --count 256
    experiments/ldm6-dos.py --pid $! --port 38800 record --announce 268435000 --send 64M

`idle` opens COUNT connections and sends nothing (with --nullproc, one NULLPROC each, answered);
`record` announces a fragment of ANNOUNCE bytes and sends SEND of them in 64 KiB writes, then
reports whether the server closed the connection. Each prints the RSS before, after and the
difference per connection.
"""

import argparse
import socket
import struct
import time

NULLPROC = struct.pack(">11I", 0x80000028, 1, 0, 2, 300029, 6, 0, 0, 0, 0, 0)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def idle(args):
    before = rss_kib(args.pid)
    sockets = []
    for _ in range(args.count):
        s = socket.create_connection(("127.0.0.1", args.port))
        if args.nullproc:
            s.sendall(NULLPROC)
            s.settimeout(10)
            s.recv(64)
        sockets.append(s)
    time.sleep(args.settle)
    after = rss_kib(args.pid)
    alive = 0
    for s in sockets:
        s.setblocking(False)
        try:
            alive += s.recv(1) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    print(
        f"idle: {args.count} connections{' (one NULLPROC each)' if args.nullproc else ''}: "
        f"RSS {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB "
        f"({(after - before) / args.count:.0f} KiB per connection); {alive} still open"
    )
    for s in sockets:
        s.close()


def record(args):
    before = rss_kib(args.pid)
    s = socket.create_connection(("127.0.0.1", args.port))
    s.sendall(struct.pack(">I", 0x80000000 | args.announce))
    chunk = b"\0" * (64 << 10)
    sent = 0
    closed = False
    s.settimeout(5)
    try:
        while sent < args.send:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        closed = True
    time.sleep(args.settle)
    after = rss_kib(args.pid)
    if not closed:
        s.setblocking(False)
        try:
            closed = s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed = True
    print(
        f"record: announced {args.announce} bytes, sent {sent} bytes: RSS {before / 1024:.1f} MiB -> "
        f"{after / 1024:.1f} MiB (+{(after - before) / 1024:.1f} MiB); "
        f"{'closed by the server' if closed else 'still open'}"
    )
    s.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True, help="the server's pid")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds to wait before reading RSS")
    commands = parser.add_subparsers(dest="command", required=True)
    idle_parser = commands.add_parser("idle")
    idle_parser.add_argument("--count", type=int, default=256)
    idle_parser.add_argument("--nullproc", action="store_true")
    record_parser = commands.add_parser("record")
    record_parser.add_argument("--announce", type=int, default=(256 << 20))
    record_parser.add_argument("--send", type=size, default=size("64M"))
    args = parser.parse_args()
    {"idle": idle, "record": record}[args.command](args)


if __name__ == "__main__":
    main()
