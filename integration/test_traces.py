"""OpenTelemetry traces (issue 37) with the real binaries and a loopback
collector (lib/otlp_receiver.py) that checks every export against the OTLP
schema: the proxy records a span per held and per refused request, in the
trace the request's W3C traceparent names (its span the parent, its sampled
flag obeyed), the master a span per decision that throttled; a forwarded
request records nothing; trace_sample applies to traces started here; a
collector that fails costs spans (counted), never requests. HTTP/2 streams
(nghttp) are traced as HTTP/1.1 requests are: the steps are the same.

Run: cd integration && python3 -m unittest -v test_traces
"""
from __future__ import annotations

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import run  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.otlp_receiver import OtlpReceiver, attributes  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402
from test_shards import stable_hash  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
ROUTES = [
    {"path": "/paced", "domain": "paced", "upstream": "app", "identify": ["header:X-API-Key"], "max_delay": "5s"},
    {"path": "/api", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
     "max_delay": "100ms"},
]


def identifier_hash(identifier: str) -> str:
    return f"{stable_hash(identifier):016x}"


class TracesTest(DaemonTestCase):
    def stack(self, otlp: OtlpReceiver, **proxy_keys):
        return self.gate_stack({"paced": {"rules": [("1/s", 1)]}, "api": {"rules": [("1/min", 1)]}}, ROUTES,
                               master_keys={"trace_endpoint": otlp.url, "trace_interval": "50ms"},
                               trace_endpoint=otlp.url, trace_interval="50ms", **proxy_keys)

    def known(self, proxy, path: str, key: str, headers=()):
        """One request of `key`, then wait for the master's DELAY_UNTIL for it."""
        applied = proxy.ctl()
        self.assertEqual(fetch(proxy.port, path, key=key, headers=headers)[0].status, 200)
        self.wait_ctl(proxy, applied, timeout=10)

    def receiver(self) -> OtlpReceiver:
        otlp = OtlpReceiver().start()
        self.addCleanup(otlp.stop)
        return otlp

    def test_held_and_refused_requests_and_throttling_decisions_are_spans_in_the_callers_trace(self):
        otlp = self.receiver()
        _, _, proxy = self.stack(otlp)
        traced = [("traceparent", f"00-{TRACE}-{PARENT}-01")]

        self.known(proxy, "/paced/1", "pia")
        self.assertEqual(fetch(proxy.port, "/paced/2", key="pia", headers=traced)[0].status, 200)  # held, then sent
        held = wait_until(lambda: otlp.spans(name="smockron.hold"), 10, message="the hold's span")[0]
        self.assertEqual(held.trace_id.hex(), TRACE)
        self.assertEqual(held.parent_span_id.hex(), PARENT)
        a = attributes(held)
        self.assertEqual((a["smockron.domain"], a["smockron.decision"], a["smockron.upstream"]),
                         ("paced", "held", "app"))
        self.assertEqual(a["smockron.identifier_hash"], identifier_hash("pia"))
        self.assertNotIn("pia", str(held), "the identifier itself is never in a span")
        self.assertEqual(a["smockron.held_ms"], (held.end_time_unix_nano - held.start_time_unix_nano) // 1_000_000)
        self.assertGreater(held.end_time_unix_nano, held.start_time_unix_nano)

        self.known(proxy, "/api/1", "rex")
        self.assertEqual(fetch(proxy.port, "/api/2", key="rex")[0].status, 429)  # no traceparent: a trace of its own
        refused = wait_until(lambda: otlp.spans(name="smockron.refuse"), 10, message="the refusal's span")[0]
        a = attributes(refused)
        self.assertEqual((a["smockron.domain"], a["smockron.decision"], a["smockron.reason"]),
                         ("api", "refused", "delay_too_long"))
        self.assertEqual(a["http.response.status_code"], 429)
        self.assertGreaterEqual(a["smockron.retry_after_s"], 1)
        self.assertEqual(refused.status.code, 2)
        self.assertEqual(refused.parent_span_id, b"")
        self.assertNotEqual(refused.trace_id.hex(), TRACE)

        # The master: a span per decision that throttled (pia's and rex's first requests filled their bursts).
        throttles = wait_until(lambda: [s for s in otlp.spans(name="smockron.throttle", service="smockron-master")
                                        if attributes(s)["smockron.identifier_hash"] in
                                        (identifier_hash("pia"), identifier_hash("rex"))] or None, 10,
                               message="the master's throttling spans")
        a = attributes(throttles[0])
        self.assertIn(a["smockron.domain"], ("paced", "api"))
        self.assertEqual(a["smockron.source"], "accounting")
        self.assertGreaterEqual(a["smockron.delay_ms"], 0)
        # pia's and rex's first requests, and the priming ones, were forwarded: only the hold and the refusal are spans.
        self.assertEqual(len(otlp.spans(service="smockron-proxy")), 2, "a forwarded request records nothing")

        # A caller that does not sample its trace: no span (its decision is the trace's). A sampled
        # request after it is exported after it would have been (one queue, in order).
        unsampled, marker = "1" * 32, "2" * 32
        for trace, flags in ((unsampled, "00"), (marker, "01")):
            self.assertEqual(fetch(proxy.port, "/api/3", key="rex",
                                   headers=[("traceparent", f"00-{trace}-{PARENT}-{flags}")])[0].status, 429)
        wait_until(lambda: [s for s in otlp.spans() if s.trace_id.hex() == marker], 10, message="the marker's span")
        self.assertEqual([s for s in otlp.spans() if s.trace_id.hex() == unsampled], [])
        self.assertEqual(otlp.invalid, [])

    def test_http2_streams_are_traced_as_http1_requests_are(self):
        """The hold and the refusal of HTTP/2 streams (nghttp, h2c): the same spans, in the caller's trace."""
        otlp = self.receiver()
        _, _, proxy = self.stack(otlp)

        def h2(path: str, key: str, trace: str) -> str:
            p = run(["nghttp", "-nv", "-t", "20", "-H", f"x-api-key: {key}",
                     "-H", f"traceparent: 00-{trace}-{PARENT}-01", f"http://127.0.0.1:{proxy.port}{path}"])
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr)
            return re.findall(r":status: (\d+)", p.stdout)[-1]

        held_trace, refused_trace = "3" * 32, "4" * 32
        self.known(proxy, "/paced/1", "hana")
        self.assertEqual(h2("/paced/2", "hana", held_trace), "200")  # held, then sent
        self.known(proxy, "/api/1", "ivo")
        self.assertEqual(h2("/api/2", "ivo", refused_trace), "429")
        spans = wait_until(lambda: (lambda got: got if len(got) == 2 else None)(
            [s for s in otlp.spans(service="smockron-proxy") if s.trace_id.hex() in (held_trace, refused_trace)]),
            10, message="the streams' spans")
        by_trace = {s.trace_id.hex(): s for s in spans}
        self.assertEqual(by_trace[held_trace].name, "smockron.hold")
        self.assertEqual(attributes(by_trace[held_trace])["smockron.decision"], "held")
        self.assertEqual(by_trace[refused_trace].name, "smockron.refuse")
        self.assertEqual(attributes(by_trace[refused_trace])["http.response.status_code"], 429)
        for s in spans:
            self.assertEqual(s.parent_span_id.hex(), PARENT)
        self.assertEqual(otlp.invalid, [])

    def test_sampling_and_a_failing_collector_cost_spans_never_requests(self):
        otlp = self.receiver()
        _, _, proxy = self.stack(otlp, trace_sample=0.0)
        self.known(proxy, "/api/1", "sam")
        self.assertEqual(fetch(proxy.port, "/api/2", key="sam")[0].status, 429)  # not sampled: no span
        self.assertEqual(fetch(proxy.port, "/api/3", key="sam",
                               headers=[("traceparent", f"00-{TRACE}-{PARENT}-01")])[0].status, 429)
        span = wait_until(lambda: otlp.spans(service="smockron-proxy"), 10, message="the caller's sampled span")
        self.assertEqual(len(span), 1)
        self.assertEqual(span[0].trace_id.hex(), TRACE)

        otlp.fail = True
        failed = proxy.metric("smockron_proxy_trace_spans_total", {"result": "failed"}) or 0
        for n in range(4, 8):
            self.assertEqual(fetch(proxy.port, f"/api/{n}", key="sam",
                                   headers=[("traceparent", f"00-{TRACE}-{PARENT}-01")])[0].status, 429)
        proxy.wait_metric("smockron_proxy_trace_spans_total", {"result": "failed"},
                          predicate=lambda v: v >= failed + 4, timeout=10)
        self.assertEqual(fetch(proxy.port, "/paced/x", key="fresh")[0].status, 200)
        self.assertEqual(otlp.invalid, [])


if __name__ == "__main__":
    unittest.main()
