#include "transport/network.h"

#include "transport/socket/socket_network.h"

namespace smddp::transport {

std::unique_ptr<Network> createNetwork(const Config& config, const NetOptions& net) {
  // TCP is the one transport between nodes on the host path.
  return std::make_unique<SocketNetwork>(socketOptions(config, net));
}

} // namespace smddp::transport
