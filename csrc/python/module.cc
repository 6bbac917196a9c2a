// smddp._C: the Python binding of the backend and of a few core utilities.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>
#include <ATen/ops/empty_like.h>

#include "algorithm/reduce.h"
#include "backend/conversions.h"
#include "backend/device_path.h"
#include "backend/fallback_factory.h"
#include "backend/process_group_smddp.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/shm/segment.h"


namespace py = pybind11;

namespace {

// The holder torch uses for Backend objects: an intrusive_ptr whose
// destructor releases the GIL first (destroying a group joins threads that
// may need the GIL). Same layout as torch's, so a ProcessGroupSMDDP object can
// be handed to torch wherever it takes a Backend.
template <typename T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  NoGilHolder(const NoGilHolder&) = default;
  NoGilHolder(NoGilHolder&&) noexcept = default;
  NoGilHolder& operator=(const NoGilHolder&) = default;
  NoGilHolder& operator=(NoGilHolder&&) noexcept = default;
  /* implicit */ NoGilHolder(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  // pybind constructs holders from raw pointers of new objects.
  explicit NoGilHolder(T* impl) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~NoGilHolder() {
    if (impl_) {
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        impl_.reset();
      } else {
        impl_.reset();
      }
    }
  }
  T& operator*() const noexcept {
    return *impl_;
  }
  T* operator->() const noexcept {
    return impl_.get();
  }
  T* get() const noexcept {
    return impl_.get();
  }

 private:
  c10::intrusive_ptr<T> impl_;
};

} // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilHolder<T>, true)

namespace {

using smddp::ProcessGroupSMDDP;

smddp::DataType dataTypeOf(const at::Tensor& t) {
  bool ok = false;
  smddp::DataType d = smddp::toDataType(t.scalar_type(), &ok);
  TORCH_CHECK(ok, "smddp: dtype ", t.scalar_type(), " is not reduced by smddp");
  return d;
}

smddp::ReduceOp reduceOpFromName(const std::string& name) {
  smddp::ReduceOp op = smddp::ReduceOp::kSum;
  TORCH_CHECK_VALUE(smddp::reduceOpByName(name, &op), "smddp: unknown reduce op '", name, "'");
  return op;
}

// Reduces tensors with smddp's kernels (tests compare them with torch).
at::Tensor reduceTensors(
    const std::vector<at::Tensor>& srcs,
    const std::string& op,
    double premul,
    double divisor,
    bool raw,
    bool finalize) {
  TORCH_CHECK_VALUE(!srcs.empty(), "smddp: reduce needs at least one tensor");
  std::vector<at::Tensor> contiguous;
  std::vector<const void*> ptrs;
  for (const auto& s : srcs) {
    TORCH_CHECK_VALUE(s.is_cpu() && s.numel() == srcs[0].numel() && s.scalar_type() == srcs[0].scalar_type(),
                      "smddp: reduce needs CPU tensors of one dtype and size");
    contiguous.push_back(s.contiguous());
    ptrs.push_back(contiguous.back().data_ptr());
  }
  smddp::algorithm::ReduceSpec spec;
  spec.dtype = dataTypeOf(srcs[0]);
  spec.op = reduceOpFromName(op);
  spec.premul = premul;
  spec.divisor = divisor;
  TORCH_CHECK_VALUE(smddp::reduceOpSupported(spec.dtype, spec.op), "smddp: ", op, " is not defined for ",
                    srcs[0].scalar_type());
  at::Tensor out = at::empty_like(contiguous[0]);
  {
    py::gil_scoped_release release;
    smddp::algorithm::reduce(spec, out.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()),
                             static_cast<size_t>(out.numel()), raw, finalize);
  }
  return out;
}


py::list configKnobs() {
  py::list out;
  for (const auto& k : smddp::describeKnobs()) {
    py::dict d;
    d["name"] = k.name;
    d["agree"] = k.agree;
    d["kind"] = k.kind;
    d["default"] = k.default_value;
    d["domain"] = k.domain;
    d["help"] = k.help;
    out.append(d);
  }
  return out;
}

void checkConfig() {
  try {
    smddp::Config::fromEnv();
  } catch (const smddp::Error& e) {
    throw py::value_error(e.what());
  }
}

void setLogLevel(const std::string& level) {
  static const std::pair<const char*, smddp::LogLevel> kLevels[] = {
      {"debug", smddp::LogLevel::kDebug},
      {"info", smddp::LogLevel::kInfo},
      {"warn", smddp::LogLevel::kWarn},
      {"error", smddp::LogLevel::kError},
      {"off", smddp::LogLevel::kOff}};
  for (const auto& [name, value] : kLevels) {
    if (level == name) {
      smddp::setLogLevel(value);
      return;
    }
  }
  throw py::value_error("smddp: unknown log level '" + level + "'; use debug, info, warn, error or off");
}

void setFallbackFactory(py::object factory) {
  if (factory.is_none()) {
    smddp::setFallbackFactory(nullptr);
    return;
  }
  // Keep a reference for the life of the process: groups are created and
  // destroyed until interpreter shutdown.
  auto holder = std::make_shared<py::object>(std::move(factory));
  smddp::setFallbackFactory([holder](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout, const std::string& mode) {
    py::gil_scoped_acquire gil;
    py::object result = (*holder)(store, rank, size, timeout, mode);
    smddp::FallbackList out;
    for (auto item : result) {
      auto pair = item.cast<py::tuple>();
      std::string device = pair[0].cast<std::string>();
      auto* backend = pair[1].cast<::c10d::Backend*>();
      out.emplace_back(
          c10::Device(device).type(), c10::intrusive_ptr<::c10d::Backend>::reclaim_copy(backend));
    }
    return out;
  });
}

// The loader of the CUDA module: a Python callable that imports it and
// returns "" or why it could not (smddp/_cuda.py).
void setDevicePathLoader(py::object loader) {
  if (loader.is_none()) {
    smddp::setDevicePathLoader(nullptr);
    return;
  }
  auto holder = std::make_shared<py::object>(std::move(loader));
  smddp::setDevicePathLoader([holder]() -> std::string {
    py::gil_scoped_acquire gil;
    try {
      return (*holder)().cast<std::string>();
    } catch (const std::exception& e) {
      return e.what();
    }
  });
}

py::dict topologyDict(const ProcessGroupSMDDP& pg) {
  const auto& t = pg.topology();
  py::dict d;
  d["nodes"] = t.numNodes();
  d["node"] = t.myNode();
  d["local_rank"] = t.myLocalRank();
  d["local_size"] = t.localSize();
  d["uniform"] = t.uniform();
  py::list node_ranks;
  for (int n = 0; n < t.numNodes(); ++n) {
    node_ranks.append(py::cast(t.nodeRanks(n)));
  }
  d["node_ranks"] = node_ranks;
  return d;
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "smddp: hierarchical collectives for PyTorch (native part)";

  py::module_::import("torch.distributed");
  py::class_<ProcessGroupSMDDP, NoGilHolder<ProcessGroupSMDDP>, ::c10d::Backend>(m, "ProcessGroupSMDDP")
      .def(
          py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout, std::vector<int64_t> global_ranks,
                      std::string group_name) {
            return NoGilHolder<ProcessGroupSMDDP>(c10::make_intrusive<ProcessGroupSMDDP>(
                store, rank, size, timeout, std::move(global_ranks), std::move(group_name)));
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::arg("global_ranks") = std::vector<int64_t>{}, py::arg("group_name") = "",
          py::call_guard<py::gil_scoped_release>())
      .def("describe", &ProcessGroupSMDDP::describe)
      .def("topology", &topologyDict)
      .def("nic", [](const ProcessGroupSMDDP& pg) {
        py::dict d;
        d["name"] = pg.nic().name;
        d["address"] = pg.nic().host();
        return d;
      })
      .def("fallback", [](const ProcessGroupSMDDP& pg, const std::string& device) -> py::object {
        auto fb = pg.fallback(c10::Device(device).type());
        if (!fb) {
          return py::none();
        }
        return py::cast(fb);
      })
      // Non-members of a split call this on the parent; smddp groups meet
      // through the store, so they have nothing to do.
      .def("perform_nocolor_split", [](ProcessGroupSMDDP&, const py::object&) {})
      .def("comm_split_count", [](ProcessGroupSMDDP&) { return 0; });

  m.def("set_fallback_factory", &setFallbackFactory, py::arg("factory"));
  m.def("config_knobs", &configKnobs);
  m.def("check_config", &checkConfig);
  m.def("set_log_level", &setLogLevel, py::arg("level"));
  m.def("reduce_kernel_isa", [] { return std::string(smddp::algorithm::reduceKernelIsa()); });
  m.def("set_reduce_kernel_isa", [](const std::string& isa) {
    try {
      smddp::algorithm::setReduceKernelIsa(isa.c_str());
    } catch (const smddp::Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("sweep_stale_segments", &smddp::transport::sweepStaleSegments);
  m.def("reduce", &reduceTensors, py::arg("tensors"), py::arg("op"), py::arg("premul") = 1.0,
        py::arg("divisor") = 1.0, py::arg("raw") = true, py::arg("finalize") = true);
  m.attr("torch_version") = py::str(TORCH_VERSION);
  m.def("set_device_path_loader", &setDevicePathLoader, py::arg("loader"));
  // What a CUDA tensor's first native collective would get: "" when the
  // device path is available, else why not (loads the CUDA module once).
  m.def(
      "device_path_status",
      [] {
        std::string why;
        smddp::devicePathFactory(&why);
        return why;
      },
      py::call_guard<py::gil_scoped_release>());
}
