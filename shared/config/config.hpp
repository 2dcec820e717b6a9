// Configuration of both daemons: one TOML schema (docs/configuration.md),
// parsed once into immutable structs and validated whole. Every
// error carries file:line:column and the key path; unknown keys are errors.
#pragma once

#include <algorithm>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shared/base/net.hpp"
#include "shared/base/units.hpp"
#include "shared/protocol/zmtp_curve.hpp"

namespace smockron::config {

using std::chrono::microseconds;

/// One configuration problem, located in the source.
struct error {
  std::string file;
  std::uint32_t line = 0;  ///< 0 when the problem has no single location
  std::uint32_t column = 0;
  std::string key;  ///< dotted key path, e.g. "master.domains.api.rules[0].rate"
  std::string message;
};
/// "file:line:col: key: message".
std::string format(const error& e);

/// The window of a quota rule: a calendar day, week or month, or a fixed
/// length (`per = "1h"`, windows aligned to the epoch).
enum class quota_period : std::uint8_t { day, week, month, fixed };

/// A rule: a rate with its burst ({ rate = "10/s", burst = 20 }), or a quota
/// over a calendar window ({ quota = 1000000, per = "month", tz = "+02:00" }).
struct rule_config {
  rate r;
  std::int64_t burst = 1;
  std::int64_t quota = 0;  ///< > 0: a quota rule (r and burst unused)
  quota_period per = quota_period::month;
  microseconds per_length{0};    ///< quota_period::fixed: the window's length
  std::int64_t tz_offset_s = 0;  ///< the window's local time = UTC + this (`tz`)
  bool is_quota() const { return quota > 0; }
};

/// Rules of their own for one identifier of a domain (a customer's API key
/// with a higher limit, an internal client with none).
struct override_config {
  std::string identifier;  ///< as the gatekeepers send it (a hashed source: "sha256:" + 32 hex digits)
  std::vector<rule_config> rules;
  std::int64_t concurrency = 0;  ///< its own { concurrency = N } rule; 0: none (not the domain's)
  /// Its weight in the domain's shared limits (`weight`): its max-min share is this many even ones.
  std::int64_t weight = 1;
  /// Set at run time through the master's override API, not read from the file.
  bool from_api = false;
  std::string text;  ///< from_api: the rules as the API was given them (kept in Redis)
};

/// A tier: the rules of every identifier whose requests name it (a route's
/// `tier` source: a verified JWT claim, or a header a trusted peer sets),
/// unless the identifier has an override of its own.
struct tier_config {
  std::string name;  ///< 1 to wire::max_tier_bytes of [A-Za-z0-9._-]
  std::vector<rule_config> rules;
  std::int64_t concurrency = 0;  ///< its own { concurrency = N } rule; 0: none (not the domain's)
  std::int64_t weight = 1;       ///< its clients' weight in the domain's shared limits
};

/// A domain's algorithm: the spec's sliding log, or GCRA (master/rules.hpp runs them).
enum class algorithm_kind : std::uint8_t { sliding_log, gcra };

struct domain_config {
  std::string name;
  algorithm_kind algorithm = algorithm_kind::sliding_log;
  std::vector<rule_config> rules;
  /// A { concurrency = N } rule: at most N requests of one identifier in
  /// flight across every gatekeeper (leased to them, wire_lease.hpp); 0: none.
  std::int64_t concurrency = 0;
  /// `shared = [ { concurrency = N } ]`: at most N requests of all the
  /// domain's identifiers together in flight, split max-min fairly among
  /// those that want slots; 0: none.
  std::int64_t shared_concurrency = 0;
  /// `shared = [ { rate = "1000/min", burst = 100 } ]`: at most this many
  /// units of all the domain's identifiers together, split max-min fairly
  /// among those active in the last `share_window` (master/engine/shares.hpp);
  /// nothing: none. Each identifier's own rules still apply.
  std::optional<rule_config> shared_rate;
  microseconds share_window = std::chrono::seconds(10);
  std::vector<override_config> overrides;
  /// `[master.domains.X.tiers.NAME]`, sorted by name; a request naming none
  /// of them (or no tier) has the domain's rules.
  std::vector<tier_config> tiers;  /// Envoy's rate limit services (master `rls`): the descriptor entries (RLS)
  /// or BucketId keys (RLQS) whose values, in this order, joined by
  /// `descriptor_separator`, name the identifier; empty: every entry, in the
  /// descriptor's order (a BucketId's by key). A descriptor missing one is not limited.
  std::vector<std::string> descriptor_keys;
  std::string descriptor_separator = "|";
  /// Envoy's rate limit services: `"shadow"` answers OK to every request
  /// (the would-be answer counted) and charges it, as a shadow route does.
  bool envoy_shadow = false;
  /// `admission = "exact"`: the domain's gatekeepers ask this master before
  /// each request goes (ASK, wire_lease.hpp), so that no gatekeeper admits a
  /// unit the master has not counted; "local" (the default): they decide at
  /// once, as the protocol has it, and report.
  bool exact = false;
};

/// Tiers one domain may have: each is published to every gatekeeper every second.
inline constexpr std::size_t max_tiers = 64;

/// Overrides one master may list, all domains together: each is published to
/// every gatekeeper every second, as the domains' POLICY is.
inline constexpr std::size_t max_overrides = 10'000;

enum class store_kind : std::uint8_t { memory, redis };

/// OpenTelemetry traces (both daemons; shared/daemon/tracing.hpp): the
/// collector's OTLP/HTTP URL (empty: off), the share of traces started here
/// that are recorded (a request's traceparent decides for its own), the
/// spans queued at most, and how often a batch leaves.
struct trace_config {
  std::string endpoint;
  http_url to;  ///< endpoint, parsed
  double sample = 1.0;
  std::int64_t max_queued = 10'000;
  microseconds interval = std::chrono::seconds(1);
  bool on() const { return !endpoint.empty(); }
  bool operator==(const trace_config&) const = default;
};

struct master_config {
  std::string accounting = "tcp://127.0.0.1:10004";  ///< SUB bind
  std::string control = "tcp://127.0.0.1:10005";     ///< PUB bind
  host_port admin{"127.0.0.1", 9105};
  store_kind store = store_kind::memory;
  std::string redis = "redis://127.0.0.1:6379/0";        ///< as written (for logs)
  redis_url redis_target;                                ///< parsed `redis`
  microseconds redis_timeout = std::chrono::seconds(1);  ///< connect / command timeout
  std::uint64_t max_identifiers = 1'000'000;
  /// Counters per domain of the heavy-hitters summary behind GET /top (the
  /// identifiers limited most): its memory bound, and the most /top lists.
  std::uint64_t top_identifiers = 100;
  /// `pace_share = true` (the default): a held client's DELAY_UNTIL interval
  /// is its rule's times the gatekeepers holding it
  /// (master/engine/pace_share.hpp); false, or the time an exactly logged
  /// rule's (master/engine/ingest.cpp): the rule's, as the protocol has it.
  bool pace_share = true;
  microseconds max_clock_skew = std::chrono::seconds(60);
  /// A reservation (a use reported at an estimate) not corrected by its
  /// gatekeeper within this long is given back, as when its gatekeeper's
  /// connection closes: longer than any response a route may take.
  microseconds reservation_timeout = std::chrono::minutes(10);
  /// Accounting messages held while the Redis store loads at start-up (more
  /// are dropped, counted). In normal running nothing queues in the master:
  /// it reads straight off its connections (master/io/zmtp_server.hpp).
  std::int64_t startup_backlog = 1'000'000;
  std::uint64_t max_accounting_peers = 1024;  ///< gatekeeper connections on the accounting endpoint
  std::uint64_t max_control_peers = 1024;     ///< gatekeeper connections on the control endpoint
  /// Who may connect (TCP; empty: anyone): a publisher on the accounting
  /// endpoint can get any client throttled, so list the gatekeepers' networks.
  std::vector<cidr> accounting_allow;
  std::vector<cidr> admin_allow;  ///< who may connect to the admin endpoint (empty: anyone)
  /// A file holding the admin endpoint's bearer token: the override API
  /// (PUT/GET/DELETE /overrides/DOMAIN/IDENTIFIER) exists only with it, and it
  /// guards what names identifiers (/status/DOMAIN/IDENTIFIER, /top).
  std::string admin_token_file;
  std::string admin_token;  ///< its content, read when the configuration is loaded (whitespace trimmed)
  /// Who may subscribe to control (TCP; empty: anyone): DELAY_UNTIL names the identifiers being limited.
  std::vector<cidr> control_allow;
  /// CURVE on both endpoints: the files of the master's secret keys (the
  /// first is current; a second is still accepted during a rotation) and of
  /// the gatekeepers' public keys it admits. None: plaintext (NULL).
  std::vector<std::string> curve_secret_key;
  std::string curve_allowed_keys;
  std::shared_ptr<const zmtp::curve::server_keys> curve;  ///< the keys, read when the configuration is loaded
  /// The UDP query endpoint (the UDP rate limiter's protocol); none: off.
  std::optional<host_port> query;
  /// Who may send queries (empty: anyone): an over_limit records a use, so list the clients' networks.
  std::vector<cidr> query_allow;
  /// The gRPC endpoint of Envoy's rate limit services (RLS v3 and RLQS,
  /// master/envoy/); none: off.
  std::optional<host_port> rls;
  /// Who may call it (empty: anyone): a call charges uses, so list the data planes' networks.
  std::vector<cidr> rls_allow;
  /// RLS: a request for a domain this master does not have is answered OK
  /// (allow) or OVER_LIMIT (deny); counted either way.
  bool rls_deny_unknown = false;
  /// RLQS: buckets one stream may report (more are answered with abandon_action, counted).
  std::uint64_t rlqs_max_buckets = 100'000;
  std::int64_t control_hwm = 1'000'000;  ///< messages queued per control subscriber at most (0: no limit)
  microseconds sweep_interval = std::chrono::milliseconds(10);  ///< expiry sweep tick
  std::string log_level;                                        ///< empty = CLI / default
  trace_config trace;
  std::vector<domain_config> domains;  ///< sorted by name

  const domain_config* find_domain(std::string_view name) const;
};

/// An override's rules as the override API takes them: a TOML document
/// `rules = [ ... ]` (what an `overrides` entry's `rules` holds in the
/// configuration file, checked the same way). The override, or the first
/// problem as text ("rules[0].burst: must be between 1 and 1000000").
std::variant<override_config, std::string> parse_override_rules(std::string_view identifier, std::string_view text);

struct identifier_source {
  enum class kind : std::uint8_t { ip, header, cookie, query, token, jwt };
  kind type = kind::ip;
  std::string name;  ///< header/cookie/query name or JWT claim
  /// The value is used, logged and sent only as "sha256:" + 32 hex digits:
  /// credentials (API keys, session cookies) never appear in clear in logs,
  /// accounting, Redis or /status. On by default for `token`.
  bool hash = false;
  friend bool operator==(const identifier_source&, const identifier_source&) = default;
};
/// "ip", "header:X-API-Key", "cookie:session", "query:key", "token", "jwt:sub"
/// (`hash` as the kind's default).
std::optional<identifier_source> parse_identifier_source(std::string_view text);
std::string to_string(const identifier_source& s);

struct upstream_config {
  std::string name;
  std::vector<host_port> servers;
  microseconds fail_timeout = std::chrono::seconds(10);  ///< how long a failing server is marked down
  std::int64_t keepalive = 64;                           ///< idle pooled connections per server address per worker
  bool tls = false;                                      ///< HTTPS to the servers
  std::string tls_ca;                                    ///< PEM CA bundle; empty: the system's trust store
  bool tls_verify = true;                                ///< the server's certificate chain and name are checked
  /// SNI and the name checked; empty: each server's own host (a name is sent
  /// as SNI; an IP literal is checked against the certificate's IP addresses).
  std::string tls_server_name;
  std::string tls_client_cert, tls_client_key;  ///< PEM: a client certificate, when the servers ask for one
  /// What the servers speak: HTTP/1.1, HTTP/2 in the clear with prior
  /// knowledge (h2c: gRPC servers), or HTTP/2 over TLS chosen by ALPN (h2; implies tls).
  enum class protocol_kind : std::uint8_t { http1, h2c, h2 };
  protocol_kind protocol = protocol_kind::http1;
  /// HTTP/2: streams at once on one connection at most (the server's
  /// SETTINGS_MAX_CONCURRENT_STREAMS may lower it); more open another connection.
  std::int64_t max_streams = 100;
  bool http2() const { return protocol != protocol_kind::http1; }
};

struct route_config {
  std::string host = "*";  ///< exact, "*", or "*.suffix"
  std::string path = "/";  ///< prefix
  /// Empty: the route is not limited (forwarded with no gate and no accounting, counted as exempt).
  std::string domain;
  std::string upstream;
  /// Status of a limit rejection (delay over max_delay): the spec's 503, or 429 as
  /// Envoy, Traefik and Kong answer. A full queue of held requests is 503 whatever this says.
  std::int64_t status = 503;
  std::optional<microseconds> max_delay;  ///< overrides [proxy] max_delay for this route
  std::optional<std::int64_t> max_held;   ///< this route's held requests at most (the global max_held still holds)
  /// shadow: the gate decides and the would-be decision is counted, but nothing is held or rejected.
  enum class route_mode : std::uint8_t { enforce, shadow };
  route_mode mode = route_mode::enforce;
  std::vector<cidr> exempt;  ///< clients (as the `ip` identifier resolves them) forwarded unlimited
  /// RateLimit-Policy and RateLimit fields on every response of the route, not
  /// only on rejections and delayed responses (where they always are).
  bool ratelimit_headers = false;
  bool explain = false;  ///< a Smockron-Decision field on responses (debugging)
  /// The grpc-status of a gRPC call refused for its limit: 8 RESOURCE_EXHAUSTED
  /// (as Envoy answers), or 14 UNAVAILABLE, which gRPC clients retry by default.
  std::int64_t grpc_status = 8;
  std::vector<identifier_source> identify{{identifier_source::kind::ip, {}}};
  /// A request no source identifies: limited with every other such request of
  /// the domain under one shared identifier ("-"; routes of one domain share it),
  /// refused (403), or passed unlimited.
  enum class unidentified_action : std::uint8_t { shared, reject, allow };
  unidentified_action unidentified = unidentified_action::shared;
  /// What one request of the route uses of its domain's limits, in units:
  /// a constant (`cost = 5`), a request field (`"header:X-Cost"`), the request
  /// body's size (`"request_bytes"`), or a response field or trailer
  /// (`"response_header:X-Tokens-Used"`, charged when the response ends).
  struct cost_source {
    /// json_body: a number in the JSON request body (`cost_estimate = "json:FIELD"` only).
    enum class kind : std::uint8_t { constant, header, request_bytes, response_header, json_body };
    kind type = kind::constant;
    std::int64_t units = 1;  ///< constant
    std::string field;       ///< header, response_header: the field's name, lower-case; json_body: the member's name
    /// Known only once the request is done: an estimate is reserved at admission and corrected then.
    bool after_response() const { return type == kind::response_header; }
  };
  cost_source cost;
  /// What a response_header cost reserves at admission (`cost_estimate`): a
  /// constant, a request field or a number in the JSON request body (kind
  /// constant, header or json_body); nothing: cost_default. Charged as a
  /// known cost, corrected when the real one is known. A request_bytes
  /// cost's: a constant, what a body without a length reserves (nothing: it
  /// reserves none, and is accounted when relayed).
  std::optional<cost_source> cost_estimate;
  std::int64_t cost_max = 1'000'000;  ///< a larger cost is charged as this (counted)
  std::int64_t cost_default = 1;      ///< the charge of a cost that is missing or malformed (counted)
  /// Where a request's tier comes from (`tier = "jwt:plan"` or
  /// `"header:X-Plan"`): its value names one of the domain's tiers on the
  /// master, whose rules then apply to the client. Nothing: no tier.
  std::optional<identifier_source> tier;
};

struct jwt_config {
  std::string hs256_secret;     ///< HMAC secret; empty = none
  std::string public_key_file;  ///< PEM RSA or EC public key (RS256 / ES256); empty = none
  /// JSON Web Key Set (RFC 7517): RSA, EC P-256 and oct keys, chosen by `kid`;
  /// read again on reload (SIGHUP), as the identity provider rotates keys.
  std::string jwks_file;
  std::string issuer;    ///< non-empty: the `iss` claim must equal it
  std::string audience;  ///< non-empty: the `aud` claim must be or contain it
  microseconds leeway = std::chrono::seconds(30);
  bool verify() const { return !hs256_secret.empty() || !public_key_file.empty() || !jwks_file.empty(); }
};

struct proxy_config {
  host_port listen{"0.0.0.0", 8080};
  host_port admin{"127.0.0.1", 9106};
  std::int64_t threads = 0;  ///< 0 = one per core
  std::vector<std::string> accounting{"tcp://127.0.0.1:10004"};
  std::vector<std::string> control{"tcp://127.0.0.1:10005"};
  /// Masters named by DNS (dns+tcp:// or srv+tcp:// endpoints above): the
  /// servers asked ("ip" or "ip:port"; empty: /etc/resolv.conf's), the bounds
  /// on how long an answer is used before it is asked again (its TTL, within
  /// [min, max]; a failed lookup is retried after min), and how many masters
  /// one name may stand for at most.
  std::vector<std::string> dns_servers;
  microseconds dns_min_ttl = std::chrono::seconds(1);
  microseconds dns_max_ttl = std::chrono::seconds(60);
  std::int64_t dns_max_masters = 64;
  /// Whether an accounting or control endpoint is a DNS name for masters.
  bool discovers_masters() const;
  /// CURVE on the links to the masters: the file of the gatekeeper's secret
  /// key, and each endpoint's master key (a file or the Z85 key; one for all,
  /// or one per endpoint). None: plaintext (NULL).
  std::string curve_secret_key;
  std::map<std::string, std::string, std::less<>> curve_master_key;  ///< endpoint -> key ("" = every endpoint)
  /// The keys of each accounting and control endpoint, read when the configuration is loaded.
  std::map<std::string, std::shared_ptr<const zmtp::curve::client_keys>, std::less<>> curve;
  /// The keys for `endpoint` (null: plaintext).
  std::shared_ptr<const zmtp::curve::client_keys> curve_for(std::string_view endpoint) const {
    const auto it = curve.find(endpoint);
    return it == curve.end() ? nullptr : it->second;
  }
  microseconds max_delay = std::chrono::seconds(5);
  std::int64_t max_held = 10'000;
  std::vector<cidr> trusted_proxies;
  /// The header trusted proxies name the client in: X-Forwarded-For, or RFC 7239
  /// Forwarded (`for=`; a Forwarded element for this hop is then added too).
  /// Only one is believed: a client could add the other itself.
  enum class real_ip_header_kind : std::uint8_t { x_forwarded_for, forwarded };
  real_ip_header_kind real_ip_header = real_ip_header_kind::x_forwarded_for;
  std::vector<cidr> admin_allow;  ///< who may connect to the admin endpoint (empty: anyone)
  /// Every client connection starts with a PROXY protocol header (v1 or v2,
  /// as AWS NLB or HAProxy send it): the client it names is the peer.
  bool proxy_protocol = false;
  microseconds header_timeout = std::chrono::seconds(10);
  microseconds body_timeout = std::chrono::seconds(60);
  microseconds idle_timeout = std::chrono::seconds(60);
  microseconds connect_timeout = std::chrono::seconds(2);
  /// Upstream names are resolved again this often, and soon after a connect
  /// fails; 0: resolved once (start-up and reload).
  microseconds resolve_interval = std::chrono::seconds(30);
  microseconds upstream_timeout = std::chrono::seconds(60);
  microseconds grace_period = std::chrono::seconds(10);
  std::uint64_t max_header_bytes = 16 * 1024;
  std::uint64_t max_body_bytes = 0;  ///< 0 = unlimited (bodies are streamed)
  /// How much of a request body is read before admission to find a
  /// `cost_estimate = "json:FIELD"` (less than an HTTP/2 stream's window).
  std::uint64_t cost_estimate_bytes = 16 * 1024;
  double rejected_sample = 1.0;  ///< fraction of REJECTED accounting sent (0 = off)
  bool access_log = false;
  enum class access_log_format_kind : std::uint8_t { text, json };
  access_log_format_kind access_log_format = access_log_format_kind::text;
  std::string access_log_path;  ///< empty: stdout; a file is reopened on SIGUSR1 (log rotation)
  /// `ip` identifiers of IPv6 clients: the /N network (one client commonly owns a /64).
  std::int64_t ipv6_prefix = 64;
  /// Paths are normalized before route matching (RFC 3986 6.2.2: unreserved
  /// escapes decoded, dot-segments removed) and forwarded normalized.
  bool normalize_path = true;
  bool merge_slashes = true;  ///< "//" counts as "/" (with normalize_path)
  /// %2F and %5C in a path (with normalize_path): refused with 400, kept encoded, or decoded.
  enum class escaped_slashes_action : std::uint8_t { reject, keep, unescape };
  escaped_slashes_action escaped_slashes = escaped_slashes_action::reject;
  /// Segment parameters (";x" in "/api;x/a"): routes always match the path
  /// without them; this chooses what is forwarded: the path as sent, the
  /// path without them, or nothing (400).
  enum class path_parameters_action : std::uint8_t { keep, strip, reject };
  path_parameters_action path_parameters = path_parameters_action::keep;
  /// Refuse (503, Retry-After 1) requests of a route whose domain no master
  /// covers (no POLICY for it within wire::policy_fresh_ms) instead of passing them.
  bool fail_closed = false;
  std::int64_t accounting_hwm = 100'000;  ///< accounting messages queued per master per worker at most (0 = unbounded)
  /// ACCEPTED and REJECTED accounting is sent in batches at most this old
  /// (or of 256 messages); DELAYED goes at once. Longer = fewer wake-ups of
  /// the master, later reaction to a new client's burst.
  microseconds accounting_flush = std::chrono::milliseconds(2);
  std::int64_t max_control_entries = 1'000'000;  ///< control memory bound; beyond it updates are dropped (fail-open)
  microseconds control_fresh = std::chrono::seconds(2);  ///< local pacing needs a master update this recent
  jwt_config jwt;
  /// TLS on the listener when both are set: the certificate chain and its key (PEM).
  std::string tls_cert, tls_key;
  /// More certificates: each is chosen when a client's SNI names one of its
  /// names (subject alternative names, wildcards included); tls_cert otherwise.
  struct tls_certificate {
    std::string cert, key;
  };
  std::vector<tls_certificate> tls_sni;
  /// Clients may resume a TLS session (tickets, and a session cache for
  /// TLS 1.2 session ids) instead of a full handshake.
  bool tls_session_resumption = true;
  /// HTTP/2 (RFC 9113) on the listener: offered first in ALPN over TLS, and
  /// recognized by its connection preface in the clear (prior knowledge).
  bool http2 = true;
  /// HTTP/2 bounds per client connection (defaults: nginx's stream limit, nghttp2's reset limit).
  std::int64_t http2_max_concurrent_streams = 128;  ///< SETTINGS_MAX_CONCURRENT_STREAMS; more are refused
  /// Streams the client resets (RST_STREAM): a token bucket of this burst,
  /// refilled at this rate per second; past it GOAWAY (Rapid Reset, CVE-2023-44487).
  std::int64_t http2_reset_burst = 1000, http2_reset_rate = 33;
  /// Frames that carry no request (SETTINGS, PING, PRIORITY, empty DATA, and
  /// WINDOW_UPDATE beyond what the proxy's DATA earned): the same kind of bucket.
  std::int64_t http2_control_burst = 1000, http2_control_rate = 100;
  std::int64_t http2_max_continuations = 8;  ///< CONTINUATION frames in one header block at most
  bool tls() const { return !tls_cert.empty(); }
  std::string log_level;
  trace_config trace;
  std::vector<upstream_config> upstreams;
  std::vector<route_config> routes;
  /// A domain split across masters by identifier: each accounting message of
  /// `domain` goes only to the share that owns its identifier (consistent
  /// hashing); a share is one master, or several redundant ones. Every
  /// endpoint is one of `accounting`.
  struct shard_config {
    std::string domain;
    std::vector<std::vector<std::string>> shares;
    bool operator==(const shard_config&) const = default;
  };
  std::vector<shard_config> shards;

  const upstream_config* find_upstream(std::string_view name) const;
};

struct config {
  std::string source;  ///< file the config came from ("<defaults>" when none)
  std::optional<master_config> master;
  std::optional<proxy_config> proxy;
};

struct load_result {
  std::optional<config> cfg;  ///< set only when there are no errors
  std::vector<error> errors;
};

/// Parses and validates a file.
load_result load_file(const std::string& path);
/// Parses and validates TOML text; `source_name` is used in error locations.
load_result load_string(std::string_view text, const std::string& source_name);

/// What is valid but unsafe: the links between daemons in plaintext on a
/// network (an accounting or control endpoint that is not loopback or IPC,
/// with no CURVE keys), a CURVE secret key file its group or others can read.
/// One line each; --check and the start-up log print them.
std::vector<std::string> warnings(const config& c);

/// Settings a reload cannot change (sockets, threads, stores): both daemons
/// keep their running values in the new configuration and name the keys
/// that differed, for the log. `keep(&Config::member, "key")` for each.
template <class Config>
class restart_only {
public:
  restart_only(const Config& running, Config& next) : running_(running), next_(next) {}
  template <class Member>
  restart_only& keep(Member Config::*member, std::string_view key) {
    if (next_.*member == running_.*member) return *this;
    next_.*member = running_.*member;
    if (std::find(changed_.begin(), changed_.end(), key) == changed_.end()) changed_.push_back(key);
    return *this;
  }
  /// The keys whose new values wait for a restart ("listen, threads"); empty: none.
  std::string changed() const {
    std::string out;
    for (const auto key : changed_) out.append(out.empty() ? "" : ", ").append(key);
    return out;
  }

private:
  const Config& running_;
  Config& next_;
  std::vector<std::string_view> changed_;
};

}  // namespace smockron::config
