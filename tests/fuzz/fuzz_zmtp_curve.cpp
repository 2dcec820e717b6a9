// The CURVE session, differential against the plaintext one: after a real
// handshake between our client and our server, the frames the input spells
// (ZMTP frames, as a NULL session reads them after READY) are sealed by one
// end and fed, cut anywhere, to the other, which must report exactly the
// events a NULL session of its role reports for the same frames in the
// clear. With a byte of the sealed stream flipped (the input chooses), the
// receiver must never deliver what it did not deliver in the clear and must
// fail rather than accept a box that was changed; with one of its boxes sent
// twice (a replay), it must fail on the nonce, having delivered only what
// came before. A handshake with one byte of the client's side changed
// (greeting, HELLO or INITIATE) either fails or authenticates the client's
// own key, never another. And arbitrary bytes after a CURVE greeting (the
// handshake commands of an unauthenticated peer) never crash it. The first
// input byte chooses the receiving end, the flip or replay and the cuts; the
// second, where.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_frames.hpp"
#include "shared/protocol/zmtp.hpp"
#include "shared/protocol/zmtp_curve.hpp"
#include "shared/protocol/zmtp_session.hpp"
#include "zmtp_log_events.hpp"

using namespace smockron;
using zmtp::session;

namespace {

using fuzz::log_events;

struct keys {
  zmtp::curve::keypair server = zmtp::curve::generate(), client = zmtp::curve::generate();
  session::security server_side() const {
    auto k = std::make_shared<zmtp::curve::server_keys>();
    k->own.push_back(server);
    k->allowed.insert(client.public_key);
    return {.client = nullptr, .server = k};
  }
  session::security client_side() const {
    auto k = std::make_shared<zmtp::curve::client_keys>();
    k->own = client;
    k->server = server.public_key;
    return {.client = k, .server = nullptr};
  }
};
const keys& the_keys() {
  static const keys k;
  return k;
}

const session::limits k_limits{.max_message = 64 * 1024, .max_frames = 4};

struct end {
  session s;
  log_events ev;
  std::string in, out;
  end(session::role r, session::security sec) : s(r, k_limits, std::move(sec)) {}
  void receive(std::string_view bytes, std::size_t cut) {
    for (std::size_t at = 0; at < bytes.size() && !s.failed(); at += cut) {
      in.append(bytes.substr(at, cut));
      const std::size_t used = s.feed(in, ev, out);
      FUZZ_CHECK(used <= in.size());
      in.erase(0, used);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t mode = data[0];
  const std::size_t cut = 1 + (mode >> 3) % 64;
  const std::string_view input(reinterpret_cast<const char*>(data) + 2, size - 2);
  // The receiver: the master's accounting (sub, server), its control (pub,
  // server), or the proxy's accounting (pub, client) reading the master's frames.
  const int kind = mode % 3;
  const session::role role = kind == 0 ? session::role::sub : session::role::pub;
  const bool receiver_is_server = kind != 2;
  const keys& k = the_keys();

  // The frames the input spells, as a NULL session of the receiver's role reads them.
  std::string clear;
  std::vector<zmtp::frame> frames;
  for (std::string_view rest = input; !rest.empty();) {
    zmtp::frame f;
    if (zmtp::next_frame(rest, k_limits.max_message, f) != zmtp::frame_status::ok) break;
    clear.append(rest.substr(0, f.size));
    frames.push_back(f);
    rest.remove_prefix(f.size);
  }
  end plain(role, {});
  plain.receive(session::hello(role == session::role::pub ? session::role::sub : session::role::pub), 64);
  plain.receive(clear, cut);

  end receiver(role, receiver_is_server ? k.server_side() : k.client_side());
  end sender(role == session::role::pub ? session::role::sub : session::role::pub,
             receiver_is_server ? k.client_side() : k.server_side());
  receiver.s.start(receiver.out);
  sender.s.start(sender.out);
  for (int i = 0; i < 4 && (!receiver.out.empty() || !sender.out.empty()); ++i) {
    const std::string a = std::exchange(sender.out, {}), b = std::exchange(receiver.out, {});
    receiver.receive(a, 1 << 20);
    sender.receive(b, 1 << 20);
  }
  FUZZ_CHECK(receiver.s.ready() && sender.s.ready());
  std::string sealed;
  for (const auto& f : frames) sender.s.append(sealed, f.flags & (zmtp::flag_more | zmtp::flag_command), f.body);
  const bool flip = (mode & 0x04) && !sealed.empty();
  const bool replay = !flip && (data[1] & 0x80) && !sealed.empty();
  if (flip) sealed[static_cast<unsigned char>(data[1]) * 257 % sealed.size()] ^= 0x20;
  if (replay) {  // box number data[1] % 128 (of those there are) sent a second time, right after itself
    std::vector<std::string_view> boxes;
    for (std::string_view rest = sealed; !rest.empty();) {
      zmtp::frame f;
      FUZZ_CHECK(zmtp::next_frame(rest, 1 << 20, f) == zmtp::frame_status::ok);
      boxes.push_back(rest.substr(0, f.size));
      rest.remove_prefix(f.size);
    }
    const std::size_t again = (data[1] & 0x7f) % boxes.size();
    std::string replayed;
    for (std::size_t i = 0; i < boxes.size(); ++i) {
      replayed.append(boxes[i]);
      if (i == again) replayed.append(boxes[i]);
    }
    sealed = std::move(replayed);
  }
  receiver.receive(sealed, cut);
  if (!flip && !replay) {
    if (!plain.s.failed() && !receiver.s.failed()) FUZZ_CHECK(receiver.ev.log == plain.ev.log);
  } else {
    // Whatever it delivered, the NULL session delivered too, from the start.
    FUZZ_CHECK(plain.ev.log.starts_with(receiver.ev.log) || plain.s.failed());
  }
  // A replayed box is refused for its nonce (unless the receiver had already
  // stopped on something the NULL session stops on too).
  if (replay && !plain.s.failed()) FUZZ_CHECK(receiver.s.failed() == zmtp::fault::nonce);

  // A handshake with one byte changed on the client's side, on its way.
  {
    end client(role == session::role::pub ? session::role::sub : session::role::pub, k.client_side());
    end server(role, k.server_side());
    client.s.start(client.out);
    server.s.start(server.out);
    const std::size_t at = static_cast<unsigned char>(data[1]) * 2 + (mode & 1);  // 0..511: greeting to INITIATE
    std::size_t sent = 0;
    for (int i = 0; i < 4 && (!client.out.empty() || !server.out.empty()); ++i) {
      std::string a = std::exchange(client.out, {});
      const std::string b = std::exchange(server.out, {});
      if (at >= sent && at < sent + a.size()) a[at - sent] ^= static_cast<char>(1 + (mode >> 5));
      sent += a.size();
      server.receive(a, cut);
      client.receive(b, cut);
    }
    if (server.s.ready()) FUZZ_CHECK(server.s.peer_key() && *server.s.peer_key() == k.client.public_key);
  }

  // An unauthenticated peer's bytes after a CURVE greeting.
  end raw(role, receiver_is_server ? k.server_side() : k.client_side());
  raw.receive(zmtp::curve_greeting(!receiver_is_server), 64);
  raw.receive(input, cut);
  FUZZ_CHECK(!raw.s.ready() || raw.s.peer_key() != nullptr);
  return 0;
}
