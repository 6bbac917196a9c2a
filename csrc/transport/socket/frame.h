// The wire format of the socket transport.
//
// Every message is a 40-byte header followed by `length` payload bytes:
//
//   magic u32 | version u16 | type u16 | seq u64 | call u32 | from u32 |
//   length u64 | check u64
//
// little-endian; `check` is a SipHash of the other 32 bytes under the group
// key, so a corrupted or forged header is rejected before its length is
// believed. DATA payloads land straight in the receiver's buffer and their
// length must equal what the receiver posted; ABORT carries a message (at
// most kMaxAbortBytes) saying why the sender failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/socket/siphash.h"

namespace smddp::transport {

constexpr uint32_t kFrameMagic = 0x46444d53;  // "SMDF"
constexpr uint16_t kFrameVersion = 1;
constexpr size_t kFrameHeaderBytes = 40;
constexpr size_t kMaxAbortBytes = 4096;

enum class FrameType : uint16_t { kData = 1, kAbort = 2 };

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint64_t seq = 0;
  uint32_t call = 0;
  uint32_t from = 0;
  uint64_t length = 0;
};

void encodeFrameHeader(const FrameHeader& h, const SipKey& key, uint8_t out[kFrameHeaderBytes]);

// Parses and authenticates a header. Returns "" if it is valid, else what
// is wrong with it (bad magic, version, type, check, or an ABORT longer than
// kMaxAbortBytes).
std::string decodeFrameHeader(const uint8_t in[kFrameHeaderBytes], const SipKey& key, FrameHeader* out);

} // namespace smddp::transport
