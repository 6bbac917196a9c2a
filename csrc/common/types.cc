#include "common/types.h"

#include "common/error.h"

namespace smddp {

size_t elementSize(DataType t) {
  switch (t) {
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool:
      return 1;
    default:
      return 0;
  }
}

const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBool:
      return "bool";
    default:
      return "unknown";
  }
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kPremulSum:
      return "PREMUL_SUM";
    default:
      return "unknown";
  }
}

bool reduceOpByName(const std::string& name, ReduceOp* op) {
  for (int i = 0; i < static_cast<int>(ReduceOp::kCount); ++i) {
    const auto candidate = static_cast<ReduceOp>(i);
    if (name == reduceOpName(candidate)) {
      *op = candidate;
      return true;
    }
  }
  return false;
}

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

bool isFloating(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 ||
      t == DataType::kFloat16 || t == DataType::kBFloat16;
}

bool reduceOpSupported(DataType t, ReduceOp op) {
  if (t >= DataType::kCount || op >= ReduceOp::kCount) {
    return false;
  }
  if (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) {
    return isFloating(t);
  }
  return true;
}

std::string describeCall(
    CollectiveKind kind,
    DataType dtype,
    ReduceOp op,
    uint64_t count,
    int root) {
  std::string s = str(collectiveName(kind), "(");
  if (kind == CollectiveKind::kBarrier) {
    return s + ")";
  }
  s += str(dataTypeName(dtype), ", ", count, count == 1 ? " element" : " elements");
  if (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce) {
    s += str(", ", reduceOpName(op));
  }
  if (kind == CollectiveKind::kBroadcast) {
    s += str(", root ", root);
  }
  return s + ")";
}

} // namespace smddp
