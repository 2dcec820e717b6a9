// Prometheus text rendering and series registration.
#include "shared/base/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "smockron/version.hpp"

namespace smockron::metrics {
namespace {

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Inserts an extra label into a rendered label set.
std::string with_label(const std::string& label_set, const std::string& extra) {
  if (label_set.empty()) return "{" + extra + "}";
  return label_set.substr(0, label_set.size() - 1) + "," + extra + "}";
}

}  // namespace

histogram::histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  std::sort(bounds_.begin(), bounds_.end());
  for (std::size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  buckets_[static_cast<std::size_t>(it - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> kv) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : kv) {
    if (!first) out += ",";
    first = false;
    out += k;
    out += "=\"";
    for (char c : v) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    out += "\"";
  }
  return out + "}";
}

void add_build_info(registry& r, std::string_view daemon) {
  r.add_gauge("smockron_build_info", "Always 1: the daemon and version of this build",
              labels({{"daemon", daemon}, {"version", version_string}}))
      .set(1);
}

std::vector<double> exponential_buckets(double start, double factor, std::size_t count) {
  std::vector<double> b;
  for (std::size_t i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

registry::family& registry::family_for(const std::string& name, const std::string& help, kind type) {
  for (auto& f : families_) {
    if (f.name == name) return f;
  }
  families_.push_back({name, help, type, {}});
  return families_.back();
}

registry::series* registry::find(family& f, const std::string& label_set) {
  for (auto& s : f.members) {
    if (s.label_set == label_set) return &s;
  }
  return nullptr;
}

counter& registry::add_counter(const std::string& name, const std::string& help, const std::string& label_set) {
  std::lock_guard lock(mutex_);
  family& f = family_for(name, help, kind::counter);
  if (auto* s = find(f, label_set); s && s->c) return *s->c;
  counters_.emplace_back();
  f.members.push_back({label_set, &counters_.back(), nullptr, nullptr, {}});
  return counters_.back();
}

gauge& registry::add_gauge(const std::string& name, const std::string& help, const std::string& label_set) {
  std::lock_guard lock(mutex_);
  family& f = family_for(name, help, kind::gauge);
  if (auto* s = find(f, label_set); s && s->g) return *s->g;
  gauges_.emplace_back();
  f.members.push_back({label_set, nullptr, &gauges_.back(), nullptr, {}});
  return gauges_.back();
}

histogram& registry::add_histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                                   const std::string& label_set) {
  std::lock_guard lock(mutex_);
  family& f = family_for(name, help, kind::histogram);
  if (auto* s = find(f, label_set); s && s->h) return *s->h;
  histograms_.emplace_back(std::move(bounds));
  f.members.push_back({label_set, nullptr, nullptr, &histograms_.back(), {}});
  return histograms_.back();
}

void registry::add_callback(const std::string& name, const std::string& help, const std::string& label_set,
                            std::function<double()> fn) {
  add_callback(name, help, label_set, std::move(fn), kind::gauge);
}

void registry::add_counter_callback(const std::string& name, const std::string& help, std::function<double()> fn) {
  add_callback(name, help, "", std::move(fn), kind::counter);
}

void registry::add_callback(const std::string& name, const std::string& help, const std::string& label_set,
                            std::function<double()> fn, kind type) {
  std::lock_guard lock(mutex_);
  family& f = family_for(name, help, type);
  if (auto* s = find(f, label_set)) {
    s->fn = std::move(fn);
    return;
  }
  f.members.push_back({label_set, nullptr, nullptr, nullptr, std::move(fn)});
}

std::string registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out.reserve(4096);
  for (const auto& f : families_) {
    const char* type = f.type == kind::counter ? "counter" : f.type == kind::gauge ? "gauge" : "histogram";
    out += "# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + type + "\n";
    for (const auto& s : f.members) {
      if (s.c) out += f.name + s.label_set + " " + std::to_string(s.c->value()) + "\n";
      else if (s.g) out += f.name + s.label_set + " " + format_number(s.g->value()) + "\n";
      else if (s.fn) out += f.name + s.label_set + " " + format_number(s.fn()) + "\n";
      else if (s.h) {
        std::uint64_t cumulative = 0;
        const auto& b = s.h->bounds();
        for (std::size_t i = 0; i <= b.size(); ++i) {
          cumulative += s.h->bucket(i);
          const std::string le = i < b.size() ? format_number(b[i]) : "+Inf";
          out += f.name + "_bucket" + with_label(s.label_set, "le=\"" + le + "\"") + " " + std::to_string(cumulative) +
                 "\n";
        }
        out += f.name + "_sum" + s.label_set + " " + format_number(s.h->sum()) + "\n";
        out += f.name + "_count" + s.label_set + " " + std::to_string(s.h->count()) + "\n";
      }
    }
  }
  return out;
}

}  // namespace smockron::metrics
