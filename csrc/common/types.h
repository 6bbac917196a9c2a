// Element types, reduction operators and collective kinds of the core,
// independent of torch (the backend maps at::ScalarType / c10d::ReduceOp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace smddp {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
  kCount,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg,
  kProduct,
  kMin,
  kMax,
  kPremulSum,
  kCount,
};

// The collectives the core implements, also carried in the per-op header
// every rank publishes so that disagreeing ranks are detected.
enum class CollectiveKind : uint8_t {
  kAllGather = 1,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
};

size_t elementSize(DataType t);
const char* dataTypeName(DataType t);
const char* reduceOpName(ReduceOp op);
// The op named `name` ("SUM", "PREMUL_SUM"...); false if none is.
bool reduceOpByName(const std::string& name, ReduceOp* op);
const char* collectiveName(CollectiveKind kind);
bool isFloating(DataType t);

// "allreduce(float32, 1024 elements, SUM)", for messages.
std::string describeCall(CollectiveKind kind, DataType dtype, ReduceOp op, uint64_t count, int root);

// Whether `op` is defined on `t`: AVG and PREMUL_SUM need a floating type;
// on bool, SUM/MAX mean OR and PRODUCT/MIN mean AND.
bool reduceOpSupported(DataType t, ReduceOp op);

} // namespace smddp
