// hd.h: DFLASH_HD marks a function compiled for the host and, under nvcc, for the device too: the
// one source of rules both a host executor and a GPU kernel run (decide.h, rng.h).
#pragma once

#ifdef __CUDACC__
#define DFLASH_HD __host__ __device__
#else
#define DFLASH_HD
#endif

// DFLASH_UNROLL(n): unroll the next loop n times on the device, so a thread issues n iterations'
// independent loads before it waits on the first (the host compiler decides for itself).
#ifdef __CUDA_ARCH__
#define DFLASH_PRAGMA(x) _Pragma(#x)
#define DFLASH_UNROLL(n) DFLASH_PRAGMA(unroll n)
#else
#define DFLASH_UNROLL(n)
#endif
