// Which tensor-core instructions a fast kernel with two implementations runs (CriticalKV's
// norms, fast_l1.cuh; the quadratic forms, fast_quad.cuh): Hopper wgmma where the sm_90a
// machine code runs, mma.sync elsewhere.
#pragma once

namespace kvtrim::gpu {

/// The tensor-core path of a kernel launch.
enum class MmaKernel {
  kAuto,      // wgmma on compute capability 9.0, else mma.sync
  kMmaSync,   // mma.sync m16n8k16 (any sm_80+ device)
  kWgmma,     // wgmma m64nNk16 (compute capability 9.0 only; else cudaErrorInvalidValue)
};

/// True on a compute capability 9.0 device (the current one), where the sm_90a code with
/// wgmma runs; newer devices JIT the compute_90 PTX, which has none. Remembered per device.
bool WgmmaAvailable();

/// Resolves `kernel` on the current device: *use_wgmma, or false when kWgmma cannot run.
bool ResolveMmaKernel(MmaKernel kernel, bool* use_wgmma);

}  // namespace kvtrim::gpu
