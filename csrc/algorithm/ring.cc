#include "algorithm/ring.h"

#include <algorithm>

#include "algorithm/protocol.h"
#include "common/error.h"

namespace smddp::algorithm {

using protocol::RingOrder;
using transport::Channel;
using transport::MessageTag;

namespace {

std::vector<Channel*> channelsOf(const Ring& ring) {
  if (ring.next == ring.prev) {
    return {ring.next};
  }
  return {ring.next, ring.prev};
}

} // namespace

void ringAllGather(
    const Ring& ring,
    uint8_t* out,
    const std::vector<size_t>& offsets,
    const std::vector<size_t>& sizes,
    const MessageTag& tag,
    const Deadline& deadline,
    const std::function<void(uint64_t unit)>& on_landed,
    const uint8_t* own) {
  const int n = ring.size;
  const int r = ring.index;
  uint8_t* my_block = out == nullptr ? nullptr : out + offsets[r];
  if (own == my_block) {
    own = nullptr;
  }
  if (n == 1) {
    if (own != nullptr) {
      copyBytes(my_block, own, sizes[r]);
    }
    return;
  }
  const size_t chunk = ring.chunk_bytes;
  const size_t C = chunkCount(*std::max_element(sizes.begin(), sizes.end()), chunk);
  const uint64_t total = static_cast<uint64_t>(n - 1) * C;
  const RingOrder order{r, n};
  Channel* next = ring.next;
  Channel* prev = ring.prev;
  const uint64_t sbase = next->sendsDone();
  const uint64_t rbase = prev->recvsDone();
  for (int s = 0; s <= n - 2; ++s) {
    const int m = order.gatheredAt(s);
    for (size_t c = 0; c < C; ++c) {
      prev->postRecv(out + offsets[m] + c * chunk, chunkLen(sizes[m], chunk, c), tag);
    }
  }
  const uint8_t* send_from = own != nullptr ? own : my_block;
  for (size_t c = 0; c < C; ++c) {
    next->postSend(send_from + c * chunk, chunkLen(sizes[r], chunk, c), tag);
  }
  // My block into place, a chunk per turn of the loop, so that the channels
  // push what is posted between the pieces.
  size_t copied = own != nullptr ? 0 : sizes[r];
  uint64_t landed = 0;
  auto step = [&] {
    bool moved = false;
    if (copied < sizes[r]) {
      const size_t len = std::min(chunk, sizes[r] - copied);
      copyBytes(my_block + copied, own + copied, len);
      copied += len;
      moved = true;
    }
    const uint64_t got = prev->recvsDone() - rbase;
    while (landed < got) {
      const uint64_t u = landed++;
      if (on_landed) {
        on_landed(u);
      }
      if (u / C + 1 <= static_cast<uint64_t>(n - 2)) {
        // Step s+1 forwards the block that arrived at step s.
        const protocol::RingUnit unit = order.landed(u, C);
        const auto m = static_cast<size_t>(unit.block);
        next->postSend(out + offsets[m] + unit.chunk * chunk, chunkLen(sizes[m], chunk, unit.chunk), tag);
      }
      moved = true;
    }
    return moved;
  };
  // Done when every arrival has been handled by step() (not merely arrived).
  auto done = [&] { return landed == total && copied == sizes[r] && next->sendsDone() - sbase == total; };
  transport::drive(channelsOf(ring), step, done, deadline, ring.drive);
}

void ringReduceScatter(
    const Ring& ring,
    const ReduceSpec& spec,
    const Contributions& contrib,
    void* out,
    const std::vector<size_t>& counts,
    Sources sources,
    Result result,
    const MessageTag& tag,
    const Deadline& deadline,
    HostBuffer* scratch) {
  const int n = ring.size;
  const int r = ring.index;
  const size_t es = elementSize(spec.dtype);
  auto* dst = static_cast<uint8_t*>(out);
  if (n == 1) {
    SMDDP_ASSERT(!contrib.finish, "a ring of one member has nothing to finish");
    const void* src[1] = {contrib.base + contrib.offsets[0]};
    reduce(spec, dst, src, 1, counts[0], sources, result);
    return;
  }
  const size_t chunk_elems = std::max<size_t>(1, ring.chunk_bytes / es);
  const size_t chunk = chunk_elems * es;
  std::vector<size_t> bytes(counts.size());
  size_t all_bytes = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    bytes[i] = counts[i] * es;
    all_bytes += bytes[i];
  }
  const size_t maxb = *std::max_element(bytes.begin(), bytes.end());
  const size_t C = chunkCount(maxb, chunk);
  const uint64_t total = static_cast<uint64_t>(n - 1) * C;
  // PREMUL_SUM inputs are scaled before anything is added (the op's
  // meaning, and what keeps a sum of pre-divided float16 gradients finite):
  // into a copy, which the ring then adds as partials.
  const bool prescale = sources == Sources::kInputs && spec.op == ReduceOp::kPremulSum && spec.premul != 1.0;
  uint8_t* tmp = scratch->reserve(static_cast<size_t>(n - 1) * maxb + (prescale ? all_bytes : 0));
  Contributions scaled;
  if (prescale) {
    SMDDP_ASSERT(!contrib.finish && !contrib.ready, "PREMUL_SUM inputs must be whole at the start");
    uint8_t* copy = tmp + static_cast<size_t>(n - 1) * maxb;
    scaled.base = copy;
    size_t at = 0;
    for (int i = 0; i < n; ++i) {
      const void* src[1] = {contrib.base + contrib.offsets[static_cast<size_t>(i)]};
      reduce(spec, copy + at, src, 1, counts[static_cast<size_t>(i)], Sources::kInputs, Result::kPartial);
      scaled.offsets.push_back(at);
      at += bytes[static_cast<size_t>(i)];
    }
  }
  const Contributions& ins = prescale ? scaled : contrib;
  const ReduceSpec& add = spec;
  const RingOrder order{r, n};
  // The last step's result; the steps before it pass partials on.
  const Result last = result;
  Channel* next = ring.next;
  Channel* prev = ring.prev;
  const uint64_t sbase = next->sendsDone();
  const uint64_t rbase = prev->recvsDone();
  // Step s receives block r-s-2 (the partial reduction of its predecessors).
  for (int s = 0; s <= n - 2; ++s) {
    const int m = order.consumedAt(s + 1);
    for (size_t c = 0; c < C; ++c) {
      prev->postRecv(tmp + static_cast<size_t>(s) * maxb + c * chunk, chunkLen(bytes[m], chunk, c), tag);
    }
  }
  auto ready = [&](int block, size_t c) { return !contrib.ready || contrib.ready(block, c); };
  uint64_t processed = 0;
  uint64_t next_send = 0;
  auto step = [&] {
    bool moved = false;
    const uint64_t got = prev->recvsDone() - rbase;
    while (processed < got) {
      const int s = static_cast<int>(processed / C);
      const size_t c = processed % C;
      const int m = order.consumedAt(s + 1);
      const bool own_finish = s == n - 2 && contrib.finish;
      if (!own_finish && !ready(m, c)) {
        break;
      }
      const size_t len = chunkLen(bytes[m], chunk, c);
      uint8_t* part = tmp + static_cast<size_t>(s) * maxb + c * chunk;
      if (own_finish) {
        contrib.finish(dst + c * chunk, part, c * chunk, len / es);
      } else {
        const void* srcs[2] = {part, ins.base + ins.offsets[m] + c * chunk};
        if (s < n - 2) {
          reduce(add, part, srcs, 2, len / es, Sources::kPartials, Result::kPartial);
        } else {
          reduce(add, dst + c * chunk, srcs, 2, len / es, Sources::kPartials, last);
        }
      }
      ++processed;
      moved = true;
    }
    // Sends go out strictly in (step, chunk) order: the receiver's order.
    while (next_send < total) {
      const int s = static_cast<int>(next_send / C);
      const size_t c = next_send % C;
      const int m = order.consumedAt(s);
      const uint8_t* src = nullptr;
      if (s == 0) {
        if (!ready(m, c)) {
          break;
        }
        src = ins.base + ins.offsets[m] + c * chunk;
      } else {
        if (processed <= static_cast<uint64_t>(s - 1) * C + c) {
          break;
        }
        src = tmp + static_cast<size_t>(s - 1) * maxb + c * chunk;
      }
      next->postSend(src, chunkLen(bytes[m], chunk, c), tag);
      ++next_send;
      moved = true;
    }
    return moved;
  };
  auto done = [&] { return processed == total && next->sendsDone() - sbase == total; };
  transport::drive(channelsOf(ring), step, done, deadline, ring.drive);
}

void ringAllReduce(
    const Ring& ring,
    const ReduceSpec& spec,
    const void* in,
    void* out,
    size_t count,
    Sources sources,
    Result result,
    const MessageTag& tag,
    const Deadline& deadline,
    HostBuffer* scratch) {
  const int n = ring.size;
  const size_t es = elementSize(spec.dtype);
  if (n == 1) {
    const void* src[1] = {in};
    reduce(spec, out, src, 1, count, sources, result);
    return;
  }
  const Slices slices{count, static_cast<size_t>(n)};
  Contributions contrib;
  contrib.base = static_cast<const uint8_t*>(in);
  std::vector<size_t> counts(static_cast<size_t>(n));
  std::vector<size_t> offsets(static_cast<size_t>(n));
  std::vector<size_t> sizes(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    counts[i] = slices.size(static_cast<size_t>(i));
    offsets[i] = slices.begin(static_cast<size_t>(i)) * es;
    sizes[i] = counts[i] * es;
  }
  contrib.offsets = offsets;
  auto* o = static_cast<uint8_t*>(out);
  ringReduceScatter(
      ring, spec, contrib, o + offsets[ring.index], counts, sources, result, tag, deadline, scratch);
  ringAllGather(ring, o, offsets, sizes, tag, deadline);
}

void ringBroadcast(
    const Ring& ring,
    uint8_t* buf,
    size_t bytes,
    int root,
    const MessageTag& tag,
    const Deadline& deadline) {
  const int n = ring.size;
  const int r = ring.index;
  if (n == 1) {
    return;
  }
  const size_t chunk = ring.chunk_bytes;
  const size_t C = chunkCount(bytes, chunk);
  const int pos = mod(r - root, n);
  const bool receives = pos != 0;
  const bool forwards = pos != n - 1;
  Channel* next = ring.next;
  Channel* prev = ring.prev;
  const uint64_t sbase = next->sendsDone();
  const uint64_t rbase = prev->recvsDone();
  if (receives) {
    for (size_t c = 0; c < C; ++c) {
      prev->postRecv(buf + c * chunk, chunkLen(bytes, chunk, c), tag);
    }
  } else {
    for (size_t c = 0; c < C; ++c) {
      next->postSend(buf + c * chunk, chunkLen(bytes, chunk, c), tag);
    }
  }
  uint64_t forwarded = 0;
  auto step = [&] {
    bool moved = false;
    if (receives && forwards) {
      const uint64_t got = prev->recvsDone() - rbase;
      while (forwarded < got) {
        const size_t c = forwarded++;
        next->postSend(buf + c * chunk, chunkLen(bytes, chunk, c), tag);
        moved = true;
      }
    }
    return moved;
  };
  auto done = [&] {
    return (!receives || prev->recvsDone() - rbase == C) && (!forwards || next->sendsDone() - sbase == C);
  };
  std::vector<Channel*> chans;
  if (forwards) {
    chans.push_back(next);
  }
  if (receives && prev != next) {
    chans.push_back(prev);
  }
  if (chans.empty()) {
    chans.push_back(prev);
  }
  transport::drive(chans, step, done, deadline, ring.drive);
}

} // namespace smddp::algorithm
