// The wire format of the socket transport.
//
// Every message is a 56-byte header followed by `length` payload bytes:
//
//   magic u32 | version u16 | type u16 | seq u64 | from u32 | kind u8 |
//   dtype u8 | redop u8 | pad u8 | root i32 | pad u32 | count u64 |
//   length u64 | check u64
//
// little-endian; (seq, kind, dtype, redop, root, count) say which call the
// message belongs to, so a receiver that expected another can say what both
// ranks called; `check` is a SipHash of the other 48 bytes under the group
// key, so a corrupted or forged header is rejected before its length is
// believed. DATA payloads land straight in the receiver's buffer and their
// length must equal what the receiver posted; ABORT carries a message (at
// most kMaxAbortBytes) saying why the sender failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/channel.h"
#include "transport/socket/siphash.h"

namespace smddp::transport {

constexpr uint32_t kFrameMagic = 0x46444d53;  // "SMDF"
constexpr uint16_t kFrameVersion = 2;
constexpr size_t kFrameHeaderBytes = 56;
constexpr size_t kMaxAbortBytes = 4096;

enum class FrameType : uint16_t { kData = 1, kAbort = 2 };

struct FrameHeader {
  FrameType type = FrameType::kData;
  MessageTag tag;
  uint32_t from = 0;
  uint64_t length = 0;
};

void encodeFrameHeader(const FrameHeader& h, const SipKey& key, uint8_t out[kFrameHeaderBytes]);

// Parses and authenticates a header. Returns "" if it is valid, else what
// is wrong with it (bad magic, version, type, check, or an ABORT longer than
// kMaxAbortBytes).
std::string decodeFrameHeader(const uint8_t in[kFrameHeaderBytes], const SipKey& key, FrameHeader* out);

} // namespace smddp::transport
