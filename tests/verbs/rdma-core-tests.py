# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Runs rdma-core's own test suite (python3-pyverbs' tests/run_tests.py) unmodified, with one
thing adapted: how a test finds the IP address of its RDMA device.

    /usr/bin/python3 tests/verbs/rdma-core-tests.py SUITE_DIR [run_tests.py's arguments]

SUITE_DIR is a copy of /usr/share/doc/rdma-core/tests, gunzipped.  Upstream
(tests/base.py, RDMATestCase._get_ip_mac) takes the device's network interface from
/sys/class/infiniband/DEV/device/net/, the directory of the device's parent (a NIC's PCI
function).  A software device on a virtual interface (urdma on a TAP, rxe and siw on a veth)
has no parent there, so every test that needs the address (the rdmacm ones) would skip.  Here,
when that directory is missing, the interface is the one the kernel reports for the device's
port (`rdma -j link show DEV/PORT`, its "netdev"), and the address and MAC are then read by
upstream's own get_ip_mac_address().  Nothing else is changed: the tests, their selection and
their arguments are run_tests.py's.

Two additions that change no test: URDMA_RCT_RESULTS (a file name, optional) receives a line
per test as it starts and ends, "start ID", then "ok ID SECS", "skip ID SECS REASON", "fail ID
SECS WHAT" or "error ID SECS WHAT" (tab-separated; ID without the leading "tests."; SECS the
test's duration; WHAT the exception's last line), written at once, so that a run cut short still says what it did; URDMA_RCT_DEADLINE
(seconds, optional): when it passes, every thread's Python stack is written to stderr and the
process exits (faulthandler), so that a hung test is named.

And one that changes no test but what its random choices are: before each test, Python's
random generator is seeded with the test's id (URDMA_RCT_SEED=off: not), so a test draws the
same values on every stack and in every run.  Several tests draw their attributes at random
(test_qp's extended QPs, for instance, ask for IBV_QP_INIT_ATTR_CREATE_FLAGS half of the time,
which a provider without create_qp_ex refuses, and the test skips); unseeded, such a test
passed on one stack and skipped on another in the same boot, and the stacks' pass counts could
not be compared.
"""
import faulthandler
import json
import os
import random
import runpy
import subprocess
import sys
import time
import traceback
import unittest
from importlib.machinery import SourceFileLoader

suite = os.path.abspath(sys.argv.pop(1))
sys.argv[0] = os.path.join(suite, 'run_tests.py')
sys.path.insert(0, suite)

deadline = int(os.environ.get('URDMA_RCT_DEADLINE', '0') or 0)
if deadline > 0:
    faulthandler.dump_traceback_later(deadline, exit=True)

# The package "tests" as run_tests.py loads it; the test modules it imports are then the ones
# run_tests.py finds in sys.modules when it loads the package again.
tests = SourceFileLoader('tests', os.path.join(suite, '__init__.py')).load_module()
import tests.base  # noqa: E402  (already imported by the test modules)

upstream_get_ip_mac = tests.base.RDMATestCase._get_ip_mac


def port_netdev(dev, port):
    """The network interface of DEV's port PORT as the kernel reports it, or None."""
    try:
        out = subprocess.check_output(['rdma', '-j', 'link', 'show', f'{dev}/{port}'],
                                      stderr=subprocess.DEVNULL, timeout=60)
        links = json.loads(out.decode())
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    for link in links:
        if link.get('ifname') == dev and link.get('netdev'):
            return link['netdev']
    return None


def get_ip_mac(self, dev, port, idx):
    if os.path.exists(f'/sys/class/infiniband/{dev}/device/net/'):
        return upstream_get_ip_mac(self, dev, port, idx)
    net_name = port_netdev(dev, port)
    if net_name is None:
        self.args.append([dev, port, idx, None, None])
        return
    try:
        ip_addr, mac_addr = self.get_ip_mac_address(net_name)
    except (KeyError, IndexError, subprocess.SubprocessError):
        self.args.append([dev, port, idx, None, None])
    else:
        self.args.append([dev, port, idx, ip_addr, mac_addr])


tests.base.RDMATestCase._get_ip_mac = get_ip_mac

results_file = os.environ.get('URDMA_RCT_RESULTS')
seeded = os.environ.get('URDMA_RCT_SEED', 'test') != 'off'


class RecordingResult(unittest.TextTestResult):
    """unittest's own result, which also records each outcome in URDMA_RCT_RESULTS."""

    started = 0.0

    def _record(self, kind, test, detail=''):
        if not results_file:
            return
        tid = test.id()
        tid = tid[len('tests.'):] if tid.startswith('tests.') else tid
        if kind == 'start':
            RecordingResult.started = time.monotonic()
            line = f'start\t{tid}'
        else:
            secs = time.monotonic() - RecordingResult.started
            line = f'{kind}\t{tid}\t{secs:.1f}\t' + ' '.join(str(detail).split())
        with open(results_file, 'a') as f:
            f.write(line.rstrip('\t') + '\n')

    @staticmethod
    def _what(err):
        lines = traceback.format_exception_only(err[0], err[1])
        return lines[-1].strip() if lines else repr(err[1])

    def startTest(self, test):
        if seeded:
            random.seed(test.id())
        self._record('start', test)
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record('ok', test)

    def addError(self, test, err):
        super().addError(test, err)
        self._record('error', test, self._what(err))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record('fail', test, self._what(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record('skip', test, reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record('xfail', test, self._what(err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record('xpass', test)


unittest.TextTestRunner.resultclass = RecordingResult

runpy.run_path(sys.argv[0], run_name='__main__')
