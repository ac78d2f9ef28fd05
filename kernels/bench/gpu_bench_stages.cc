#include "kernels/bench/gpu_bench_stages.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu::bench {
namespace {

/// The armed recorder, or nullptr (the bench is single-threaded).
LaunchRecorder* g_armed = nullptr;

/// libcudart's definition of `symbol` (the next one after this executable's hook); aborts
/// when there is none, since no CUDA call could work then.
void* RealSymbol(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "kvtrim_gpu_bench: no CUDA runtime definition of %s\n", symbol);
    std::abort();
  }
  return fn;
}

/// `mangled` demangled, without its return type, "(anonymous namespace)::" qualifiers and
/// parameter list: "void kvtrim::gpu::fast::(anonymous namespace)::PassA<8>(...)" becomes
/// "kvtrim::gpu::fast::PassA<8>".
std::string Demangled(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  static constexpr std::string_view kAnonymous = "(anonymous namespace)::";
  for (size_t at = name.find(kAnonymous); at != std::string::npos; at = name.find(kAnonymous)) {
    name.erase(at, kAnonymous.size());
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  if (const size_t paren = name.find('('); paren != std::string::npos) name.resize(paren);
  return name;
}

/// The name of a host entry function (cudaFuncGetName), or "kernel".
std::string EntryName(const void* func) {
  const char* mangled = nullptr;
  if (func == nullptr || cudaFuncGetName(&mangled, func) != cudaSuccess || mangled == nullptr) {
    cudaGetLastError();  // a failed lookup must not linger as the last error
    return "kernel";
  }
  return Demangled(mangled);
}

/// The kernel's demangled name without its parameter list ("kernel" when the driver cannot
/// name it): cuKernelGetName through the runtime's driver entry point, so that the bench
/// needs no link against libcuda.
std::string KernelName(const void* kernel) {
  using GetName = int (*)(const char**, const void*);
  static GetName get_name = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuKernelGetName", &fn, 12030, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return GetName{nullptr};
    }
    return reinterpret_cast<GetName>(fn);
  }();
  const char* mangled = nullptr;
  if (get_name == nullptr || kernel == nullptr || get_name(&mangled, kernel) != 0 ||
      mangled == nullptr) {
    return "kernel";
  }
  return Demangled(mangled);
}

}  // namespace

LaunchRecorder::~LaunchRecorder() {
  if (g_armed == this) g_armed = nullptr;
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

absl::Status LaunchRecorder::Init(int max_launches) {
  events_.resize(static_cast<size_t>(max_launches) + 1, nullptr);
  for (cudaEvent_t& e : events_) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e), "cudaEventCreate");
  }
  return absl::OkStatus();
}

absl::Status LaunchRecorder::Begin(cudaStream_t stream) {
  launches_.clear();
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[0], stream), "cudaEventRecord");
  g_armed = this;
  return absl::OkStatus();
}

void LaunchRecorder::AfterLaunch(cudaStream_t stream, const char* kind, const void* kernel,
                                 bool entry) {
  if (launches_.size() + 1 >= events_.size()) {
    truncated_ = true;
    return;
  }
  launches_.push_back({kind, kernel, entry});
  cudaEventRecord(events_[launches_.size()], stream);
}

absl::Status LaunchRecorder::End() {
  g_armed = nullptr;
  if (launches_.empty()) return absl::OkStatus();
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[launches_.size()]),
                              "cudaEventSynchronize");
  std::vector<double> ms(launches_.size());
  for (size_t i = 0; i < launches_.size(); ++i) {
    float elapsed = 0;
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, events_[i], events_[i + 1]),
                                "cudaEventElapsedTime");
    ms[i] = elapsed;
  }
  sequences_.push_back(launches_);
  ms_.push_back(std::move(ms));
  return absl::OkStatus();
}

std::vector<StageTime> LaunchRecorder::TakeMedians() {
  std::vector<StageTime> out;
  if (!sequences_.empty()) {
    const std::vector<Launch>& first = sequences_.front();
    for (size_t i = 0; i < first.size(); ++i) {
      std::vector<double> samples;
      for (size_t r = 0; r < sequences_.size(); ++r) {
        const std::vector<Launch>& seq = sequences_[r];
        if (seq.size() != first.size() || seq[i].kernel != first[i].kernel) continue;
        samples.push_back(ms_[r][i]);
      }
      const Launch& l = first[i];
      const std::string name = l.kernel == nullptr ? ""
                               : l.entry          ? EntryName(l.kernel)
                                                  : KernelName(l.kernel);
      out.push_back({l.kind, name, 1e3 * Median(samples)});
    }
  }
  if (truncated_) out.push_back({"truncated", "more launches than the event pool", 0});
  sequences_.clear();
  ms_.clear();
  truncated_ = false;
  return out;
}

}  // namespace kvtrim::gpu::bench

// ---- Hooks: this executable's definitions of the runtime entry points (see the header). ----

extern "C" {

/// The launch entry point of nvcc's CUDA 13 kernel stubs (crt/device_functions.h).
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_mem, cudaStream_t stream) {
  using Fn = cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);
  static const Fn real = reinterpret_cast<Fn>(kvtrim::gpu::bench::RealSymbol("__cudaLaunchKernel"));
  const cudaError_t err = real(kernel, grid, block, args, shared_mem, stream);
  if (err == cudaSuccess && kvtrim::gpu::bench::g_armed != nullptr) {
    kvtrim::gpu::bench::g_armed->AfterLaunch(stream, "kernel", kernel);
  }
  return err;
}

/// cudaLaunchKernelEx's entry point (cluster launches such as the fused selection).
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  using Fn = cudaError_t (*)(const cudaLaunchConfig_t*, const void*, void**);
  static const Fn real =
      reinterpret_cast<Fn>(kvtrim::gpu::bench::RealSymbol("cudaLaunchKernelExC"));
  const cudaError_t err = real(config, func, args);
  if (err == cudaSuccess && kvtrim::gpu::bench::g_armed != nullptr) {
    kvtrim::gpu::bench::g_armed->AfterLaunch(config->stream, "kernel", func, /*entry=*/true);
  }
  return err;
}

/// cudaMemsetAsync, recorded while armed.
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  using Fn = cudaError_t (*)(void*, int, size_t, cudaStream_t);
  static const Fn real = reinterpret_cast<Fn>(kvtrim::gpu::bench::RealSymbol("cudaMemsetAsync"));
  const cudaError_t err = real(ptr, value, count, stream);
  if (err == cudaSuccess && kvtrim::gpu::bench::g_armed != nullptr) {
    kvtrim::gpu::bench::g_armed->AfterLaunch(stream, "memset", nullptr);
  }
  return err;
}

/// cudaMemcpyAsync, recorded while armed.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  using Fn = cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  static const Fn real = reinterpret_cast<Fn>(kvtrim::gpu::bench::RealSymbol("cudaMemcpyAsync"));
  const cudaError_t err = real(dst, src, count, kind, stream);
  if (err == cudaSuccess && kvtrim::gpu::bench::g_armed != nullptr) {
    kvtrim::gpu::bench::g_armed->AfterLaunch(stream, "memcpy", nullptr);
  }
  return err;
}

}  // extern "C"
