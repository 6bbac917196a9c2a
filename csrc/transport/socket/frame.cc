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
  put(out + 8, h.tag.seq, 8);
  put(out + 16, h.from, 4);
  put(out + 20, static_cast<uint8_t>(h.tag.kind), 1);
  put(out + 21, static_cast<uint8_t>(h.tag.dtype), 1);
  put(out + 22, static_cast<uint8_t>(h.tag.redop), 1);
  put(out + 23, 0, 1);
  put(out + 24, static_cast<uint32_t>(h.tag.root), 4);
  put(out + 28, 0, 4);
  put(out + 32, h.tag.count, 8);
  put(out + 40, h.length, 8);
  put(out + 48, siphash24(key, out, 48), 8);
}

std::string decodeFrameHeader(const uint8_t in[kFrameHeaderBytes], const SipKey& key, FrameHeader* out) {
  if (get(in, 4) != kFrameMagic) {
    return "not an smddp frame (bad magic)";
  }
  if (get(in + 4, 2) != kFrameVersion) {
    return str("frame version ", get(in + 4, 2), ", expected ", kFrameVersion);
  }
  if (get(in + 48, 8) != siphash24(key, in, 48)) {
    return "frame header fails its check (corrupt, or not from this group)";
  }
  uint64_t type = get(in + 6, 2);
  if (type != static_cast<uint64_t>(FrameType::kData) && type != static_cast<uint64_t>(FrameType::kAbort)) {
    return str("unknown frame type ", type);
  }
  const uint64_t kind = get(in + 20, 1);
  const uint64_t dtype = get(in + 21, 1);
  const uint64_t redop = get(in + 22, 1);
  if (kind < static_cast<uint64_t>(CollectiveKind::kAllGather) ||
      kind > static_cast<uint64_t>(CollectiveKind::kBarrier) ||
      dtype >= static_cast<uint64_t>(DataType::kCount) || redop >= static_cast<uint64_t>(ReduceOp::kCount)) {
    return str("frame names an unknown call (kind ", kind, ", dtype ", dtype, ", op ", redop, ")");
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.tag.seq = get(in + 8, 8);
  h.from = static_cast<uint32_t>(get(in + 16, 4));
  h.tag.kind = static_cast<CollectiveKind>(kind);
  h.tag.dtype = static_cast<DataType>(dtype);
  h.tag.redop = static_cast<ReduceOp>(redop);
  h.tag.root = static_cast<int32_t>(static_cast<uint32_t>(get(in + 24, 4)));
  h.tag.count = get(in + 32, 8);
  h.length = get(in + 40, 8);
  if (h.type == FrameType::kAbort && h.length > kMaxAbortBytes) {
    return str("abort message of ", h.length, " bytes (at most ", kMaxAbortBytes, ")");
  }
  *out = h;
  return "";
}

} // namespace smddp::transport
