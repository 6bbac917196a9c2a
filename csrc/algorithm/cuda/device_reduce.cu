#include "algorithm/cuda/device_reduce.h"

#include <cstdint>

#include "algorithm/cuda/load_kernel.h"
#include "algorithm/device_plan.h"
#include "algorithm/reduce_ops.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

namespace {

using ops::Combine;

constexpr int kThreads = 512;

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

// What every kernel of one launch reduces: `nseg` segments, segment s
// writing dst + s * dst_stride and reading src[k] + src_offset[s] for each
// source k (one segment: a plain reduction; several: the rails'
// ReduceScatter reduces every rail member's block of a chunk in one launch).
constexpr int kMaxSegments = 128;
struct Segments {
  uint8_t* dst;
  size_t dst_stride;
  const uint8_t* src[kMaxDeviceSources];
  size_t src_offset[kMaxSegments];
  int nseg;
  int nsrc;
  // PREMUL_SUM's factor on every source, AVG's division of the result.
  bool scale;
  bool divide;
  float premul;
  float divisor;
};

__device__ __forceinline__ float scaled(const Segments& g, float x) {
  return g.scale ? ops::mul(x, g.premul) : x;
}

__device__ __forceinline__ float finished(const Segments& g, float x) {
  return g.divide ? __fdiv_rn(x, g.divisor) : x;
}

// 16-byte vectors from element `first` of each segment, `nvec` per segment.
// A thread keeps kMaxSrc x kVecs vectors in flight (every source's loads
// issued before the first is combined), and combines them in source order 0,
// 1, ... so that the bits do not depend on which load lands first. kMaxSrc is
// the bucket of the launch's source count (2, 4, 8 or 16; sources past nsrc
// are never read).
// Threads per block of the vector kernel: 16 sources in flight need more
// registers than 512 threads a block leave each.
template <int kMaxSrc>
constexpr int kVectorThreads = kMaxSrc >= 16 ? 256 : kThreads;

template <typename T, Combine kC, int kMaxSrc>
__global__ void __launch_bounds__(kVectorThreads<kMaxSrc>) reduceVectors(Segments g, size_t first, size_t nvec) {
  using V = Vec<T>;
  constexpr int E = V::kElems;
  constexpr int kVecs = kMaxSrc >= 8 ? 1 : 8 / kMaxSrc;
  const size_t total = nvec * static_cast<size_t>(g.nseg);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kVecs;
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x * kVecs + threadIdx.x; base < total;
       base += stride) {
    V x[kMaxSrc][kVecs];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const size_t w = base + static_cast<size_t>(u) * blockDim.x;
      if (w < total) {
        const size_t seg = w / nvec;
        const size_t at = (first + (w - seg * nvec) * E) * sizeof(T) + g.src_offset[seg];
#pragma unroll
        for (int k = 0; k < kMaxSrc; ++k) {
          if (k < g.nsrc) {
            x[k][u] = *reinterpret_cast<const V*>(g.src[k] + at);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const size_t w = base + static_cast<size_t>(u) * blockDim.x;
      if (w < total) {
        const size_t seg = w / nvec;
        V y;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          float acc = scaled(g, Conv<T>::load(x[0][u].v[e]));
#pragma unroll
          for (int k = 1; k < kMaxSrc; ++k) {
            if (k < g.nsrc) {
              acc = ops::combine<kC>(acc, scaled(g, Conv<T>::load(x[k][u].v[e])));
            }
          }
          y.v[e] = Conv<T>::store(finished(g, acc));
        }
        const size_t at = (first + (w - seg * nvec) * E) * sizeof(T) + seg * g.dst_stride;
        *reinterpret_cast<V*>(g.dst + at) = y;
      }
    }
  }
}

// Elements [lo, hi) of each segment, one per thread (a head before the
// buffers are aligned, a tail, or buffers misaligned unalike).
template <typename T, Combine kC>
__global__ void __launch_bounds__(kThreads) reduceElements(Segments g, size_t lo, size_t hi) {
  const size_t n = hi - lo;
  const size_t total = n * static_cast<size_t>(g.nseg);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t w = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < total; w += stride) {
    const size_t seg = w / n;
    const size_t i = lo + (w - seg * n);
    const size_t at = i * sizeof(T) + g.src_offset[seg];
    float acc = scaled(g, Conv<T>::load(*reinterpret_cast<const T*>(g.src[0] + at)));
    for (int k = 1; k < g.nsrc; ++k) {
      acc = ops::combine<kC>(acc, scaled(g, Conv<T>::load(*reinterpret_cast<const T*>(g.src[k] + at))));
    }
    *reinterpret_cast<T*>(g.dst + i * sizeof(T) + seg * g.dst_stride) = Conv<T>::store(finished(g, acc));
  }
}

int blocksFor(size_t items, int max_blocks, int threads = kThreads) {
  size_t want = (items + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  if (want < 1) {
    want = 1;
  }
  return static_cast<int>(want < static_cast<size_t>(max_blocks) ? want : static_cast<size_t>(max_blocks));
}

template <typename T, Combine kC>
void launchTyped(const Segments& g, size_t count, int max_blocks, cudaStream_t stream) {
  uintptr_t srcs[kMaxDeviceSources];
  for (int k = 0; k < g.nsrc; ++k) {
    srcs[k] = reinterpret_cast<uintptr_t>(g.src[k]);
  }
  const AlignedSplit split = segmentsSplit(reinterpret_cast<uintptr_t>(g.dst), srcs, g.nsrc, g.src_offset, g.nseg,
                                           g.dst_stride, count, sizeof(T));
  const size_t segs = static_cast<size_t>(g.nseg);
  if (split.head > 0) {
    reduceElements<T, kC><<<blocksFor(split.head * segs, max_blocks), kThreads, 0, stream>>>(g, 0, split.head);
  }
  if (split.vectors > 0) {
    const size_t items = split.vectors * segs;
    if (g.nsrc <= 2) {
      reduceVectors<T, kC, 2><<<blocksFor((items + 3) / 4, max_blocks), kThreads, 0, stream>>>(g, split.head, split.vectors);
    } else if (g.nsrc <= 4) {
      reduceVectors<T, kC, 4><<<blocksFor((items + 1) / 2, max_blocks), kThreads, 0, stream>>>(g, split.head, split.vectors);
    } else if (g.nsrc <= 8) {
      reduceVectors<T, kC, 8><<<blocksFor(items, max_blocks), kThreads, 0, stream>>>(g, split.head, split.vectors);
    } else {
      reduceVectors<T, kC, 16><<<blocksFor(items, max_blocks, kVectorThreads<16>), kVectorThreads<16>, 0, stream>>>(
          g, split.head, split.vectors);
    }
  }
  if (split.tail > 0) {
    const size_t lo = split.head + split.vectors * split.elemsPerVector;
    reduceElements<T, kC><<<blocksFor(split.tail * segs, max_blocks), kThreads, 0, stream>>>(g, lo, count);
  }
}

template <typename T>
void launchForType(const ReduceSpec& spec, const Segments& g, size_t count, int max_blocks, cudaStream_t stream) {
  switch (ops::traitsOf(spec.op).combine) {
    case Combine::kSum:
      return launchTyped<T, Combine::kSum>(g, count, max_blocks, stream);
    case Combine::kProduct:
      return launchTyped<T, Combine::kProduct>(g, count, max_blocks, stream);
    case Combine::kMin:
      return launchTyped<T, Combine::kMin>(g, count, max_blocks, stream);
    case Combine::kMax:
      return launchTyped<T, Combine::kMax>(g, count, max_blocks, stream);
  }
}

void launchSegments(const ReduceSpec& spec, const Segments& g, size_t count, int max_blocks, cudaStream_t stream) {
  switch (spec.dtype) {
    case DataType::kFloat32:
      launchForType<float>(spec, g, count, max_blocks, stream);
      return;
    case DataType::kFloat16:
      launchForType<F16>(spec, g, count, max_blocks, stream);
      return;
    case DataType::kBFloat16:
      launchForType<Bf16>(spec, g, count, max_blocks, stream);
      return;
    case DataType::kFloat64:
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kBool:
    case DataType::kCount:
      SMDDP_THROW(kInvalidArgument, "no device reduction of ", dataTypeName(spec.dtype));
  }
}

// Checks, the pending-error check, the launch and its error, shared by the
// entry points.
void run(const ReduceSpec& spec, Segments& g, size_t count, Sources sources, Result result, int max_blocks,
         cudaStream_t stream) {
  SMDDP_CHECK_ARG(g.nsrc >= 1 && g.nsrc <= kMaxDeviceSources, "the device reduction takes 1 to ",
                  kMaxDeviceSources, " sources (got ", g.nsrc, ")");
  SMDDP_CHECK_ARG(g.nseg >= 1 && g.nseg <= kMaxSegments, "the device reduction takes 1 to ", kMaxSegments,
                  " segments (got ", g.nseg, ")");
  SMDDP_CHECK_ARG(max_blocks >= 1, "the device reduction needs at least one block (got ", max_blocks, ")");
  SMDDP_CHECK_ARG(deviceReduceSupported(spec.dtype, spec.op), "no device reduction of ", dataTypeName(spec.dtype),
                  " with ", reduceOpName(spec.op));
  if (count == 0) {
    return;
  }
  const ops::OpTraits t = ops::traitsOf(spec.op);
  g.scale = sources == Sources::kInputs && t.scales_inputs;
  g.divide = result == Result::kFinal && t.divides;
  g.premul = static_cast<float>(spec.premul);
  g.divisor = static_cast<float>(spec.divisor);
  // An error already pending belongs to earlier work (a kernel of the
  // caller's, say): name it so, not as this kernel's.
  const cudaError_t earlier = cudaGetLastError();
  if (earlier != cudaSuccess) {
    SMDDP_THROW(kComm, "the device reported an error from earlier work before the reduction was launched: ",
                cudaGetErrorName(earlier), " (", cudaGetErrorString(earlier), ")");
  }
  launchSegments(spec, g, count, max_blocks, stream);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    SMDDP_THROW(kComm, "the reduction kernel could not be launched: ", cudaGetErrorName(launched), " (",
                cudaGetErrorString(launched), ")");
  }
}

// Every kernel launchTyped can launch.
template <typename T, Combine kC>
void loadTyped() {
  constexpr const char* kWhat = "the reduction kernels";
  loadKernel(reduceElements<T, kC>, kWhat);
  loadKernel(reduceVectors<T, kC, 2>, kWhat);
  loadKernel(reduceVectors<T, kC, 4>, kWhat);
  loadKernel(reduceVectors<T, kC, 8>, kWhat);
  loadKernel(reduceVectors<T, kC, 16>, kWhat);
}

template <typename T>
void loadForType() {
  loadTyped<T, Combine::kSum>();
  loadTyped<T, Combine::kProduct>();
  loadTyped<T, Combine::kMin>();
  loadTyped<T, Combine::kMax>();
}

} // namespace

void loadReduceKernels() {
  loadForType<float>();
  loadForType<F16>();
  loadForType<Bf16>();
}

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
  Segments g{};
  g.dst = static_cast<uint8_t*>(dst);
  g.nseg = 1;
  g.nsrc = nsrc;
  for (int k = 0; k < nsrc && k < kMaxDeviceSources; ++k) {
    g.src[k] = static_cast<const uint8_t*>(srcs[k]);
  }
  run(spec, g, count, sources, result, max_blocks, stream);
}

void launchReduceSegments(
    const ReduceSpec& spec,
    void* dst,
    size_t dst_stride,
    const void* const* srcs,
    int nsrc,
    const size_t* src_offsets,
    int nseg,
    size_t count,
    Sources sources,
    Result result,
    int max_blocks,
    cudaStream_t stream) {
  for (int first = 0; first < nseg; first += kMaxSegments) {
    Segments g{};
    g.nseg = nseg - first < kMaxSegments ? nseg - first : kMaxSegments;
    g.dst = static_cast<uint8_t*>(dst) + static_cast<size_t>(first) * dst_stride;
    g.dst_stride = dst_stride;
    g.nsrc = nsrc;
    for (int k = 0; k < nsrc && k < kMaxDeviceSources; ++k) {
      g.src[k] = static_cast<const uint8_t*>(srcs[k]);
    }
    for (int seg = 0; seg < g.nseg; ++seg) {
      g.src_offset[seg] = src_offsets[first + seg];
    }
    run(spec, g, count, sources, result, max_blocks, stream);
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
