// Marks a function shared by a CPU reference and a CUDA kernel: one rule, compiled for both sides.
#pragma once

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif
