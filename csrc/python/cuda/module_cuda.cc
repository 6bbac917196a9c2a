// smddp._C_cuda: the CUDA path (registered with the backend when this module
// is imported, see backend/device_path.h) and the device reduction kernel for
// the kernel tests and benchmarks.
#include <pybind11/stl.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "algorithm/cuda/device_reduce.h"
#include "backend/conversions.h"
#include "backend/cuda/cuda_path.h"
#include "backend/device_path.h"
#include "common/error.h"

namespace py = pybind11;

namespace {

smddp::ReduceOp reduceOpFromName(const std::string& name) {
  smddp::ReduceOp op = smddp::ReduceOp::kSum;
  if (!smddp::reduceOpByName(name, &op)) {
    throw py::value_error("smddp: unknown reduce op '" + name + "'");
  }
  return op;
}

// The device reduction kernel on CUDA tensors, on the current stream.
at::Tensor deviceReduce(
    const std::vector<at::Tensor>& srcs,
    const std::string& op,
    int max_blocks,
    std::optional<at::Tensor> out,
    double premul,
    double divisor,
    bool raw,
    bool finalize) {
  if (srcs.empty() || srcs.size() > static_cast<size_t>(smddp::algorithm::kMaxDeviceSources)) {
    throw py::value_error(smddp::str("smddp: device_reduce takes 1 to ", smddp::algorithm::kMaxDeviceSources,
                                     " tensors (got ", srcs.size(), ")"));
  }
  std::vector<const void*> ptrs;
  for (const auto& s : srcs) {
    if (!(s.is_cuda() && s.is_contiguous() && s.numel() == srcs[0].numel() &&
          s.scalar_type() == srcs[0].scalar_type() && s.device() == srcs[0].device())) {
      throw py::value_error("smddp: device_reduce needs contiguous CUDA tensors of one dtype, size and device");
    }
    ptrs.push_back(s.data_ptr());
  }
  smddp::algorithm::ReduceSpec spec;
  bool ok = false;
  spec.dtype = smddp::toDataType(srcs[0].scalar_type(), &ok);
  spec.op = reduceOpFromName(op);
  if (!ok || !smddp::algorithm::cuda::deviceReduceSupported(spec.dtype, spec.op)) {
    throw py::value_error(smddp::str("smddp: no device reduction ", op, " of ", srcs[0].scalar_type(),
                                     " tensors; use float32, float16 or bfloat16"));
  }
  spec.premul = premul;
  spec.divisor = divisor;
  if (out.has_value()) {
    const at::Tensor& o = *out;
    if (!(o.is_cuda() && o.is_contiguous() && o.numel() == srcs[0].numel() &&
          o.scalar_type() == srcs[0].scalar_type() && o.device() == srcs[0].device())) {
      throw py::value_error(smddp::str("smddp: device_reduce's out must be a contiguous CUDA tensor of ",
                                       srcs[0].numel(), " ", srcs[0].scalar_type(), " elements on ",
                                       srcs[0].device()));
    }
  }
  at::Tensor dst = out.has_value() ? *out : at::empty_like(srcs[0]);
  c10::cuda::CUDAGuard guard(srcs[0].device());
  try {
    smddp::algorithm::cuda::launchReduce(spec, dst.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()),
                                         static_cast<size_t>(dst.numel()),
                                         raw ? smddp::algorithm::Sources::kInputs : smddp::algorithm::Sources::kPartials,
                                         finalize ? smddp::algorithm::Result::kFinal : smddp::algorithm::Result::kPartial,
                                         max_blocks,
                                         c10::cuda::getCurrentCUDAStream().stream());
  } catch (const smddp::Error& e) {
    if (e.kind() == smddp::ErrorKind::kInvalidArgument) {
      throw py::value_error(std::string("smddp: ") + e.what());
    }
    throw std::runtime_error(std::string("smddp: ") + e.what());
  }
  return dst;
}

} // namespace

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "smddp: the CUDA path (native part)";
  py::module_::import("smddp._C");
  smddp::registerDevicePathFactory(
      [](const smddp::DevicePathArgs& args) { return std::make_unique<smddp::CudaPath>(args); });
  m.def("device_reduce", &deviceReduce, py::arg("tensors"), py::arg("op"), py::arg("max_blocks") = 32,
        py::arg("out") = std::nullopt, py::arg("premul") = 1.0, py::arg("divisor") = 1.0, py::arg("raw") = true,
        py::arg("finalize") = true);
  m.attr("max_sources") = smddp::algorithm::kMaxDeviceSources;
  m.attr("cuda_runtime_built") = CUDART_VERSION;
  m.attr("nccl_built") = NCCL_VERSION_CODE;
  m.def("nccl_runtime", [] {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  });
  m.def("cuda_runtime", [] {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
  });
}
