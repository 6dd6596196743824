#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""A second unmodified libibverbs consumer (rdma-core's pyverbs) on a urdma
device: the extended device query, object create/destroy rounds, and the
errno of invalid requests.

    pyverbs_objects.py DEVICE ROUNDS

Prints one line per failed check; exits 1 if any failed.
"""
import errno
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr

failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print(f"FAIL {what}")


def expect_errno(want, what, make):
    try:
        obj = make()
    except PyverbsRDMAError as err:
        check(err.error_code == want,
              f"{what}: got {errno.errorcode.get(err.error_code, err.error_code)}, "
              f"want {errno.errorcode[want]}")
        return
    obj.close()
    check(False, f"{what}: succeeded, want {errno.errorcode[want]}")


def rc_attr(cq, sge=1):
    cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=sge, max_recv_sge=1)
    return QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)


def main(name, rounds):
    with Context(name=name) as ctx:
        attr = ctx.query_device()
        attr_ex = ctx.query_device_ex()
        check(attr_ex.orig_attr.max_qp == attr.max_qp,
              "query_device_ex and query_device disagree on max_qp")
        check(attr.max_qp > 0 and attr.max_cqe > 0 and attr.max_sge > 0,
              f"limits max_qp {attr.max_qp} max_cqe {attr.max_cqe} max_sge {attr.max_sge}")
        port = ctx.query_port(1)
        check(port.state == e.IBV_PORT_ACTIVE, f"port state {port.state}")

        for _ in range(rounds):
            with PD(ctx) as pd:
                mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
                cq = CQ(ctx, 32)
                qp = QP(pd, rc_attr(cq))
                check(qp.qp_num > 0, f"qp_num {qp.qp_num}")
                qp.close()
                cq.close()
                mr.close()

        with PD(ctx) as pd:
            cq = CQ(ctx, 8)
            expect_errno(errno.EINVAL, "MR with remote but not local write",
                         lambda: MR(pd, 4096, e.IBV_ACCESS_REMOTE_WRITE))
            expect_errno(errno.EINVAL, "CQ above max_cqe",
                         lambda: CQ(ctx, attr.max_cqe + 1))
            ud = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                            cap=QPCap(max_send_wr=1, max_recv_wr=1))
            expect_errno(errno.EOPNOTSUPP, "UD QP", lambda: QP(pd, ud))
            expect_errno(errno.EINVAL, "QP above max_sge",
                         lambda: QP(pd, rc_attr(cq, attr.max_sge + 1)))
            cq.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    if failures:
        print(f"{failures} check(s) failed")
        sys.exit(1)
    print("all checks passed")
