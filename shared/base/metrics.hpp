// A small Prometheus text-format registry (counters, gauges, histograms)
// used by both daemons. Registration takes a lock (control plane); updates
// are relaxed atomics (data plane); series have stable addresses.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smockron::metrics {

class counter {
public:
  void inc(std::uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

private:
  std::atomic<std::uint64_t> value_{0};
};

class gauge {
public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

private:
  std::atomic<double> value_{0};
};

/// Cumulative histogram with fixed upper bounds (e.g. seconds).
class histogram {
public:
  explicit histogram(std::vector<double> bounds);
  void observe(double v);
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  const std::vector<double>& bounds() const { return bounds_; }
  /// Non-cumulative count of bucket i (i == bounds().size() is +Inf).
  std::uint64_t bucket(std::size_t i) const { return buckets_[i].load(std::memory_order_relaxed); }

private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;
  std::atomic<std::uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

/// Label set rendered as `{k="v",...}` with Prometheus escaping.
std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> kv);

class registry;
/// smockron_build_info{daemon, version} 1: which build answers (Prometheus's build_info convention).
void add_build_info(registry& r, std::string_view daemon);

/// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> exponential_buckets(double start, double factor, std::size_t count);

class registry {
public:
  counter& add_counter(const std::string& name, const std::string& help, const std::string& label_set = "");
  gauge& add_gauge(const std::string& name, const std::string& help, const std::string& label_set = "");
  histogram& add_histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                           const std::string& label_set = "");
  /// A gauge computed when scraped (called under the registry lock).
  void add_callback(const std::string& name, const std::string& help, const std::string& label_set,
                    std::function<double()> fn);
  /// A counter kept elsewhere (a monotonic count read when scraped).
  void add_counter_callback(const std::string& name, const std::string& help, std::function<double()> fn);

  /// Prometheus text exposition format 0.0.4.
  std::string render() const;

private:
  enum class kind { counter, gauge, histogram };
  struct series {
    std::string label_set;
    counter* c = nullptr;
    gauge* g = nullptr;
    histogram* h = nullptr;
    std::function<double()> fn;
  };
  struct family {
    std::string name, help;
    kind type;
    std::vector<series> members;
  };
  family& family_for(const std::string& name, const std::string& help, kind type);
  void add_callback(const std::string& name, const std::string& help, const std::string& label_set,
                    std::function<double()> fn, kind type);
  series* find(family& f, const std::string& label_set);

  mutable std::mutex mutex_;
  std::deque<family> families_;
  std::deque<counter> counters_;
  std::deque<gauge> gauges_;
  std::deque<histogram> histograms_;
};

}  // namespace smockron::metrics
