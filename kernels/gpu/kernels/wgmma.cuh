// Hopper warpgroup MMA (wgmma, sm_90a only) building blocks: the shared-memory matrix
// descriptor of a K-major tile in the 128-byte swizzle, the fences and group waits, and
// wgmma.mma_async m64n64k16 with f16 operands, A from registers and fp32 accumulate.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   A (64x16, registers): warp w of the warpgroup holds rows 16 w .. 16 w + 15 in the
//     mma.m16n8k16 A layout (fast_mma.cuh).
//   B (16x64, shared): K-major, 128-byte swizzle: row r of the tile (one output column) keeps
//     64 consecutive k values in 128 bytes at r * 128 of its 64-wide k slab, and its 16-byte
//     piece c sits at piece c ^ (r % 8). Slabs are [rows][128 B] blocks; 8-row groups lie 1024
//     bytes apart (the descriptor's stride); every slab starts 1024-byte aligned. The k-step
//     kk of a slab starts 32 kk bytes into it (the hardware applies the swizzle to the
//     address bits).
//   D (64x64, fp32): d[4 i + e] of lane 4 g + t of warp w is row 16 w + g + 8 (e / 2),
//     column 8 i + 2 t + e % 2 (the mma.m16n8k16 C layout, eight n8 tiles).
// Everything here compiles to nothing but a trap outside sm_90a (KVTRIM_HAS_WGMMA = 0): the
// launchers only pick wgmma kernels on compute capability 9.0 devices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVTRIM_HAS_WGMMA 1
#else
#define KVTRIM_HAS_WGMMA 0
#endif

namespace kvtrim::gpu::wgmma {

/// The descriptor of a K-major, 128-byte swizzled B tile whose k-step starts at the shared
/// address `smem_address` (see the file comment): start >> 4 in bits 0-13, the leading
/// byte offset (unused by swizzled K-major tiles) 16 bytes, the stride 1024 bytes between
/// 8-row groups, swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t DescriptorSw128(uint32_t smem_address) {
  uint64_t desc = static_cast<uint64_t>((smem_address & 0x3FFFFu) >> 4);
  desc |= uint64_t{1} << 16;
  desc |= uint64_t{1024 >> 4} << 32;
  desc |= uint64_t{1} << 62;
  return desc;
}

/// Orders earlier register accesses before the next wgmma.mma_async.
__device__ __forceinline__ void Fence() {
#if KVTRIM_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

/// Closes the wgmma.mma_async issued since the last commit as one group.
__device__ __forceinline__ void Commit() {
#if KVTRIM_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

/// Waits until at most `N` committed groups are still in flight.
template <int N>
__device__ __forceinline__ void Wait() {
#if KVTRIM_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to
/// the async proxy that wgmma reads through; a barrier must follow before another thread's
/// wgmma reads them.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if KVTRIM_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Ties the registers of `d` to this point of the program: the compiler may not move their
/// reads before it (used after Wait, whose asm does not name them).
template <int N>
__device__ __forceinline__ void Pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// d = A B (+ d when `accumulate`) for one m64n64k16 step: A from registers (f16), B by
/// descriptor (f16), fp32 accumulators. Asynchronous: d may be read only after Wait.
__device__ __forceinline__ void MmaM64N64K16(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t desc_b, bool accumulate) {
#if KVTRIM_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
        "r"(static_cast<int>(accumulate)));
#endif
}

}  // namespace kvtrim::gpu::wgmma
