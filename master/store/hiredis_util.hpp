// What the Redis store and its cluster client both need of hiredis's
// blocking API: a reply that frees itself, one command as argv (binary-safe),
// a reply's bytes, and a timeout as hiredis takes it.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string_view>
#include <vector>

namespace smockron::master::hiredis {

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

inline timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(d.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((d.count() % 1000) * 1000);
  return tv;
}

inline std::string_view str(const redisReply* r) { return {r->str, r->len}; }

/// Queues one command (pipelining: the reply comes with redisGetReply()); false when hiredis refused it.
inline bool append(redisContext* c, const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()) == REDIS_OK;
}

/// The next reply on `c`; null when the connection failed (c->errstr says why).
inline reply_ptr next_reply(redisContext* c) {
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK) return nullptr;
  return reply_ptr(static_cast<redisReply*>(raw));
}

/// One command and its reply; null when the connection failed.
inline reply_ptr command(redisContext* c, const std::vector<std::string_view>& args) {
  if (!append(c, args)) return nullptr;
  return next_reply(c);
}

}  // namespace smockron::master::hiredis
