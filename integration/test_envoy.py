"""Envoy's rate limit services on the master, with the real binaries and a
real gRPC client (Debian's python3-grpcio; stubs generated at test time from
master/envoy/proto by Debian's protoc, lib/envoy_stubs.py), reproducing the
request shapes Envoy sends:

- RLS (ShouldRateLimit): several descriptors, each naming an identifier by
  the domain's descriptor_keys; hits_addend on the request and on a
  descriptor (its presence, not its value, counts); all or nothing (a
  refused descriptor charges none); the limit that decides, the units left,
  the RateLimit fields and Retry-After; an unknown domain allowed or denied;
  no descriptor: INVALID_ARGUMENT; shadow mode;
- one budget: a key limited through RLS is then held by smockron-proxy, and
  one limited through smockron-proxy is refused through RLS; refusals show
  in /status and /top;
- RLQS (StreamRateLimitQuotas): one bucket reported at once, then periodic
  reports of all buckets; a token bucket of the rule, DENY_ALL once the
  identifier is throttled (its TTL the time until it is free); a bucket of
  another domain, or naming no identifier, abandoned; a BucketId's key order
  does not matter; time_elapsed 0 accepted; a closed and reopened stream;
  two streams on one identifier share its rate, split by what each stream's
  Envoy is asked for (an idle one keeps only a floor); a quota with fewer
  units left than the bucket holds is the bucket.

Rates are a few per minute or slower, so that what passes depends on
counts, not on how fast the calls come (a sanitizer build is slow).

Run: cd integration && /usr/bin/python3 -m unittest -v test_envoy
"""
from __future__ import annotations

import json
import os
import queue
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib import envoy_stubs  # noqa: E402  (puts Debian's grpcio on the path)
import grpc  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc = envoy_stubs.load()
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit
DOMAIN = "api"


def request(domain: str, descriptors: list, hits: int | None = None):
    """descriptors: [[(key, value), ...] or ([(key, value), ...], hits_addend)]."""
    req = rls_pb2.RateLimitRequest(domain=domain)
    if hits is not None:
        req.hits_addend = hits
    for d in descriptors:
        entries, own = (d, None) if isinstance(d, list) else d
        desc = req.descriptors.add()
        for k, v in entries:
            desc.entries.add(key=k, value=v)
        if own is not None:
            desc.hits_addend.value = own
    return req


class EnvoyCase(DaemonTestCase):
    def start(self, domains: dict, **keys):
        self.master = self.start_master(domains, rls="127.0.0.1:0", **keys)
        channel = grpc.insecure_channel(f"127.0.0.1:{self.master.rls_port()}")
        self.addCleanup(channel.close)
        self.rls = rls_pb2_grpc.RateLimitServiceStub(channel)
        self.rlqs = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)

    def ask(self, *args, **kw):
        return self.rls.ShouldRateLimit(request(*args, **kw), timeout=5)

    def codes(self, n: int, key: str, **kw) -> list:
        return [self.ask(DOMAIN, [[("api_key", key)]], **kw).overall_code for _ in range(n)]

    def status_of(self, identifier: str, domain: str = DOMAIN) -> dict:
        with urllib.request.urlopen(f"http://{HOST}:{self.master.admin_port}/status/{domain}/{identifier}",
                                    timeout=5) as r:
            return json.loads(r.read())

    def metric(self, name: str, **labels) -> float:
        return self.master.metric(name, labels or None)


class TestRls(EnvoyCase):
    def test_descriptors_name_identifiers_and_hits_are_charged_until_they_no_longer_fit(self):
        self.start({DOMAIN: {"rules": [("5/min", 5)], "descriptor_keys": ["api_key"]}})
        self.assertEqual(self.codes(6, "k1"), [OK] * 5 + [OVER])
        r = self.ask(DOMAIN, [[("path", "/x"), ("api_key", "k1")]])  # other entries around the key
        self.assertEqual(r.overall_code, OVER)
        st = r.statuses[0]
        self.assertEqual((st.code, st.current_limit.requests_per_unit, st.current_limit.unit, st.current_limit.name,
                          st.limit_remaining), (OVER, 5, Unit.MINUTE, DOMAIN, 0))
        self.assertGreaterEqual(st.duration_until_reset.seconds, 1)
        headers = {h.key: h.value for h in r.response_headers_to_add}
        self.assertEqual(headers["RateLimit-Policy"], '"api";q=5;w=60')
        self.assertTrue(headers["RateLimit"].startswith('"api";r=0;t='), headers)
        self.assertIn(int(headers["Retry-After"]), range(1, 13))  # one unit back 12 s after the last
        # The request's hits_addend is each descriptor's cost; 0 means 1.
        self.assertEqual(self.codes(1, "k2", hits=3), [OK])
        self.assertEqual(self.codes(1, "k2", hits=3), [OVER])  # 3 + 3 > 5: refused, not charged
        self.assertEqual(self.codes(2, "k2", hits=0), [OK, OK])
        self.assertEqual(self.status_of("k2")["rules"][0]["used"], 5)
        # A cost over the burst can never fit: refused, nothing charged, no Retry-After.
        r = self.ask(DOMAIN, [[("api_key", "k3")]], hits=6)
        self.assertEqual(r.overall_code, OVER)
        self.assertNotIn("Retry-After", {h.key for h in r.response_headers_to_add})
        self.assertEqual(self.codes(5, "k3"), [OK] * 5)

    def test_all_or_nothing_per_descriptor_hits_and_unidentified_descriptors(self):
        self.start({DOMAIN: {"rules": [("5/min", 5)], "descriptor_keys": ["api_key"]}})
        self.assertEqual(self.codes(5, "full"), [OK] * 5)
        # Two descriptors: one refused, so the other is not charged either.
        r = self.ask(DOMAIN, [[("api_key", "free")], [("api_key", "full")]])
        self.assertEqual([s.code for s in r.statuses], [OK, OVER])
        self.assertEqual(r.overall_code, OVER)
        self.assertEqual(self.status_of("free")["tracked"], False)
        # A descriptor's own hits_addend wins over the request's, when present, even at 0 (a look only).
        r = self.ask(DOMAIN, [([("api_key", "own")], 4), ([("api_key", "own0")], 0)], hits=2)
        self.assertEqual(r.overall_code, OK)
        self.assertEqual(self.status_of("own")["rules"][0]["used"], 4)
        self.assertEqual(self.status_of("own0")["tracked"], False)
        # A descriptor without the key names nobody: not limited, counted.
        r = self.ask(DOMAIN, [[("remote_address", "10.0.0.1")]])
        self.assertEqual((r.overall_code, r.statuses[0].code), (OK, OK))
        self.assertFalse(r.statuses[0].HasField("current_limit"))
        self.assertEqual(self.metric("smockron_master_rls_unidentified_descriptors_total"), 1)

    def test_default_keys_separator_quotas_and_several_rules(self):
        self.start({DOMAIN: {"rules": [("5/min", 5), ("10/h", 10), {"quota": 7, "per": "day"}],
                             "descriptor_separator": "/"}})
        self.assertEqual([self.ask(DOMAIN, [[("user", "u"), ("path", "p")]]).overall_code for _ in range(5)],
                         [OK] * 5)
        self.assertEqual(self.status_of("u/p")["rules"][0]["used"], 5)
        r = self.ask(DOMAIN, [[("user", "u"), ("path", "p")]])
        self.assertEqual(r.overall_code, OVER)
        # The quota has 2 left, the burst 0: the burst decides.
        self.assertEqual((r.statuses[0].current_limit.name, r.statuses[0].limit_remaining), ("api-1", 0))
        policy = {h.key: h.value for h in r.response_headers_to_add}["RateLimit-Policy"]
        self.assertEqual(policy, '"api-1";q=5;w=60, "api-2";q=10;w=3600, "api-3";q=7;w=86400')

    def test_unknown_domain_invalid_request_and_shadow(self):
        self.start({DOMAIN: {"rules": [("1/min", 1)], "envoy_mode": "shadow"}}, rls_unknown_domain="deny")
        r = self.ask("elsewhere", [[("a", "b")], [("c", "d")]])
        self.assertEqual((r.overall_code, [s.code for s in r.statuses]), (OVER, [OVER, OVER]))
        self.assertEqual(self.metric("smockron_master_rls_requests_total", code="unknown_domain"), 1)
        with self.assertRaises(grpc.RpcError) as e:
            self.rls.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=DOMAIN), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # Shadow: every request answered OK and charged; the would-be refusals counted.
        self.assertEqual([self.ask(DOMAIN, [[("k", "s")]]).overall_code for _ in range(3)], [OK] * 3)
        self.assertEqual(self.metric("smockron_master_rls_requests_total", code="shadow_over_limit"), 2)
        self.assertEqual(self.metric("smockron_master_rls_requests_total", code="ok"), 3)
        self.assertEqual(self.status_of("s")["rules"][0]["used"], 3)


class TestOneBudget(EnvoyCase):
    def test_rls_and_the_proxy_share_one_state(self):
        domains = {DOMAIN: {"rules": [("1/min", 3)], "descriptor_keys": ["api_key"]}}
        self.master, _, self.proxy = self.gate_stack(
            domains, [{"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                       "status": 429, "max_delay": "100ms"}], master_keys={"rls": "127.0.0.1:0"})
        channel = grpc.insecure_channel(f"127.0.0.1:{self.master.rls_port()}")
        self.addCleanup(channel.close)
        self.rls = rls_pb2_grpc.RateLimitServiceStub(channel)
        # Limited through RLS, then held by the proxy (the DELAY_UNTIL the RLS use published).
        self.assertEqual(self.codes(4, "via-rls"), [OK] * 3 + [OVER])
        wait_until(lambda: fetch(self.proxy.port, "/", key="via-rls")[0].status == 429, 10,
                   message="the proxy refuses a key RLS used up")
        # Used up through the proxy, then refused through RLS.
        self.assertEqual([fetch(self.proxy.port, "/", key="via-proxy")[0].status for _ in range(3)], [200] * 3)
        wait_until(lambda: self.status_of("via-proxy")["rules"][0]["used"] >= 3, 10,
                   message="the proxy's accounting reached the master")
        self.assertEqual(self.codes(1, "via-proxy"), [OVER])
        # Refusals through RLS show in /top.
        with urllib.request.urlopen(f"http://{HOST}:{self.master.admin_port}/top?domain={DOMAIN}", timeout=5) as r:
            top = json.loads(r.read())
        self.assertIn("via-rls", json.dumps(top))


class TestRlqs(EnvoyCase):
    def stream(self):
        """A stream: (send(report), next_response(), close())."""
        q: queue.Queue = queue.Queue()

        def gen():
            while True:
                item = q.get()
                if item is None:
                    return
                yield item

        responses = self.rlqs.StreamRateLimitQuotas(gen(), timeout=30)
        self.addCleanup(lambda: (q.put(None), responses.cancel()))
        return q.put, lambda: next(responses), lambda: q.put(None), responses

    @staticmethod
    def report(domain: str, buckets: list, elapsed_s: int = 1):
        """buckets: [({key: value}, allowed, denied)]."""
        r = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
        for bucket, allowed, denied in buckets:
            u = r.bucket_quota_usages.add(num_requests_allowed=allowed, num_requests_denied=denied)
            u.bucket_id.bucket.update(bucket)
            u.time_elapsed.seconds = elapsed_s
        return r

    @staticmethod
    def actions(resp) -> dict:
        out = {}
        for a in resp.bucket_action:
            key = tuple(sorted(a.bucket_id.bucket.items()))
            if a.HasField("abandon_action"):
                out[key] = ("abandon",)
                continue
            qa = a.quota_assignment_action
            s = qa.rate_limit_strategy
            ttl = qa.assignment_time_to_live.seconds
            if s.HasField("token_bucket"):
                tb = s.token_bucket
                out[key] = ("token_bucket", tb.max_tokens, tb.tokens_per_fill.value, tb.fill_interval.seconds, ttl)
            else:
                out[key] = ("deny" if s.blanket_rule == 1 else "allow", ttl)
        return out

    def test_usage_is_charged_and_answered_with_the_rule_then_deny_all(self):
        self.start({DOMAIN: {"rules": [("60/min", 10)], "descriptor_keys": ["api_key"]},
                    "open": {"rules": [{"concurrency": 4}]}})
        send, recv, close, _ = self.stream()
        a = {"api_key": "a", "route": "x"}
        # First sight of a bucket: reported at once, nothing allowed yet (time_elapsed 0 accepted).
        send(self.report(DOMAIN, [(a, 0, 0)], elapsed_s=0))
        self.assertEqual(self.actions(recv()), {(("api_key", "a"), ("route", "x")): ("token_bucket", 10, 1, 1, 2)})
        # Periodic reports of all buckets; key order does not matter; another domain's bucket
        # and one that names no identifier are abandoned; a domain without rate rules: ALLOW_ALL.
        b = {"route": "x", "api_key": "b"}
        send(self.report(DOMAIN, [(a, 4, 0), (b, 1, 0), ({"user": "n"}, 3, 0)]))
        got = self.actions(recv())
        self.assertEqual(got[(("api_key", "a"), ("route", "x"))], ("token_bucket", 10, 1, 1, 3))
        self.assertEqual(got[(("api_key", "b"), ("route", "x"))], ("token_bucket", 10, 1, 1, 3))
        self.assertEqual(got[(("user", "n"),)], ("abandon",))
        send(self.report("elsewhere", [(a, 1, 0)]))
        self.assertEqual(self.actions(recv()), {(("api_key", "a"), ("route", "x")): ("abandon",)})
        send(self.report("open", [({"api_key": "o"}, 2, 0)]))
        self.assertEqual(self.actions(recv()), {(("api_key", "o"),): ("allow", 3)})
        self.assertEqual(self.status_of("a")["rules"][0]["used"], 4)
        # Over its burst: throttled, DENY_ALL until it is free; the denials counted.
        send(self.report(DOMAIN, [(a, 9, 5), (b, 0, 0)]))
        got = self.actions(recv())
        self.assertEqual(got[(("api_key", "a"), ("route", "x"))][0], "deny")
        self.assertGreaterEqual(got[(("api_key", "a"), ("route", "x"))][1], 1)
        self.assertEqual(got[(("api_key", "b"), ("route", "x"))][0], "token_bucket")
        st = self.status_of("a")
        self.assertTrue(st["throttled"])
        close()
        wait_until(lambda: self.metric("smockron_master_rlqs_streams") == 0, 10, message="the stream ended")
        self.assertEqual(self.metric("smockron_master_rlqs_buckets"), 0)
        # Reopened: the same identifier is still throttled (its state is the master's, not the stream's).
        send2, recv2, _, _ = self.stream()
        send2(self.report(DOMAIN, [(a, 0, 0)]))
        self.assertEqual(self.actions(recv2())[(("api_key", "a"), ("route", "x"))][0], "deny")

    def test_two_streams_on_one_identifier_share_its_rate(self):
        self.start({DOMAIN: {"rules": [("60/min", 10)], "descriptor_keys": ["api_key"]}})
        s1, r1, _, _ = self.stream()
        s2, r2, _, _ = self.stream()
        k = {"api_key": "shared"}
        s1(self.report(DOMAIN, [(k, 0, 0)]))
        self.assertEqual(self.actions(r1())[(("api_key", "shared"),)][:4], ("token_bucket", 10, 1, 1))
        s2(self.report(DOMAIN, [(k, 0, 0)]))
        # Half each: 5 tokens, one every 2 s.
        self.assertEqual(self.actions(r2())[(("api_key", "shared"),)][:4], ("token_bucket", 5, 1, 2))

    def test_a_quota_nearly_used_up_is_the_bucket(self):
        # 7 a day beside a rule whose bucket holds 100: once fewer than 100 are
        # left, Envoy's bucket is what is left (not refilled within the TTL), so
        # what it lets through before its next report cannot pass the quota.
        self.start({DOMAIN: {"rules": [("600/min", 100), {"quota": 7, "per": "day"}],
                             "descriptor_keys": ["api_key"]}})
        send, recv, _, _ = self.stream()
        k = {"api_key": "daily"}
        key = (("api_key", "daily"),)
        send(self.report(DOMAIN, [(k, 0, 0)], elapsed_s=0))
        self.assertEqual(self.actions(recv())[key][:4], ("token_bucket", 7, 1, 3600))
        send(self.report(DOMAIN, [(k, 5, 0)]))
        self.assertEqual(self.actions(recv())[key][:4], ("token_bucket", 2, 1, 3600))
        send(self.report(DOMAIN, [(k, 2, 0)]))
        self.assertEqual(self.actions(recv())[key][0], "deny", "used up: throttled until the day ends")

    def test_the_rate_goes_to_the_stream_whose_envoy_gets_the_requests(self):
        # Envoy reports every bucket it made, used or not: a stream that saw a
        # key once keeps reporting it. The split follows what each is asked for
        # (allowed and denied a second), not the count of streams.
        self.start({DOMAIN: {"rules": [("600/min", 100)], "descriptor_keys": ["api_key"]}})
        s1, r1, _, _ = self.stream()
        s2, r2, _, _ = self.stream()
        k = {"api_key": "moving"}
        key = (("api_key", "moving"),)
        s1(self.report(DOMAIN, [(k, 0, 0)], elapsed_s=0))
        r1()
        s2(self.report(DOMAIN, [(k, 0, 0)], elapsed_s=0))
        self.assertEqual(self.actions(r2())[key][:4], ("token_bucket", 50, 5, 1), "nothing known yet: half each")
        # Only the first Envoy gets the key's requests: 30 a second, 5 let through (25 units in all,
        # within the burst, so no refill decides anything).
        for _ in range(2):
            s1(self.report(DOMAIN, [(k, 5, 25)]))
            hot = self.actions(r1())[key]
            s2(self.report(DOMAIN, [(k, 0, 0)]))
            idle = self.actions(r2())[key]
        # 95% where the requests are; the idle one keeps its floor (10% split among the streams).
        self.assertEqual(hot[:4], ("token_bucket", 95, 19, 2), "the rule where the requests are")
        self.assertEqual(idle[:4], ("token_bucket", 5, 1, 2), "the idle stream keeps only its floor")
        # The requests spread to the second Envoy too: half each.
        s2(self.report(DOMAIN, [(k, 5, 25)]))
        self.assertEqual(self.actions(r2())[key][:4], ("token_bucket", 50, 5, 1))
        s1(self.report(DOMAIN, [(k, 5, 25)]))
        self.assertEqual(self.actions(r1())[key][:4], ("token_bucket", 50, 5, 1))


if __name__ == "__main__":
    unittest.main()
