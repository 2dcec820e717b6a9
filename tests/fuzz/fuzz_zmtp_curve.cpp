// The CURVE session, differential against the plaintext one: after a real
// handshake between our client and our server, the frames the input spells
// (ZMTP frames, as a NULL session reads them after READY) are sealed by one
// end and fed, cut anywhere, to the other, which must report exactly the
// events a NULL session of its role reports for the same frames in the
// clear. With a byte of the sealed stream flipped (the input chooses), the
// receiver must never deliver what it did not deliver in the clear and must
// fail rather than accept a box that was changed. And arbitrary bytes after a
// CURVE greeting (the handshake commands of an unauthenticated peer) never
// crash it. The first input byte chooses the receiving end, the flip and the cuts.
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
  if (flip) sealed[static_cast<unsigned char>(data[1]) * 257 % sealed.size()] ^= 0x20;
  receiver.receive(sealed, cut);
  if (!flip) {
    if (!plain.s.failed() && !receiver.s.failed()) FUZZ_CHECK(receiver.ev.log == plain.ev.log);
  } else {
    // Whatever it delivered, the NULL session delivered too, from the start.
    FUZZ_CHECK(plain.ev.log.starts_with(receiver.ev.log) || plain.s.failed());
  }

  // An unauthenticated peer's bytes after a CURVE greeting.
  end raw(role, receiver_is_server ? k.server_side() : k.client_side());
  raw.receive(zmtp::curve_greeting(!receiver_is_server), 64);
  raw.receive(input, cut);
  FUZZ_CHECK(!raw.s.ready() || raw.s.peer_key() != nullptr);
  return 0;
}
