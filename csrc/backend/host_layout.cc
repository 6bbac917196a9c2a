#include "backend/host_layout.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>

namespace smddp {

std::ostream& operator<<(std::ostream& os, const Where& w) {
  return os << "ProcessGroupSMDDP::" << w.op << " (rank " << w.rank << " of " << w.size << "): ";
}

void checkStrided(const Where& where, const at::Tensor& t, const std::string& what) {
  TORCH_CHECK(t.defined(), where, what, " is undefined");
  TORCH_CHECK(
      t.layout() == at::kStrided,
      where,
      what,
      " must be a dense tensor (got layout ",
      t.layout(),
      "); call .to_dense() on it first");
}

void checkWritable(const Where& where, const at::Tensor& t, const std::string& what) {
  TORCH_CHECK(
      at::has_internal_overlap(t) != at::MemOverlap::Yes,
      where,
      what,
      " has elements that share memory (sizes ",
      t.sizes(),
      ", strides ",
      t.strides(),
      ", an expand()ed view?) and cannot be written; pass a tensor of its own, e.g. .clone()");
}

bool overlapsOutOfPlace(const at::Tensor& whole, const at::Tensor& block, int rank) {
  const auto* w = static_cast<const uint8_t*>(whole.data_ptr());
  const auto* b = static_cast<const uint8_t*>(block.data_ptr());
  const size_t wn = whole.nbytes();
  const size_t bn = block.nbytes();
  if (wn == 0 || bn == 0 || b + bn <= w || w + wn <= b) {
    return false;
  }
  return b != w + static_cast<size_t>(rank) * bn;
}

at::Tensor HostLayout::buffer(const Where& where, const at::Tensor& t, const std::string& what, Access access) {
  checkStrided(where, t, what);
  if (t.is_contiguous()) {
    return t;
  }
  if (access & kWrite) {
    checkWritable(where, t, what);
  }
  return copy(t, access);
}

at::Tensor HostLayout::copy(const at::Tensor& user, Access access) {
  at::Tensor flat = at::empty(user.sizes(), user.options().memory_format(at::MemoryFormat::Contiguous));
  staged_.push_back(Staged{{user}, flat, -1, (access & kRead) != 0, (access & kWrite) != 0});
  return flat;
}

at::Tensor HostLayout::blocks(const std::vector<at::Tensor>& parts, int64_t block, Access access) {
  at::Tensor flat = at::empty({static_cast<int64_t>(parts.size()) * block}, parts.at(0).options());
  staged_.push_back(Staged{parts, flat, block, (access & kRead) != 0, (access & kWrite) != 0});
  return flat;
}

at::Tensor HostLayout::padded(const at::Tensor& t, int64_t block, Access access) {
  if (t.is_contiguous() && t.numel() == block) {
    return t;
  }
  return blocks({t}, block, access);
}

void HostLayout::copyIn() const {
  for (const auto& s : staged_) {
    if (!s.copy_in) {
      continue;
    }
    if (s.block < 0) {
      s.flat.copy_(s.parts[0]);
      continue;
    }
    for (size_t k = 0; k < s.parts.size(); ++k) {
      const at::Tensor& part = s.parts[k];
      at::Tensor slot = s.flat.narrow(0, static_cast<int64_t>(k) * s.block, s.block);
      slot.narrow(0, 0, part.numel()).view(part.sizes()).copy_(part);
      if (part.numel() < s.block) {
        slot.narrow(0, part.numel(), s.block - part.numel()).zero_();
      }
    }
  }
}

void HostLayout::copyOut() const {
  for (const auto& s : staged_) {
    if (!s.copy_out) {
      continue;
    }
    if (s.block < 0) {
      s.parts[0].copy_(s.flat);
      continue;
    }
    for (size_t k = 0; k < s.parts.size(); ++k) {
      const at::Tensor& part = s.parts[k];
      part.copy_(s.flat.narrow(0, static_cast<int64_t>(k) * s.block, part.numel()).view(part.sizes()));
    }
  }
}

} // namespace smddp
