#include "transport/socket/frame.h"

#include "common/error.h"

namespace smddp::transport {

namespace {

void put(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

uint64_t get(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}

} // namespace

void encodeFrameHeader(const FrameHeader& h, const SipKey& key, uint8_t out[kFrameHeaderBytes]) {
  put(out + 0, kFrameMagic, 4);
  put(out + 4, kFrameVersion, 2);
  put(out + 6, static_cast<uint16_t>(h.type), 2);
  put(out + 8, h.seq, 8);
  put(out + 16, h.call, 4);
  put(out + 20, h.from, 4);
  put(out + 24, h.length, 8);
  put(out + 32, siphash24(key, out, 32), 8);
}

std::string decodeFrameHeader(const uint8_t in[kFrameHeaderBytes], const SipKey& key, FrameHeader* out) {
  if (get(in, 4) != kFrameMagic) {
    return "not an smddp frame (bad magic)";
  }
  if (get(in + 4, 2) != kFrameVersion) {
    return str("frame version ", get(in + 4, 2), ", expected ", kFrameVersion);
  }
  if (get(in + 32, 8) != siphash24(key, in, 32)) {
    return "frame header fails its check (corrupt, or not from this group)";
  }
  uint64_t type = get(in + 6, 2);
  if (type != static_cast<uint64_t>(FrameType::kData) && type != static_cast<uint64_t>(FrameType::kAbort)) {
    return str("unknown frame type ", type);
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.seq = get(in + 8, 8);
  h.call = static_cast<uint32_t>(get(in + 16, 4));
  h.from = static_cast<uint32_t>(get(in + 20, 4));
  h.length = get(in + 24, 8);
  if (h.type == FrameType::kAbort && h.length > kMaxAbortBytes) {
    return str("abort message of ", h.length, " bytes (at most ", kMaxAbortBytes, ")");
  }
  *out = h;
  return "";
}

} // namespace smddp::transport
