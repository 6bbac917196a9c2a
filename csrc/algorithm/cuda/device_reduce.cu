#include "algorithm/cuda/device_reduce.h"

#include <cstdint>

#include "algorithm/reduce_ops.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

namespace {

using ops::Combine;

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

struct SourcePtrs {
  const void* ptr[kMaxDeviceSources];
};

// Storage types: float, and the bits of the half types.
struct F16 {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

template <typename T>
struct Conv;

template <>
struct Conv<float> {
  __device__ static float load(float x) {
    return x;
  }
  __device__ static float store(float x) {
    return x;
  }
};

template <>
struct Conv<F16> {
  __device__ static float load(F16 x) {
    return ops::f16ToFloat(x.bits);
  }
  __device__ static F16 store(float x) {
    return F16{ops::floatToF16(x)};
  }
};

template <>
struct Conv<Bf16> {
  __device__ static float load(Bf16 x) {
    return ops::bf16ToFloat(x.bits);
  }
  __device__ static Bf16 store(float x) {
    return Bf16{ops::floatToBf16(x)};
  }
};

// One 16-byte vector of T.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kElems = 16 / sizeof(T);
  T v[kElems];
};

template <bool kScale>
__device__ __forceinline__ float scaled(float x, float s) {
  if constexpr (kScale) {
    return ops::mul(x, s);
  } else {
    return x;
  }
}

template <bool kDivide>
__device__ __forceinline__ float finished(float x, float d) {
  if constexpr (kDivide) {
    return __fdiv_rn(x, d);
  } else {
    return x;
  }
}

template <typename T, Combine kC, bool kScale, bool kDivide>
__global__ void __launch_bounds__(kThreads) reduceVectorized(
    T* dst,
    SourcePtrs srcs,
    int nsrc,
    size_t nvec,
    float scale,
    float divisor) {
  using V = Vec<T>;
  constexpr int E = V::kElems;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < nvec;
       base += stride * kUnroll) {
    float acc[kUnroll][E];
    // Several independent loads in flight before the first use.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * blockDim.x;
      if (i < nvec) {
        V x = reinterpret_cast<const V*>(srcs.ptr[0])[i];
#pragma unroll
        for (int e = 0; e < E; ++e) {
          acc[u][e] = scaled<kScale>(Conv<T>::load(x.v[e]), scale);
        }
      }
    }
    for (int k = 1; k < nsrc; ++k) {
      V x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + static_cast<size_t>(u) * blockDim.x;
        if (i < nvec) {
          x[u] = reinterpret_cast<const V*>(srcs.ptr[k])[i];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          acc[u][e] = ops::combine<kC>(acc[u][e], scaled<kScale>(Conv<T>::load(x[u].v[e]), scale));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * blockDim.x;
      if (i < nvec) {
        V y;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          y.v[e] = Conv<T>::store(finished<kDivide>(acc[u][e], divisor));
        }
        reinterpret_cast<V*>(dst)[i] = y;
      }
    }
  }
}

// Elements from `first` on, one per thread (unaligned buffers, tails).
template <typename T, Combine kC, bool kScale, bool kDivide>
__global__ void __launch_bounds__(kThreads) reduceScalar(
    T* dst,
    SourcePtrs srcs,
    int nsrc,
    size_t first,
    size_t count,
    float scale,
    float divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float acc = scaled<kScale>(Conv<T>::load(static_cast<const T*>(srcs.ptr[0])[i]), scale);
    for (int k = 1; k < nsrc; ++k) {
      acc = ops::combine<kC>(acc, scaled<kScale>(Conv<T>::load(static_cast<const T*>(srcs.ptr[k])[i]), scale));
    }
    dst[i] = Conv<T>::store(finished<kDivide>(acc, divisor));
  }
}

int blocksFor(size_t items, int max_blocks) {
  size_t want = (items + kThreads - 1) / kThreads;
  if (want < 1) {
    want = 1;
  }
  return static_cast<int>(want < static_cast<size_t>(max_blocks) ? want : static_cast<size_t>(max_blocks));
}

template <typename T, Combine kC, bool kScale, bool kDivide>
void launchTyped(
    void* dst,
    const SourcePtrs& srcs,
    int nsrc,
    size_t count,
    float scale,
    float divisor,
    int max_blocks,
    cudaStream_t stream) {
  constexpr size_t E = Vec<T>::kElems;
  bool aligned = (reinterpret_cast<uintptr_t>(dst) & 15) == 0;
  for (int k = 0; k < nsrc; ++k) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(srcs.ptr[k]) & 15) == 0;
  }
  size_t done = 0;
  if (aligned && count >= E) {
    const size_t nvec = count / E;
    reduceVectorized<T, kC, kScale, kDivide><<<blocksFor((nvec + kUnroll - 1) / kUnroll, max_blocks), kThreads, 0, stream>>>(
        static_cast<T*>(dst), srcs, nsrc, nvec, scale, divisor);
    done = nvec * E;
  }
  if (done < count) {
    reduceScalar<T, kC, kScale, kDivide><<<blocksFor(count - done, max_blocks), kThreads, 0, stream>>>(
        static_cast<T*>(dst), srcs, nsrc, done, count, scale, divisor);
  }
}

template <typename T, Combine kC>
void launchScaled(
    void* dst,
    const SourcePtrs& srcs,
    int nsrc,
    size_t count,
    bool scale,
    bool divide,
    float premul,
    float divisor,
    int max_blocks,
    cudaStream_t stream) {
  if (scale) {
    // PREMUL_SUM's factor and AVG's division never meet in one op.
    launchTyped<T, kC, true, false>(dst, srcs, nsrc, count, premul, divisor, max_blocks, stream);
  } else if (divide) {
    launchTyped<T, kC, false, true>(dst, srcs, nsrc, count, premul, divisor, max_blocks, stream);
  } else {
    launchTyped<T, kC, false, false>(dst, srcs, nsrc, count, premul, divisor, max_blocks, stream);
  }
}

template <typename T>
void launchForType(
    const ReduceSpec& spec,
    void* dst,
    const SourcePtrs& srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize,
    int max_blocks,
    cudaStream_t stream) {
  const ops::OpTraits t = ops::traitsOf(spec.op);
  const bool scale = raw && t.scales_inputs;
  const bool divide = finalize && t.divides;
  const float premul = static_cast<float>(spec.premul);
  const float divisor = static_cast<float>(spec.divisor);
  switch (t.combine) {
    case Combine::kSum:
      return launchScaled<T, Combine::kSum>(dst, srcs, nsrc, count, scale, divide, premul, divisor, max_blocks, stream);
    case Combine::kProduct:
      return launchScaled<T, Combine::kProduct>(dst, srcs, nsrc, count, scale, divide, premul, divisor, max_blocks,
                                                stream);
    case Combine::kMin:
      return launchScaled<T, Combine::kMin>(dst, srcs, nsrc, count, scale, divide, premul, divisor, max_blocks, stream);
    case Combine::kMax:
      return launchScaled<T, Combine::kMax>(dst, srcs, nsrc, count, scale, divide, premul, divisor, max_blocks, stream);
  }
}

} // namespace

bool deviceReduceSupported(DataType dtype, ReduceOp op) {
  bool type_ok = false;
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      type_ok = true;
      break;
    case DataType::kFloat64:
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kBool:
    case DataType::kCount:
      type_ok = false;
      break;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kPremulSum:
      return type_ok;
    case ReduceOp::kCount:
      return false;
  }
  return false;
}

void launchReduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    Sources sources,
    Result result,
    int max_blocks,
    cudaStream_t stream) {
  const bool raw = sources == Sources::kInputs;
  const bool finalize = result == Result::kFinal;
  SMDDP_CHECK_ARG(nsrc >= 1 && nsrc <= kMaxDeviceSources, "the device reduction takes 1 to ", kMaxDeviceSources,
                  " sources (got ", nsrc, ")");
  SMDDP_CHECK_ARG(max_blocks >= 1, "the device reduction needs at least one block (got ", max_blocks, ")");
  SMDDP_CHECK_ARG(deviceReduceSupported(spec.dtype, spec.op), "no device reduction of ", dataTypeName(spec.dtype),
                  " with ", reduceOpName(spec.op));
  if (count == 0) {
    return;
  }
  // An error already pending belongs to earlier work (a kernel of the
  // caller's, say): name it so, not as this kernel's.
  const cudaError_t earlier = cudaGetLastError();
  if (earlier != cudaSuccess) {
    SMDDP_THROW(kComm, "the device reported an error from earlier work before the reduction was launched: ",
                cudaGetErrorName(earlier), " (", cudaGetErrorString(earlier), ")");
  }
  SourcePtrs s{};
  for (int k = 0; k < nsrc; ++k) {
    s.ptr[k] = srcs[k];
  }
  switch (spec.dtype) {
    case DataType::kFloat32:
      launchForType<float>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
      break;
    case DataType::kFloat16:
      launchForType<F16>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
      break;
    case DataType::kBFloat16:
      launchForType<Bf16>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
      break;
    case DataType::kFloat64:
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kBool:
    case DataType::kCount:
      SMDDP_THROW(kInvalidArgument, "no device reduction of ", dataTypeName(spec.dtype));
  }
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    SMDDP_THROW(kComm, "the reduction kernel could not be launched: ", cudaGetErrorName(launched), " (",
                cudaGetErrorString(launched), ")");
  }
}

void launchFinalize(
    const ReduceSpec& spec,
    void* dst,
    size_t count,
    Sources sources,
    int max_blocks,
    cudaStream_t stream) {
  const bool raw = sources == Sources::kInputs;
  const ops::OpTraits t = ops::traitsOf(spec.op);
  const bool scales = raw && t.scales_inputs && spec.premul != 1.0;
  const bool divides = t.divides && spec.divisor != 1.0;
  if (!scales && !divides) {
    return;
  }
  const void* src[1] = {dst};
  launchReduce(spec, dst, src, 1, count, sources, Result::kFinal, max_blocks, stream);
}

} // namespace smddp::algorithm::cuda
