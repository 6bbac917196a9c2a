// Loading a kernel into the current device's context before its first launch
// (see loadReduceKernels in device_reduce.h for why), for the .cu files.
#pragma once

#include <cuda_runtime.h>

#include "common/error.h"

namespace smddp::algorithm::cuda {

// Loads `kernel` now (asking for its attributes does). Throws kComm: "`what`
// could not be loaded: <the CUDA error>".
template <typename Kernel>
void loadKernel(Kernel* kernel, const char* what) {
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) {
    SMDDP_THROW(kComm, what, " could not be loaded: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

} // namespace smddp::algorithm::cuda
