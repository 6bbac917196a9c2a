#include "algorithm/cuda/device_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace smddp::algorithm::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

struct Sources {
  const void* ptr[kMaxDeviceSources];
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
struct Conv<__half> {
  __device__ static float load(__half x) {
    return __half2float(x);
  }
  __device__ static __half store(float x) {
    return __float2half_rn(x);
  }
};

template <>
struct Conv<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 x) {
    return __bfloat162float(x);
  }
  __device__ static __nv_bfloat16 store(float x) {
    return __float2bfloat16_rn(x);
  }
};

template <ReduceOp kOp>
__device__ __forceinline__ float combine(float a, float b) {
  if constexpr (kOp == ReduceOp::kProduct) {
    return a * b;
  } else if constexpr (kOp == ReduceOp::kMin) {
    return (a < b || a != a) ? a : b;
  } else if constexpr (kOp == ReduceOp::kMax) {
    return (a > b || a != a) ? a : b;
  } else {
    return a + b;
  }
}

// One 16-byte vector of T.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kElems = 16 / sizeof(T);
  T v[kElems];
};

template <typename T, ReduceOp kOp, bool kScale, bool kDivide>
__global__ void __launch_bounds__(kThreads) reduceVectorized(
    T* dst,
    Sources srcs,
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
          float f = Conv<T>::load(x.v[e]);
          acc[u][e] = kScale ? f * scale : f;
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
          float f = Conv<T>::load(x[u].v[e]);
          acc[u][e] = combine<kOp>(acc[u][e], kScale ? f * scale : f);
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
          y.v[e] = Conv<T>::store(kDivide ? acc[u][e] / divisor : acc[u][e]);
        }
        reinterpret_cast<V*>(dst)[i] = y;
      }
    }
  }
}

// Elements from `first` on, one per thread (unaligned buffers, tails).
template <typename T, ReduceOp kOp, bool kScale, bool kDivide>
__global__ void __launch_bounds__(kThreads) reduceScalar(
    T* dst,
    Sources srcs,
    int nsrc,
    size_t first,
    size_t count,
    float scale,
    float divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float f = Conv<T>::load(static_cast<const T*>(srcs.ptr[0])[i]);
    float acc = kScale ? f * scale : f;
    for (int k = 1; k < nsrc; ++k) {
      float g = Conv<T>::load(static_cast<const T*>(srcs.ptr[k])[i]);
      acc = combine<kOp>(acc, kScale ? g * scale : g);
    }
    dst[i] = Conv<T>::store(kDivide ? acc / divisor : acc);
  }
}

int blocksFor(size_t items, int max_blocks) {
  size_t want = (items + kThreads - 1) / kThreads;
  if (want < 1) {
    want = 1;
  }
  return static_cast<int>(want < static_cast<size_t>(max_blocks) ? want : static_cast<size_t>(max_blocks));
}

template <typename T, ReduceOp kOp, bool kScale, bool kDivide>
cudaError_t launchTyped(
    void* dst,
    const Sources& srcs,
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
    reduceVectorized<T, kOp, kScale, kDivide><<<blocksFor((nvec + kUnroll - 1) / kUnroll, max_blocks), kThreads, 0, stream>>>(
        static_cast<T*>(dst), srcs, nsrc, nvec, scale, divisor);
    done = nvec * E;
  }
  if (done < count) {
    reduceScalar<T, kOp, kScale, kDivide><<<blocksFor(count - done, max_blocks), kThreads, 0, stream>>>(
        static_cast<T*>(dst), srcs, nsrc, done, count, scale, divisor);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launchForType(
    const ReduceSpec& spec,
    void* dst,
    const Sources& srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize,
    int max_blocks,
    cudaStream_t stream) {
  const float scale = static_cast<float>(spec.premul);
  const float divisor = static_cast<float>(spec.divisor);
  const bool divide = finalize && spec.op == ReduceOp::kAvg;
  switch (spec.op) {
    case ReduceOp::kSum:
      return launchTyped<T, ReduceOp::kSum, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    case ReduceOp::kAvg:
      return divide
          ? launchTyped<T, ReduceOp::kSum, false, true>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream)
          : launchTyped<T, ReduceOp::kSum, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    case ReduceOp::kPremulSum:
      return raw
          ? launchTyped<T, ReduceOp::kSum, true, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream)
          : launchTyped<T, ReduceOp::kSum, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    case ReduceOp::kProduct:
      return launchTyped<T, ReduceOp::kProduct, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    case ReduceOp::kMin:
      return launchTyped<T, ReduceOp::kMin, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    case ReduceOp::kMax:
      return launchTyped<T, ReduceOp::kMax, false, false>(dst, srcs, nsrc, count, scale, divisor, max_blocks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

} // namespace

bool deviceReduceSupported(DataType dtype, ReduceOp op) {
  const bool type_ok =
      dtype == DataType::kFloat32 || dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
  return type_ok && op < ReduceOp::kCount;
}

cudaError_t launchReduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize,
    int max_blocks,
    cudaStream_t stream) {
  if (count == 0) {
    return cudaSuccess;
  }
  if (nsrc < 1 || nsrc > kMaxDeviceSources || max_blocks < 1) {
    return cudaErrorInvalidValue;
  }
  Sources s{};
  for (int k = 0; k < nsrc; ++k) {
    s.ptr[k] = srcs[k];
  }
  switch (spec.dtype) {
    case DataType::kFloat32:
      return launchForType<float>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
    case DataType::kFloat16:
      return launchForType<__half>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
    case DataType::kBFloat16:
      return launchForType<__nv_bfloat16>(spec, dst, s, nsrc, count, raw, finalize, max_blocks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launchFinalize(
    const ReduceSpec& spec,
    void* dst,
    size_t count,
    bool raw,
    int max_blocks,
    cudaStream_t stream) {
  const bool scales = raw && spec.op == ReduceOp::kPremulSum && spec.premul != 1.0;
  const bool divides = spec.op == ReduceOp::kAvg && spec.divisor != 1.0;
  if (!scales && !divides) {
    return cudaSuccess;
  }
  const void* src[1] = {dst};
  return launchReduce(spec, dst, src, 1, count, raw, true, max_blocks, stream);
}

} // namespace smddp::algorithm::cuda
