// The Network of TCP sockets: every rank's connections bound to its NIC,
// `streams` connections per peer, receive buffers as the knobs say (see
// socket_mesh.h for the connections themselves).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/network.h"
#include "transport/socket/socket_mesh.h"

namespace smddp::transport {

// The sockets' options from the knobs (SMDDP_SOCKET_*) and `net`, with their
// "auto" values resolved for this host.
SocketMesh::Options socketOptions(const Config& config, const NetOptions& net);

class SocketNetwork : public Network {
 public:
  // An empty options.nic is chosen here (chooseNic("", 0, 1, peer_hint)).
  explicit SocketNetwork(SocketMesh::Options options);

  const char* transport() const override {
    return "tcp";
  }
  const Nic& nic() const override {
    return options_.nic;
  }
  const SocketMesh::Options& options() const {
    return options_;
  }
  std::unique_ptr<Mesh> connect(
      Store& store,
      const std::string& key,
      int rank,
      const std::vector<int>& peers) override;

 private:
  SocketMesh::Options options_;
};

} // namespace smddp::transport
