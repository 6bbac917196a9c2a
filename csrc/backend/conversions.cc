#include "backend/conversions.h"

namespace smddp {

DataType toDataType(at::ScalarType type, bool* ok) {
  *ok = true;
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUInt8;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kBool:
      return DataType::kBool;
    default:
      *ok = false;
      return DataType::kUInt8;
  }
}

ReduceOp toReduceOp(const ::c10d::ReduceOp& op, bool* ok) {
  *ok = true;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case ::c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case ::c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case ::c10d::ReduceOp::PREMUL_SUM:
      return ReduceOp::kPremulSum;
    default:
      *ok = false;
      return ReduceOp::kSum;
  }
}

const char* c10dReduceOpName(const ::c10d::ReduceOp& op) {
  switch (op.op_) {
    case ::c10d::ReduceOp::BAND:
      return "BAND";
    case ::c10d::ReduceOp::BOR:
      return "BOR";
    case ::c10d::ReduceOp::BXOR:
      return "BXOR";
    default: {
      bool ok = false;
      ReduceOp r = toReduceOp(op, &ok);
      return ok ? reduceOpName(r) : "UNUSED";
    }
  }
}

MoveType moveType(const at::Tensor& t) {
  bool ok = false;
  DataType d = toDataType(t.scalar_type(), &ok);
  if (ok) {
    return {d, static_cast<size_t>(t.numel())};
  }
  return {DataType::kUInt8, static_cast<size_t>(t.numel()) * t.element_size()};
}


} // namespace smddp
