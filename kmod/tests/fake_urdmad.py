#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""A stand-in for urdmad on /dev/urdma_cm, for the kernel's CM tests.

    fake_urdmad.py IFNAME SOCKET_PATH

Registers IFNAME (in this process's network namespace) with SOCKET_PATH,
prints "registered" (or "register: ERRNO-NAME" and exits 3), then logs
every kernel message as one line and answers it.  There is no wire: a
CONNECT is answered by the remote port it names,

    7001  CONNECT_FAILED -ECONNREFUSED, private data "refused-by-fake"
    7002  CONNECT_FAILED -ETIMEDOUT
    7003  no answer until SIGUSR2 (then CONNECT_FAILED -ETIMEDOUT)
    7005  REQUEST to the listener, then at once REQUEST_GONE (the
          requester gave up) and CONNECT_FAILED -ETIMEDOUT
    else  REQUEST to a listener on that port, whose ACCEPT makes both
          sides connected (ACCEPTED 0, CONNECTED with the accept's
          private data) and whose REJECT fails the connect with
          -ECONNREFUSED and the reject's private data.  An ACCEPT whose
          private data is "noanswer" is never answered; one whose
          private data is "held" is answered so at SIGUSR2.

DISCONNECT closes both QPs of a pair: graceful (status 0) as CLOSED 0 and,
for the peer, PEER_CLOSED then CLOSED 0; an abort as CLOSED status and
CLOSED -ECONNRESET for the peer.  SIGUSR1 closes every pair from the
"wire" (PEER_CLOSED, CLOSED 0 on both sides).  Only the Python standard
library is used.
"""
import errno
import os
import select
import signal
import socket
import struct
import sys

# struct urdma_cm_msg (kmod/urdma-abi.h); addresses and ports stay raw
# network-order bytes.
FMT = "<IiQQII4s4s2s2sHH6sH256s16s108sI"
SIZE = struct.calcsize(FMT)
assert SIZE == 440

OPS = {
    1: "REGISTER", 2: "REQUEST", 3: "CONNECTED", 4: "CONNECT_FAILED",
    5: "ACCEPTED", 6: "PEER_CLOSED", 7: "CLOSED", 8: "REQUEST_GONE",
    32: "LISTEN", 33: "UNLISTEN", 34: "CONNECT", 35: "ACCEPT",
    36: "REJECT", 37: "DISCONNECT",
}
OP = {v: k for k, v in OPS.items()}
ZERO4 = b"\0" * 4
ZERO2 = b"\0" * 2


def msg(op, status=0, id=0, req=0, dev_id=0, qpn=0, la=ZERO4, ra=ZERO4,
        lp=ZERO2, rp=ZERO2, ird=0, ord=0, mac=b"", pdata=b"", ifname=b"",
        path=b""):
    return struct.pack(FMT, OP[op], status, id, req, dev_id, qpn, la, ra,
                       lp, rp, ird, ord, mac, len(pdata), pdata, ifname,
                       path, 0)


def unpack(buf):
    f = struct.unpack(FMT, buf)
    return {
        "op": OPS.get(f[0], str(f[0])), "status": f[1], "id": f[2],
        "req": f[3], "dev": f[4], "qpn": f[5], "la": f[6], "ra": f[7],
        "lp": f[8], "rp": f[9], "ird": f[10], "ord": f[11], "mac": f[12],
        "pdata": f[14][:f[13]], "ifname": f[15].split(b"\0")[0],
        "owner": f[17],
    }


def addr(a, p):
    return "%s:%d" % (socket.inet_ntoa(a), struct.unpack(">H", p)[0])


def log(line):
    print(line, flush=True)


class Fake:
    def __init__(self, fd):
        self.fd = fd
        self.listeners = {}     # id -> (addr bytes, port bytes)
        self.pending = {}       # req -> CONNECT message
        self.pairs = {}         # (dev, qpn) -> (dev, qpn)
        self.held = []          # CONNECT ids with no answer yet
        self.held_accepts = []  # (ACCEPT, its CONNECT) with no answer yet
        self.next_req = 100
        self.close_all = False
        self.answer_held = False

    def send(self, op, **kw):
        try:
            os.write(self.fd, msg(op, **kw))
        except OSError as e:
            log("write %s: %s" % (op, errno.errorcode.get(e.errno, e.errno)))

    def on_connect(self, m):
        port = struct.unpack(">H", m["rp"])[0]
        if port == 7001:
            self.send("CONNECT_FAILED", id=m["id"], status=-errno.ECONNREFUSED,
                      pdata=b"refused-by-fake")
            return
        if port == 7002:
            self.send("CONNECT_FAILED", id=m["id"], status=-errno.ETIMEDOUT)
            return
        if port == 7003:
            self.held.append(m["id"])
            return
        for lid, (la, lp) in self.listeners.items():
            if lp == m["rp"] and la in (ZERO4, m["ra"]):
                req = self.next_req
                self.next_req += 1
                self.pending[req] = m
                self.send("REQUEST", id=lid, req=req, la=m["ra"], lp=m["rp"],
                          ra=m["la"], rp=m["lp"], ird=m["ord"], ord=m["ird"],
                          pdata=m["pdata"])
                if port == 7005:
                    del self.pending[req]
                    self.send("REQUEST_GONE", req=req)
                    self.send("CONNECT_FAILED", id=m["id"],
                              status=-errno.ETIMEDOUT)
                return
        self.send("CONNECT_FAILED", id=m["id"], status=-errno.ECONNREFUSED)

    def on_accept(self, m):
        c = self.pending.pop(m["req"], None)
        if c is None:
            self.send("ACCEPTED", req=m["req"], status=-errno.ENOTCONN)
            return
        if m["pdata"] == b"noanswer":
            self.pending[m["req"]] = c
            return
        if m["pdata"] == b"held":
            self.held_accepts.append((m, c))
            return
        self.connect_pair(m, c)

    def connect_pair(self, m, c):
        self.send("ACCEPTED", req=m["req"], status=0)
        self.send("CONNECTED", id=c["id"], la=c["la"], lp=c["lp"],
                  ra=c["ra"], rp=c["rp"], ird=m["ord"], ord=m["ird"],
                  pdata=m["pdata"])
        a, b = (c["dev"], c["qpn"]), (m["dev"], m["qpn"])
        self.pairs[a] = b
        self.pairs[b] = a

    def on_reject(self, m):
        c = self.pending.pop(m["req"], None)
        if c is not None:
            self.send("CONNECT_FAILED", id=c["id"],
                      status=-errno.ECONNREFUSED, pdata=m["pdata"])

    def close_pair(self, a, status):
        b = self.pairs.pop(a, None)
        if b is None:
            return
        self.pairs.pop(b, None)
        if status == 0:
            self.send("CLOSED", dev_id=a[0], qpn=a[1], status=0)
            self.send("PEER_CLOSED", dev_id=b[0], qpn=b[1])
            self.send("CLOSED", dev_id=b[0], qpn=b[1], status=0)
        else:
            self.send("CLOSED", dev_id=a[0], qpn=a[1], status=status)
            self.send("CLOSED", dev_id=b[0], qpn=b[1],
                      status=-errno.ECONNRESET)

    def handle(self, m):
        op = m["op"]
        line = "%s id=%d req=%d dev=%d qpn=%d status=%d" % (
            op, m["id"], m["req"], m["dev"], m["qpn"], m["status"])
        if op in ("CONNECT", "ACCEPT"):
            line += " owner=%d" % m["owner"]
        if op in ("LISTEN", "CONNECT"):
            line += " local=%s" % addr(m["la"], m["lp"])
        if op == "CONNECT":
            line += " remote=%s mac=%s ird=%d ord=%d" % (
                addr(m["ra"], m["rp"]), m["mac"].hex(":"), m["ird"], m["ord"])
        if op == "LISTEN":
            line += " ifname=%s" % m["ifname"].decode()
        if op in ("CONNECT", "ACCEPT", "REJECT"):
            line += " pdata=%s" % m["pdata"].decode(errors="replace")
        log(line)
        if op == "LISTEN":
            self.listeners[m["id"]] = (m["la"], m["lp"])
        elif op == "UNLISTEN":
            self.listeners.pop(m["id"], None)
        elif op == "CONNECT":
            self.on_connect(m)
        elif op == "ACCEPT":
            self.on_accept(m)
        elif op == "REJECT":
            self.on_reject(m)
        elif op == "DISCONNECT":
            self.close_pair((m["dev"], m["qpn"]), m["status"])

    def signals(self):
        if self.close_all:
            self.close_all = False
            log("closing every pair")
            for a in list(self.pairs):
                b = self.pairs.get(a)
                if b is None:
                    continue
                del self.pairs[a], self.pairs[b]
                for x in (a, b):
                    self.send("PEER_CLOSED", dev_id=x[0], qpn=x[1])
                    self.send("CLOSED", dev_id=x[0], qpn=x[1], status=0)
        if self.answer_held:
            self.answer_held = False
            log("answering held connects")
            for cid in self.held:
                self.send("CONNECT_FAILED", id=cid, status=-errno.ETIMEDOUT)
            self.held = []
            for m, c in self.held_accepts:
                self.connect_pair(m, c)
            self.held_accepts = []


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: fake_urdmad.py IFNAME SOCKET_PATH")
    fd = os.open("/dev/urdma_cm", os.O_RDWR)
    try:
        os.write(fd, msg("REGISTER", ifname=sys.argv[1].encode(),
                         path=sys.argv[2].encode()))
    except OSError as e:
        log("register: %s" % errno.errorcode.get(e.errno, e.errno))
        sys.exit(3)
    log("registered")
    fake = Fake(fd)

    def usr1(*_):
        fake.close_all = True

    def usr2(*_):
        fake.answer_held = True

    signal.signal(signal.SIGUSR1, usr1)
    signal.signal(signal.SIGUSR2, usr2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        fake.signals()
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            fake.handle(unpack(os.read(fd, SIZE)))


if __name__ == "__main__":
    main()
