// The HTTP/2 server session driven by frames in memory: libnghttp2's client
// session on one side, the proxy's h2_connection (no socket) on the other
// (session_fixture.hpp). Requests answered by the proxy itself, field
// sections it refuses, and the flood bounds, frame by frame.
#include <nghttp2/nghttp2.h>

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "tests/proxy/h2/nghttp2_peer.hpp"
#include "tests/proxy/h2/session_fixture.hpp"

namespace smockron::proxy::test {
namespace {

// A client: libnghttp2's client session, recording what the server says.
class h2_client : public nghttp2_peer {
public:
  h2_client() {
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t namelen, const uint8_t* value,
               size_t valuelen, uint8_t, void* ud) {
          auto& c = *static_cast<h2_client*>(ud);
          if (std::string_view(reinterpret_cast<const char*>(name), namelen) == ":status") {
            c.status[f->hd.stream_id] = std::stoi(std::string(reinterpret_cast<const char*>(value), valuelen));
          }
          c.fields[f->hd.stream_id][std::string(reinterpret_cast<const char*>(name), namelen)] =
              std::string(reinterpret_cast<const char*>(value), valuelen);
          return 0;
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, [](nghttp2_session*, const nghttp2_frame* f, void* ud) {
      auto& c = *static_cast<h2_client*>(ud);
      if (f->hd.type == NGHTTP2_GOAWAY) c.goaway = static_cast<int>(f->goaway.error_code);
      if (f->hd.type == NGHTTP2_RST_STREAM) c.resets[f->hd.stream_id] = f->rst_stream.error_code;
      return 0;
    });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cb, [](nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len, void* ud) {
          static_cast<h2_client*>(ud)->body[id].append(reinterpret_cast<const char*>(data), len);
          return 0;
        });
    nghttp2_session_client_new(&session, cb, this);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  }
  /// A GET on `authority` (and an X-Key when given); its stream id.
  std::int32_t get(std::string_view authority, std::string_view key = {}) {
    std::vector<nghttp2_nv> nv = {field(":method", "GET"), field(":scheme", "http"), field(":authority", authority),
                                  field(":path", "/")};
    if (!key.empty()) nv.push_back(field("x-key", key));
    return nghttp2_submit_request(session, nullptr, nv.data(), nv.size(), nullptr, nullptr);
  }

  std::map<std::int32_t, int> status;
  std::map<std::int32_t, std::map<std::string, std::string>> fields;
  std::map<std::int32_t, std::string> body;
  std::map<std::int32_t, std::uint32_t> resets;
  int goaway = -1;
};

// Both sides exchange until neither has more to say (a bounded number of turns).
void converse(h2_client& c, h2_session_fixture& f, std::string extra = {}) {
  for (int turn = 0; turn < 16; ++turn) {
    std::string to_server = c.take() + extra;
    extra.clear();
    const std::string to_client = f.exchange(to_server);
    if (to_server.empty() && to_client.empty()) return;
    c.give(to_client);
  }
}

// A raw frame (RFC 9113 4.1).
std::string frame(std::uint8_t type, std::uint8_t flags, std::int32_t stream, const std::string& payload) {
  std::string out;
  const auto len = payload.size();
  out += static_cast<char>((len >> 16) & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(type);
  out += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((stream >> shift) & 0xff);
  return out + payload;
}
std::string u32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>((v >> 16) & 0xff), static_cast<char>((v >> 8) & 0xff),
          static_cast<char>(v & 0xff)};
}

TEST(H2Session, RequestsTheProxyAnswersItself) {
  h2_session_fixture f;
  h2_client c;
  const auto no_route = c.get("elsewhere.example");
  const auto no_master = c.get("limited.example", "k1");
  const auto spelled = c.get("LIMITED.example.:80", "k1");  // a host as servers read it: the limited route
  converse(c, f);
  EXPECT_EQ(c.status[no_route], 404);
  EXPECT_EQ(c.body[no_route], "no route\n");
  EXPECT_EQ(c.status[no_master], 503);  // fail_closed, and no master covers the domain
  EXPECT_EQ(c.fields[no_master]["retry-after"], "1");
  EXPECT_EQ(c.status[spelled], 503);
  EXPECT_EQ(c.goaway, -1);
  EXPECT_EQ(f.shared->metrics.h2_requests.value(), 3u);
  EXPECT_TRUE(f.session->alive());
}

TEST(H2Session, AnAuthorityWithUserinfoIs400) {
  h2_session_fixture f;
  h2_client c;
  const auto id = c.get("user@limited.example", "k1");
  converse(c, f);
  EXPECT_EQ(c.status[id], 400);
  EXPECT_EQ(c.body[id], "bad request: invalid :authority\n");
}

// The client resets its own streams: past http2_reset_burst (5), GOAWAY(ENHANCE_YOUR_CALM).
TEST(H2Session, RapidResetEndsTheConnection) {
  h2_session_fixture f;
  h2_client c;
  converse(c, f);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(c.get("elsewhere.example"));
  std::string bytes = c.take();  // HEADERS, then the client's RST_STREAM for each
  for (const auto id : ids) bytes += frame(NGHTTP2_RST_STREAM, 0, id, u32(NGHTTP2_CANCEL));
  c.give(f.exchange(bytes));
  EXPECT_EQ(c.goaway, NGHTTP2_ENHANCE_YOUR_CALM);
  EXPECT_EQ(f.shared->metrics.h2_rapid_reset.value(), 1u);
  EXPECT_FALSE(f.session->alive());
}

// "MadeYouReset" (CVE-2025-8671): the client never resets, but makes the
// server reset each stream (a WINDOW_UPDATE overflowing its window): those
// resets count as the client's own, within the read that caused them.
TEST(H2Session, ResetsTheClientCausesCountAsItsOwn) {
  h2_session_fixture f;
  h2_client c;
  converse(c, f);
  std::string attack;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(c.get("elsewhere.example"));
  attack = c.take();
  for (const auto id : ids) attack += frame(NGHTTP2_WINDOW_UPDATE, 0, id, u32(0x7fffffff));
  c.give(f.exchange(attack));
  EXPECT_EQ(c.goaway, NGHTTP2_ENHANCE_YOUR_CALM);
  EXPECT_EQ(f.shared->metrics.h2_rapid_reset.value(), 1u);
}

// Below the bound, such resets are only counted: the connection goes on.
TEST(H2Session, AFewServerResetsAreAllowed) {
  h2_session_fixture f;
  h2_client c;
  converse(c, f);
  const auto id = c.get("elsewhere.example");
  std::string bytes = c.take() + frame(NGHTTP2_WINDOW_UPDATE, 0, id, u32(0x7fffffff));
  c.give(f.exchange(bytes));
  converse(c, f);
  EXPECT_EQ(c.goaway, -1);
  EXPECT_EQ(f.shared->metrics.h2_rapid_reset.value(), 0u);
  const auto next = c.get("elsewhere.example");
  converse(c, f);
  EXPECT_EQ(c.status[next], 404);
}

// Frames that carry no request (PING here) past http2_control_burst (20).
TEST(H2Session, ControlFrameFloodEndsTheConnection) {
  h2_session_fixture f;
  h2_client c;
  converse(c, f);
  std::string pings;
  for (int i = 0; i < 30; ++i) pings += frame(NGHTTP2_PING, 0, 0, std::string(8, static_cast<char>(i)));
  c.give(f.exchange(pings));
  EXPECT_EQ(c.goaway, NGHTTP2_ENHANCE_YOUR_CALM);
  EXPECT_EQ(f.shared->metrics.h2_control_flood.value(), 1u);
}

// Before the client acknowledged SETTINGS (8 streams), a stream beyond it is refused alone.
TEST(H2Session, StreamsBeyondTheLimitAreRefused) {
  h2_session_fixture f;
  h2_client c;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 9; ++i) ids.push_back(c.get("elsewhere.example"));
  c.give(f.exchange(c.take()));  // the client's SETTINGS and all its HEADERS in one read
  converse(c, f);
  int refused = 0, answered = 0;
  for (const auto id : ids) {
    refused += c.resets.count(id) && c.resets[id] == NGHTTP2_REFUSED_STREAM;
    answered += c.status[id] == 404;
  }
  EXPECT_GE(refused, 1);
  EXPECT_EQ(refused + answered, 9);
  EXPECT_GE(f.shared->metrics.h2_too_many_streams.value(), 1u);
}

// Garbage instead of frames: the connection ends with GOAWAY(PROTOCOL_ERROR), counted.
TEST(H2Session, NotHttp2IsAProtocolError) {
  h2_session_fixture f;
  const std::string out = f.exchange("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_FALSE(f.session->alive());
  EXPECT_EQ(f.shared->metrics.h2_protocol_error.value(), 1u);
  EXPECT_NE(out.find(std::string(1, static_cast<char>(NGHTTP2_GOAWAY))), std::string::npos);
}

}  // namespace
}  // namespace smockron::proxy::test
