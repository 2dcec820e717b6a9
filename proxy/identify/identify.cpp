// Client identification: applies a route's identifier sources to a request
// head (the client address, header, cookie, query, bearer token, JWT claim).
// Data path: never throws, never logs secrets.
#include "proxy/identify/identify.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <algorithm>

#include "shared/base/text.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::proxy {

namespace {

constexpr std::string_view whitespace = " \t";

using http1::iequals;

template <class F>
bool for_each_header(const http1::header_list& headers, std::string_view name, F&& f) {
  return headers.for_each(name, std::forward<F>(f));
}

// What a source finds: nothing, one value, or more than one (a second field
// line, a repeated parameter or cookie). Backends disagree about which of
// several values counts (the first, the last, both joined), so the gate must
// not choose one: the request is refused.
template <class T>
struct found {
  std::optional<T> value;
  bool ambiguous = false;
  /// Takes the next value found; true (stop looking) when it is a second one.
  bool take(T v) {
    if (value) return ambiguous = true;
    value = std::move(v);
    return false;
  }
};

// The value of the only field line called `name`.
found<std::string_view> only_header(const http1::header_list& headers, std::string_view name) {
  found<std::string_view> f;
  headers.for_each(name, [&](std::string_view v) { return f.take(v); });
  return f;
}

// Value of the cookie called exactly `name` across all Cookie headers (ambiguous if there are several).
found<std::string_view> cookie_value(const http1::header_list& headers, std::string_view name) {
  found<std::string_view> f;
  for_each_header(headers, "Cookie", [&](std::string_view line) {
    while (!line.empty()) {
      const auto semi = line.find(';');
      const auto pair = line.substr(0, semi);
      line = semi == std::string_view::npos ? std::string_view{} : line.substr(semi + 1);
      const auto eq = pair.find('=');
      if (eq == std::string_view::npos) continue;
      if (trim_ows(pair.substr(0, eq)) != name) continue;
      auto value = trim_ows(pair.substr(eq + 1));
      // RFC 6265: cookie-value may be wrapped in double quotes.
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      if (f.take(value)) return true;
    }
    return false;
  });
  return f;
}

// application/x-www-form-urlencoded decoding: %XX and '+' as space. A
// malformed escape is kept literally (the value stays stable either way).
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Calls f(raw value) for each parameter of `params` ("a=1&b=2")
// whose decoded key is exactly `name` until f returns true. The value is
// nothing for a bare key ("name").
template <class F>
void for_each_param(std::string_view params, std::string_view name, F&& f) {
  while (!params.empty()) {
    const auto amp = params.find('&');
    const auto pair = params.substr(0, amp);
    params = amp == std::string_view::npos ? std::string_view{} : params.substr(amp + 1);
    const auto eq = pair.find('=');
    if (percent_decode(pair.substr(0, eq)) != name) continue;
    if (f(eq == std::string_view::npos ? std::optional<std::string_view>{} : pair.substr(eq + 1))) return;
  }
}

// The same over the target's query (a fragment, which clients should not send, is not part of it).
template <class F>
void for_each_query_param(std::string_view target, std::string_view name, F&& f) {
  target = target.substr(0, target.find('#'));
  const auto q = target.find('?');
  if (q == std::string_view::npos) return;
  for_each_param(target.substr(q + 1), name, std::forward<F>(f));
}

// Value of the query parameter whose decoded key is exactly `name` (ambiguous if repeated).
found<std::string> query_value(std::string_view target, std::string_view name) {
  found<std::string> f;
  for_each_query_param(target, name, [&](std::optional<std::string_view> raw) {
    return f.take(raw ? percent_decode(*raw) : std::string{});
  });
  return f;
}

// The credentials of "Authorization: Bearer <token>"; ambiguous when the
// request carries several Authorization fields, whatever their schemes.
found<std::string_view> bearer_token(const http1::header_list& headers) {
  found<std::string_view> f;
  const auto auth = only_header(headers, "Authorization");
  f.ambiguous = auth.ambiguous;
  if (!auth.value || auth.ambiguous) return f;
  const auto value = trim_ows(*auth.value);
  const auto space = value.find_first_of(whitespace);
  if (space == std::string_view::npos || !iequals(value.substr(0, space), "Bearer")) return f;
  const auto token = trim_ows(value.substr(space));
  if (!token.empty()) f.value = token;
  return f;
}

}  // namespace

std::string hash_secret(std::string_view secret) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(secret.data(), secret.size(), md, &md_len, EVP_sha256(), nullptr) != 1 || md_len < 16) {
    ERR_clear_error();
    return {};  // yields no identity rather than a secret
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned i = 0; i < 16; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 0xf]);
  }
  return out;
}

identification identify(const std::vector<config::identifier_source>& sources, const http1::header_list& headers,
                        std::string_view target, const ip_address& peer, const identify_context& ctx) {
  using kind = config::identifier_source::kind;
  identification out;
  try {
    static const std::vector<cidr> no_proxies;
    for (const auto& src : sources) {
      std::string value;
      bool ambiguous = false;
      switch (src.type) {
        case kind::ip:
          value = ip_identifier(
              client_address(headers, peer, ctx.trusted_proxies ? *ctx.trusted_proxies : no_proxies, ctx.chain),
              ctx.ipv6_prefix_bits);
          break;
        case kind::header: {
          const auto v = only_header(headers, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = trim_ows(*v.value);
          break;
        }
        case kind::cookie: {
          const auto v = cookie_value(headers, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = *v.value;
          break;
        }
        case kind::query: {
          auto v = query_value(target, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = std::move(*v.value);
          break;
        }
        case kind::token: {
          const auto t = bearer_token(headers);
          ambiguous = t.ambiguous;
          if (t.value) value = *t.value;
          break;
        }
        case kind::jwt: {
          if (ctx.jwt == nullptr) break;
          const auto t = bearer_token(headers);
          ambiguous = t.ambiguous;
          if (t.value) {
            if (auto v = ctx.jwt->claim(*t.value, src.name, ctx.now_s)) value = std::move(*v);
          }
          break;
        }
      }
      if (ambiguous) {
        out.ambiguous = &src;
        return out;
      }
      if (value.empty()) continue;
      // A credential, or too long for the wire: a hash still identifies the client stably.
      if (src.hash || value.size() > wire::max_identifier_bytes) value = hash_secret(value);
      if (value.empty()) continue;
      out.who = identity{std::move(value), &src};
      return out;
    }
  } catch (...) {
    // Allocation failure only; the caller treats it as "no identifier".
  }
  return out;
}

std::string redact_query(std::string_view target, std::span<const std::string> names) {
  const auto q = target.find_first_of("?#");
  if (names.empty() || q == std::string_view::npos) return std::string(target);
  // Each parameter whose decoded key is one of `names`, in the query and in a
  // fragment sent anyway: its value replaced by the hash the gate uses.
  const auto hash_at = target.find('#');
  std::vector<std::pair<std::string_view, std::string>> replace;  // raw value, its hash
  const auto collect = [&](std::string_view params) {
    for (const std::string& name : names) {
      for_each_param(params, name, [&](std::optional<std::string_view> raw) {
        if (raw && !raw->empty()) replace.emplace_back(*raw, hash_secret(percent_decode(*raw)));
        return false;
      });
    }
  };
  if (target[q] == '?') collect(target.substr(q + 1, hash_at == std::string_view::npos ? hash_at : hash_at - q - 1));
  if (hash_at != std::string_view::npos) collect(target.substr(hash_at + 1));
  if (replace.empty()) return std::string(target);
  std::sort(replace.begin(), replace.end(),
            [](const auto& a, const auto& b) { return a.first.data() < b.first.data(); });
  std::string out;
  out.reserve(target.size() + replace.size() * 48);
  const char* at = target.data();
  for (const auto& [raw, hashed] : replace) {
    if (raw.data() < at) continue;  // the same value again (a name listed twice)
    out.append(at, static_cast<std::size_t>(raw.data() - at));
    out.append(hashed);
    at = raw.data() + raw.size();
  }
  out.append(at, static_cast<std::size_t>(target.data() + target.size() - at));
  return out;
}

}  // namespace smockron::proxy
