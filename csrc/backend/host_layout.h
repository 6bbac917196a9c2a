// Strided CPU tensors in the native collectives.
//
// The native collectives read and write flat buffers; torch users pass any
// strided tensor (a transposed matrix, a channels_last activation, a slice
// with a step, or each rank its own layout). A call whose tensors are not
// contiguous runs on contiguous copies of them: the values are copied in
// when the call starts and out when it has finished, both on the executor
// thread, so that a call queued behind another on the same tensor sees that
// one's result. Contiguous tensors are used as they are, at no cost.
#pragma once

#include <ATen/core/Tensor.h>

#include <ostream>
#include <vector>

namespace smddp {

// "ProcessGroupSMDDP::allreduce (rank 0 of 4): ", formatted only when an
// error message is built: the checks of every call pass one around.
struct Where {
  const char* op;
  int rank;
  int size;
};
std::ostream& operator<<(std::ostream& os, const Where& w);

// Refuses what no collective can take: sparse and other non-strided layouts.
void checkStrided(const Where& where, const at::Tensor& t, const std::string& what);
// Refuses a tensor a collective cannot write: one whose elements share
// memory (an expand()ed view), which has no single value per element.
void checkWritable(const Where& where, const at::Tensor& t, const std::string& what);

// Whether the flat buffers `whole` (every rank's share, rank-major) and
// `block` (one share) share memory other than as share `rank` of `whole`,
// the in-place layout. Peers read one while this rank writes the other, so
// such a call must not run on them directly.
bool overlapsOutOfPlace(const at::Tensor& whole, const at::Tensor& block, int rank);

class HostLayout {
 public:
  enum Access { kRead = 1, kWrite = 2, kReadWrite = 3 };

  // The flat buffer through which the collective reads and/or writes `t`
  // (`t` itself when it is contiguous). Checks `t` first.
  at::Tensor buffer(const Where& where, const at::Tensor& t, const std::string& what, Access access);
  // A flat buffer of its own for `user`, copied in and/or out like a
  // strided tensor's.
  at::Tensor copy(const at::Tensor& user, Access access);

  // The list forms, whose tensors may differ in size from rank to rank: a
  // flat buffer of parts.size() blocks of `block` elements each, part k in
  // block k. Copied in (kRead): the rest of each block is zero, padding
  // that a reduction carries along and drops. Copied out (kWrite): each part
  // receives the first numel() elements of its block, in its own shape.
  at::Tensor blocks(const std::vector<at::Tensor>& parts, int64_t block, Access access);
  // `t` as the first elements of a flat buffer of `block` elements, as
  // blocks() does for one part; `t` itself when it is contiguous and has
  // `block` elements.
  at::Tensor padded(const at::Tensor& t, int64_t block, Access access);

  // Run on the executor, before and after the collective.
  void copyIn() const;
  void copyOut() const;

 private:
  struct Staged {
    std::vector<at::Tensor> parts;  // one, or a list form's tensors
    at::Tensor flat;
    int64_t block;  // elements per part in `flat`
    bool copy_in;
    bool copy_out;
  };
  std::vector<Staged> staged_;
};

} // namespace smddp
