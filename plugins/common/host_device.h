// Marks a function shared by a CPU reference and a CUDA kernel: one rule, compiled for both sides.
#pragma once

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

// DFLASH_UNROLL_ALL: unroll the next loop (of a constant trip count) fully on the device, so that an
// array it indexes stays in registers; the host compiler decides for itself.
#ifdef __CUDA_ARCH__
#define DFLASH_UNROLL_ALL _Pragma("unroll")
#else
#define DFLASH_UNROLL_ALL
#endif
