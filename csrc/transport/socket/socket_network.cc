#include "transport/socket/socket_network.h"

#include <atomic>

#include "common/log.h"
#include "transport/socket/socket_util.h"

namespace smddp::transport {

SocketMesh::Options socketOptions(const Config& config, const NetOptions& net) {
  SocketMesh::Options so;
  so.nic = net.nic.empty() ? chooseNic(config.socket_ifname, 0, 1, net.store_host) : net.nic;
  so.peer_hint = net.store_host;
  so.streams = config.socket_streams;
  so.port_low = config.socket_port_low;
  so.port_high = config.socket_port_high;
  so.timeout = net.timeout;
  // Where a sender and its receiver take turns on one core (the host's
  // ranks outnumber its CPUs), autotuning grows the receive queue to
  // megabytes and what the sender wrote has left the cache by the time the
  // receiver runs: auto bounds the queue there, so that a chunk is read
  // while it is still cached. Ranks with cores of their own keep
  // autotuning (there the bound costs throughput: a sender running beside
  // its receiver would wait on a full queue), and so does a host whose
  // rmem_max is below the bound (the kernel would cap it anyway). See
  // docs/design.md, "Where the time goes, as design rules".
  constexpr size_t kAutoRcvbuf = autos::kSocketRcvbufBytes;
  const size_t max = receiveBufferMax();
  if (config.socket_rcvbuf_bytes == kAutoBytes) {
    so.rcvbuf_bytes = config.oversubscribed() && max >= kAutoRcvbuf ? kAutoRcvbuf : 0;
  } else {
    so.rcvbuf_bytes = config.socket_rcvbuf_bytes;
    static std::atomic<bool> warned{false};
    if (max > 0 && so.rcvbuf_bytes > max && !warned.exchange(true)) {
      SMDDP_LOG(
          kWarn, "SMDDP_SOCKET_RCVBUF_BYTES=", so.rcvbuf_bytes, " exceeds net.core.rmem_max (", max,
          "): the kernel grants ", max, " bytes; raise rmem_max (sysctl) or lower the value");
    }
  }
  return so;
}

SocketNetwork::SocketNetwork(SocketMesh::Options options) : options_(std::move(options)) {
  if (options_.nic.empty()) {
    options_.nic = chooseNic("", 0, 1, options_.peer_hint);
  }
}

std::unique_ptr<Mesh> SocketNetwork::connect(
    Store& store,
    const std::string& key,
    int rank,
    const std::vector<int>& peers) {
  return std::make_unique<SocketMesh>(store, key, rank, peers, options_);
}

} // namespace smddp::transport
