// Reading TOML into configuration structs, for the config readers only: a `sink`
// that collects every error with its file:line:column and key path, and a
// `reader` per table that reads typed keys and reports unknown ones.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "shared/config/config.hpp"

namespace smockron::config::detail {

inline std::string_view type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

// Collects errors for one source file.
class sink {
public:
  explicit sink(std::string file) : file_(std::move(file)) {}

  void add(const toml::source_region& where, std::string key, std::string message) {
    errors_.push_back({file_, where.begin.line, where.begin.column, std::move(key), std::move(message)});
  }
  void add(const toml::node& where, std::string key, std::string message) {
    add(where.source(), std::move(key), std::move(message));
  }
  std::vector<error>& errors() { return errors_; }

private:
  std::string file_;
  std::vector<error> errors_;
};

// Reads the keys of one table, remembering which ones were consumed so that
// finish() can report the unknown ones.
class reader {
public:
  reader(const toml::table& t, std::string path, sink& s) : table_(t), path_(std::move(path)), sink_(s) {}
  reader(const reader&) = delete;
  reader& operator=(const reader&) = delete;
  ~reader() { finish(); }

  std::string key(std::string_view k) const { return path_.empty() ? std::string(k) : path_ + "." + std::string(k); }
  /// The table's own key path ("proxy.tls_sni[0]").
  const std::string& path() const { return path_; }
  const toml::table& table() const { return table_; }
  sink& errors() { return sink_; }

  const toml::node* get(std::string_view k) {
    known_.insert(std::string(k));
    return table_.get(k);
  }

  template <class T>
  const T* typed(std::string_view k, std::string_view expected) {
    const toml::node* n = get(k);
    if (!n) return nullptr;
    if (const T* v = n->as<T>()) return v;
    sink_.add(*n, key(k), "expected " + std::string(expected) + ", got " + std::string(type_name(*n)));
    return nullptr;
  }

  void string(std::string_view k, std::string& out) {
    if (auto* v = typed<toml::value<std::string>>(k, "a string")) out = v->get();
  }
  void boolean(std::string_view k, bool& out) {
    if (auto* v = typed<toml::value<bool>>(k, "a boolean")) out = v->get();
  }
  /// A list of CIDRs ("10.0.0.0/8", "::1").
  void cidr_list(std::string_view k, std::vector<cidr>& out) {
    std::vector<std::string> texts;
    string_list(k, texts, [](std::string_view c) {
      return parse_cidr(c) ? std::string() : "invalid CIDR \"" + std::string(c) + "\" (expected e.g. 10.0.0.0/8)";
    });
    for (const auto& c : texts) {
      if (auto parsed = parse_cidr(c)) out.push_back(*parsed);
    }
  }
  /// A string naming one of `names`, listed in the order of enum E's values;
  /// `what` names the kind in the error ("unknown action \"x\" (use ...)").
  template <class E, std::size_t N>
  void choice(std::string_view k, const std::array<std::string_view, N>& names, std::string_view what, E& out) {
    std::string options;
    for (std::size_t i = 0; i < N; ++i) {
      options += (i == 0 ? "\"" : i + 1 == N ? " or \"" : ", \"") + std::string(names[i]) + "\"";
    }
    auto* v = typed<toml::value<std::string>>(k, options);
    if (!v) return;
    for (std::size_t i = 0; i < N; ++i) {
      if (v->get() == names[i]) {
        out = static_cast<E>(i);
        return;
      }
    }
    sink_.add(*v, key(k), "unknown " + std::string(what) + " \"" + v->get() + "\" (use " + options + ")");
  }
  void integer(std::string_view k, std::int64_t& out, std::int64_t min, std::int64_t max) {
    if (auto* v = typed<toml::value<std::int64_t>>(k, "an integer")) {
      if (v->get() < min || v->get() > max) {
        sink_.add(*v, key(k), "must be between " + std::to_string(min) + " and " + std::to_string(max));
      } else {
        out = v->get();
      }
    }
  }
  void unsigned_integer(std::string_view k, std::uint64_t& out, std::uint64_t min, std::uint64_t max) {
    std::int64_t v = static_cast<std::int64_t>(out);
    integer(k, v, static_cast<std::int64_t>(min), static_cast<std::int64_t>(max));
    out = static_cast<std::uint64_t>(v);
  }
  void real(std::string_view k, double& out, double min, double max) {
    const toml::node* n = get(k);
    if (!n) return;
    std::optional<double> v = n->is_integer() ? std::optional<double>(static_cast<double>(*n->value<std::int64_t>()))
                                              : n->value_exact<double>();
    if (!v) {
      sink_.add(*n, key(k), "expected a number, got " + std::string(type_name(*n)));
    } else if (*v < min || *v > max) {
      sink_.add(*n, key(k), "must be between " + std::to_string(min) + " and " + std::to_string(max));
    } else {
      out = *v;
    }
  }
  void duration(std::string_view k, microseconds& out, microseconds min = microseconds(0),
                microseconds max = microseconds::max()) {
    auto* v = typed<toml::value<std::string>>(k, "a duration string such as \"5s\"");
    if (!v) return;
    auto parsed = parse_duration(v->get());
    if (auto* err = std::get_if<std::string>(&parsed)) {
      sink_.add(*v, key(k), *err);
    } else if (std::get<microseconds>(parsed) < min) {
      sink_.add(*v, key(k), "must be at least " + format_duration(min));
    } else if (std::get<microseconds>(parsed) > max) {
      sink_.add(*v, key(k), "must be at most " + format_duration(max));
    } else {
      out = std::get<microseconds>(parsed);
    }
  }
  void size(std::string_view k, std::uint64_t& out, std::uint64_t min, std::uint64_t max) {
    const toml::node* n = get(k);
    if (!n) return;
    parse_result<std::uint64_t> parsed = std::string("expected a size such as \"16KiB\" or an integer");
    if (auto i = n->value_exact<std::int64_t>(); i && *i >= 0) parsed = static_cast<std::uint64_t>(*i);
    else if (auto s = n->value_exact<std::string>()) parsed = parse_size(*s);
    if (auto* err = std::get_if<std::string>(&parsed)) {
      sink_.add(*n, key(k), *err);
    } else if (std::get<std::uint64_t>(parsed) < min || std::get<std::uint64_t>(parsed) > max) {
      sink_.add(*n, key(k), "must be between " + std::to_string(min) + " and " + std::to_string(max) + " bytes");
    } else {
      out = std::get<std::uint64_t>(parsed);
    }
  }
  void address(std::string_view k, host_port& out) {
    auto* v = typed<toml::value<std::string>>(k, "a \"host:port\" string");
    if (!v) return;
    if (auto hp = parse_host_port(v->get())) out = *hp;
    else sink_.add(*v, key(k), "invalid address \"" + v->get() + "\" (expected host:port or [v6]:port)");
  }
  // An address to bind: an IP literal (a hostname would only fail at start).
  void bind_address(std::string_view k, host_port& out) {
    host_port hp = out;
    address(k, hp);
    const auto* v = table_.get(k);
    if (v != nullptr && v->is_string() && !parse_ip(hp.host)) {
      sink_.add(*v, key(k), "\"" + hp.host + "\" is not an IP address (a listener binds one, e.g. 127.0.0.1 or ::)");
      return;
    }
    out = hp;
  }
  // Strings of an array, each checked by `check` (returns an error message or "").
  template <class Check>
  void string_list(std::string_view k, std::vector<std::string>& out, Check check) {
    const toml::node* n = get(k);
    if (!n) return;
    std::vector<std::string> values;
    if (auto* s = n->as_string()) {
      values.push_back(s->get());  // a single string is accepted as a one-element list
      if (auto msg = check(s->get()); !msg.empty()) sink_.add(*s, key(k), msg);
    } else if (auto* a = n->as_array()) {
      for (std::size_t i = 0; i < a->size(); ++i) {
        const std::string item_key = key(k) + "[" + std::to_string(i) + "]";
        if (auto* s2 = (*a)[i].as_string()) {
          if (auto msg = check(s2->get()); !msg.empty()) sink_.add(*s2, item_key, msg);
          values.push_back(s2->get());
        } else {
          sink_.add((*a)[i], item_key, "expected a string, got " + std::string(type_name((*a)[i])));
        }
      }
    } else {
      sink_.add(*n, key(k), "expected an array of strings, got " + std::string(type_name(*n)));
      return;
    }
    out = std::move(values);
  }

private:
  void finish() {
    for (auto&& [k, v] : table_) {
      if (known_.contains(std::string(k.str()))) continue;
      if (path_ == "master" && k.str() == "accounting_hwm") {
        sink_.add(k.source(), key(k.str()),
                  "renamed to startup_backlog (accounting_hwm is the proxy's queue per master)");
      } else {
        sink_.add(k.source(), key(k.str()), "unknown key (check the spelling; unknown keys are errors)");
      }
    }
  }

  const toml::table& table_;
  std::string path_;
  sink& sink_;
  std::set<std::string, std::less<>> known_;
};

// Checks both daemons' schemas use (config_reader.cpp).

/// log_level is one both daemons accept (checked here so that --check finds a bad one).
void check_log_level(reader& r, const std::string& level);
/// An error message for an accounting or control endpoint (`what`) that is
/// not tcp:// or ipc:// (our own ZMTP code speaks them); empty: fine.
std::string check_stream_endpoint(std::string_view e, std::string_view what);
/// The same for a domain name.
std::string check_domain_name(std::string_view name);
/// Two keys that go together (a certificate and its key): both or neither.
/// Two keys given together or not at all: true when both are there; with
/// one alone, "needs B too" at it (and false).
bool both_or_neither(reader& r, const char* a, const char* b);
void check_pair(reader& r, const char* a, const std::string& a_value, const char* b, const std::string& b_value);
/// trace_endpoint parses (into `t.to`), and the other trace_* keys are not
/// given without it (they would do nothing).
void check_trace(reader& r, trace_config& t);
/// Files the keys name exist and can be read (whether they parse is checked
/// where they are used: the proxy's --check loads them).
void check_readable(reader& r, std::initializer_list<const char*> keys);

// An array of tables at `key` (the node `n`), each read by `each(item, its
// reader)`; anything else is an error naming `shape`, the form of one item.
template <class F>
void each_table(const toml::node& n, const std::string& key, sink& s, const std::string& shape, F each) {
  const auto* arr = n.as_array();
  if (!arr) {
    s.add(n, key, "expected an array of " + shape + ", got " + std::string(type_name(n)));
    return;
  }
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const toml::node& item = (*arr)[i];
    const std::string path = key + "[" + std::to_string(i) + "]";
    if (const auto* t = item.as_table()) {
      reader items(*t, path, s);
      each(item, items);
    } else {
      s.add(item, path, "expected a table " + shape + ", got " + std::string(type_name(item)));
    }
  }
}

/// Each daemon's table (config_master.cpp, config_proxy.cpp).
master_config read_master(const toml::table& t, sink& s);
proxy_config read_proxy(const toml::table& t, sink& s);
/// The [proxy] table's [[proxy.routes]] and [[proxy.shards]] (config_routes.cpp).
void read_routes(reader& r, proxy_config& p);
void read_shards(reader& r, proxy_config& p);

}  // namespace smockron::config::detail
