// hd.h: DFLASH_HD marks a function compiled for the host and, under nvcc, for the device too: the
// one source of rules both a host executor and a GPU kernel run (decide.h, rng.h).
#pragma once

#ifdef __CUDACC__
#define DFLASH_HD __host__ __device__
#else
#define DFLASH_HD
#endif
