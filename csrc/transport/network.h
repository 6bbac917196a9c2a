// The network below the algorithms: how a rank reaches the ranks of other
// nodes. The schedules see only this interface and Channel; each transport
// between nodes is a folder of its own under transport/ (socket/: TCP) that
// implements both classes, and createNetwork() is the one place that picks
// one, so that another transport (RDMA verbs, EFA) changes no algorithm.
//
//   Network  this rank's end of the network (gloo's transport::Device): its
//            NIC and the transport's settings, resolved once per
//            communicator from the knobs and the rank's place on its host.
//   Mesh     the connections of one schedule to its peers, made collectively
//            by Network::connect() (gloo's transport::Context and its
//            Pairs): a Channel per peer, their liveness (keepalive, stalled
//            or cut links, a NIC that went down), abort and shutdown.
//            Failures name the peer, its address and this rank's NIC.
//
// Ownership: a communicator owns its Network and the Meshes it made, and
// destroys the Meshes first; a Mesh owns its Channels.
// Threading: connect() runs on the thread that creates the communicator; a
// Mesh's channels are driven by one thread at a time; shutdownAll() may be
// called from any thread.
// Timeouts: connect() is bounded by NetOptions::timeout, which also sets how
// long a channel waits on a silent link before it gives its peer up.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/store.h"
#include "transport/channel.h"
#include "transport/nic.h"

namespace smddp::transport {

// Where the inter-node connections listen and connect from: this rank's NIC
// (chooseNic() over SMDDP_SOCKET_IFNAME, chosen by the caller from the rank's
// place on its host); empty: the list's first entry, or the address that
// routes to the store's host.
struct NetOptions {
  std::string store_host;
  Nic nic;
  std::chrono::milliseconds timeout{30000};  // bounds the set-up
};

class Mesh {
 public:
  virtual ~Mesh() = default;
  // The channel to `peer`, one of the peers given to connect().
  virtual Channel& channel(int peer) = 0;
  virtual bool has(int peer) const = 0;
  // From the thread that drives the channels: tell every peer why this rank
  // fails (best effort, never throws).
  virtual void sendAbortAll(const std::string& why) = 0;
  // From any thread: cut every connection so that blocked work fails now,
  // with `why` (this rank's own cause) rather than as a lost peer.
  virtual void shutdownAll(const std::string& why) = 0;
  // The NIC every connection of this mesh is bound to.
  virtual const Nic& nic() const = 0;
  // For the schedules' messages: "rank 2 (other node, 198.18.0.2:40113)
  // from nic0 (198.18.0.1)", or "rank 2" without a connection to it.
  virtual std::string describePeer(int peer) const = 0;
};

class Network {
 public:
  virtual ~Network() = default;
  // The transport's name in descriptions: "tcp".
  virtual const char* transport() const = 0;
  // This rank's NIC.
  virtual const Nic& nic() const = 0;
  // Connects this rank to `peers` (group ranks; the relation must be
  // symmetric). Collective over the group: every rank calls it with the same
  // `key`, also a rank without peers.
  virtual std::unique_ptr<Mesh> connect(
      Store& store,
      const std::string& key,
      int rank,
      const std::vector<int>& peers) = 0;
};

// This rank's network from the knobs (SMDDP_SOCKET_*) and `net`.
std::unique_ptr<Network> createNetwork(const Config& config, const NetOptions& net);

} // namespace smddp::transport
