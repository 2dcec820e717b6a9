"""The README's first command, scripts/run.sh, without its install and build
steps (SMOCKRON_SKIP_BUILD): it comes up on the embedded defaults, Ctrl-C
stops every process it started, and a daemon that cannot start (its port is
taken) makes it fail loudly, naming the daemon and the address.

It uses the embedded defaults' fixed ports on 127.0.0.1 (8080, 9000, 9105,
9106); the test is skipped when one of them is busy.

Run: cd integration && python3 -m unittest -v test_run_script
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin"))
PORTS = (8080, 9000, 9105, 9106)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class RunScriptTest(unittest.TestCase):
    def setUp(self):
        busy = [p for p in PORTS if not port_free(p)]
        if busy:
            self.skipTest(f"ports {busy} on 127.0.0.1 are in use")
        self.log = open(os.path.join(ROOT, "build", "run-script-test.log"), "w+")
        self.addCleanup(self.log.close)

    def start(self) -> subprocess.Popen:
        env = dict(os.environ, SMOCKRON_SKIP_BUILD="1", SMOCKRON_BIN_DIR=BIN)
        p = subprocess.Popen(["bash", "scripts/run.sh"], cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # its own process group, as a terminal's job

        def kill_group():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
        self.addCleanup(kill_group)
        return p

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False

    def test_ctrl_c_stops_everything_it_started(self):
        p = self.start()
        self.assertTrue(wait_for(lambda: "Smockron is running" in self.output() or p.poll() is not None, 30),
                        self.output())
        self.assertIsNone(p.poll(), self.output())
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        self.assertEqual(p.wait(30), 130, self.output())
        self.assertTrue(wait_for(lambda: not self.group_alive(p.pid), 20), "processes of the script outlive it")
        self.assertTrue(all(port_free(port) for port in PORTS), "a port is still held")

    def test_a_daemon_that_cannot_start_fails_the_script_loudly(self):
        with socket.socket() as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            taken.bind(("127.0.0.1", 8080))
            taken.listen()
            p = self.start()
            self.assertEqual(p.wait(30), 1, self.output())
        out = self.output()
        self.assertNotIn("Smockron is running", out)
        self.assertIn("smockron-proxy exited", out)
        self.assertIn("cannot listen on 127.0.0.1:8080: Address already in use", out)
        self.assertNotIn("/usr/include", out, "errors name the address, not Asio's source")
        self.assertTrue(wait_for(lambda: not self.group_alive(p.pid), 20), "the others were stopped")


if __name__ == "__main__":
    unittest.main()
