// The conversions between torch's types and the core's: element types,
// reduce ops, and the element type of a collective that only moves bytes.
// One place for them, used by the backend and both extension modules.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>

#include "common/types.h"

namespace smddp {

// The core's element type of `type`; *ok is false when the core has none.
DataType toDataType(at::ScalarType type, bool* ok);
// The core's reduce op of `op`; *ok is false for ops the core lacks
// (BAND, BOR, BXOR).
ReduceOp toReduceOp(const ::c10d::ReduceOp& op, bool* ok);
// "SUM", "BAND", ...: the name of any c10d reduce op, for messages.
const char* c10dReduceOpName(const ::c10d::ReduceOp& op);

// The element type a collective that only moves bytes runs with: the real
// one when smddp knows it (so ranks that disagree are told), else bytes.
struct MoveType {
  DataType dtype;
  size_t count;
};

MoveType moveType(const at::Tensor& t);

} // namespace smddp
