// libFuzzer target: the TLS path from handshake to frames (comm::TlsSession feeding a
// comm::FrameDecoder, as a TLS connection does).
// Input: [mode u8][bytes].
//   mode even: `bytes` are a stranger's ciphertext to a fresh accepting session, fed in
//     two pieces (split at mode's value): the handshake parser must refuse or wait,
//     never establish (no client signature can be forged) and never crash.
//   mode odd: a client and a server session complete a real handshake in memory (test
//     certificates made once); the client encrypts `bytes`, the server decrypts them
//     into the decoder's read regions, chunk by chunk. The frames and the verdict must
//     equal decoding `bytes` with one FrameDecoder::Feed: after the handshake the bytes
//     are frames like any others, with the same bounds (meta 512 B, message 64 KiB).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/tls.h"
#include "comm/tls_pki.h"

namespace {

using pscore::Result;
using pscore::Status;
using pscore::comm::Frame;
using pscore::comm::FrameDecoder;
using pscore::comm::Limits;
using pscore::comm::TlsContext;
using pscore::comm::TlsSession;

Limits SmallLimits() {
  Limits l;
  l.max_meta_bytes = 512;
  l.max_message_bytes = 64 << 10;
  return l;
}

struct Pki {
  pscore::comm::testing::TestPki pki;
  std::shared_ptr<TlsContext> server = pki.Context("s", "scheduler");
  std::shared_ptr<TlsContext> client = pki.Context("c", "worker-0");
};

Pki& Certs() {
  static Pki* p = new Pki();  // made once; the temp files are left for the process's life
  return *p;
}

void Shuttle(TlsSession& from, TlsSession& to) {
  std::string bytes;
  from.TakeCipher(&bytes);
  if (!bytes.empty()) to.Feed(bytes.data(), bytes.size());
}

bool Handshake(TlsSession& c, TlsSession& s) {
  for (int i = 0; i < 6 && !(c.established() && s.established()); ++i) {
    if (!c.Handshake().ok()) return false;
    Shuttle(c, s);
    if (!s.Handshake().ok()) return false;
    Shuttle(s, c);
  }
  return c.established() && s.established();
}

std::string Describe(const std::vector<Frame>& frames) {
  std::string out;
  for (const Frame& f : frames) {
    out += f.meta.SerializeAsString();
    out += '|';
    if (f.payload) out.append(f.payload->data(), f.payload->size());
    out += '#';
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  Pki& certs = Certs();
  if ((mode & 1) == 0) {
    TlsSession server(certs.server, /*server=*/true);
    const size_t split = std::min<size_t>(n, mode);
    server.Feed(bytes, split);
    Status st = server.Handshake();
    if (st.ok()) {
      server.Feed(bytes + split, n - split);
      st = server.Handshake();
    }
    if (server.established()) std::abort();  // a handshake completed without the client's key
    return 0;
  }
  TlsSession client(certs.client, false), server(certs.server, true);
  if (!Handshake(client, server)) std::abort();  // good certificates must always connect
  if (n > 0 && !client.Write(bytes, n).ok()) std::abort();
  std::string cipher;
  client.TakeCipher(&cipher);
  server.Feed(cipher.data(), cipher.size());
  FrameDecoder tls_decoder(SmallLimits());
  std::vector<Frame> via_tls, frames;
  Status tls_st;
  for (;;) {
    size_t room = 0;
    char* region = tls_decoder.ReadRegion(&room);
    Result<size_t> got = server.Read(region, room);
    if (!got.ok()) std::abort();  // our own ciphertext must decrypt
    tls_st = tls_decoder.Commit(*got, &frames);
    while (tls_st.ok() && tls_decoder.paused()) tls_st = tls_decoder.Resume(&frames);
    for (Frame& f : frames) via_tls.push_back(std::move(f));
    frames.clear();
    if (*got == 0 || !tls_st.ok()) break;
  }
  FrameDecoder plain(SmallLimits());
  std::vector<Frame> direct;
  Status plain_st = plain.Feed(std::string_view(bytes, n), &direct);
  if (tls_st.ok() != plain_st.ok()) std::abort();
  if (Describe(via_tls) != Describe(direct)) std::abort();
  return 0;
}
