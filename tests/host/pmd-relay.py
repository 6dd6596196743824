#!/usr/bin/env python3
"""scripts/pmd-relay, the wire of the VM's PMD link: each NIC's frames reach the other one,
none comes back to its sender, and the loss file drops its share (30 % of 2000 frames here,
within 5 points) until it is cleared.

    python3 tests/host/pmd-relay.py
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
passed = failed = 0


def check(what: str, ok: bool) -> None:
    global passed, failed
    print(f"pmd-relay: {'ok  ' if ok else 'FAIL'} {what}")
    passed += ok
    failed += not ok


def nic(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("127.0.0.1", port))
    s.settimeout(0.5)
    return s


def send(src: socket.socket, port: int, n: int, tag: bytes) -> None:
    for i in range(n):
        src.sendto(tag + b"%d" % i, ("127.0.0.1", port))
        if i % 100 == 99:
            time.sleep(0.001)


def drain(rx: socket.socket) -> list:
    got = []
    try:
        while True:
            got.append(rx.recv(2048))
    except socket.timeout:
        return got


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        loss = os.path.join(d, "loss")
        open(loss, "w").close()
        relay = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "scripts", "pmd-relay"), loss],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            a_tx, a_rx, b_tx, b_rx = map(int, relay.stdout.readline().split())
            a, b = nic(a_rx), nic(b_rx)
            send(a, a_tx, 1000, b"a")
            got_b, got_a = drain(b), drain(a)
            check("A's 1000 frames reach B, in order", got_b == [b"a%d" % i for i in range(1000)])
            check("none comes back to A", got_a == [])
            send(b, b_tx, 1000, b"b")
            check("B's 1000 frames reach A", len(drain(a)) == 1000)
            with open(loss, "w") as f:
                f.write("30%\n")
            send(a, a_tx, 2000, b"a")
            n = len(drain(b))
            check(f"30 % loss: {n} of 2000 frames arrive", 1300 <= n <= 1500)
            open(loss, "w").close()
            send(b, b_tx, 1000, b"b")
            check("loss cleared: all 1000 arrive", len(drain(a)) == 1000)
        finally:
            relay.kill()
            relay.wait()
    print(f"pmd-relay: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
