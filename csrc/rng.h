// rng.h: a stateless counter-based RNG (Philox4x32-10), keyed by (seed, request, position, draw).
//
// Why counter-based: a request's uniforms are a pure function of its own key, so a seeded request
// samples the same tokens alone or in any batch, in any order, on any thread, and a rolled-back
// position redraws exactly what it drew before. There is no generator state to share or advance.
//
// Philox4x32-10 as published by Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as
// 1, 2, 3" (SC'11): a 4x32-bit counter and a 2x32-bit key, ten rounds of two 32x32->64 multiplies,
// the key bumped by Weyl constants between rounds. Checked against the paper's known-answer vectors
// (tests/core/test_rng.py). Compiled for the device too (hd.h): a GPU kernel draws the same numbers.
#pragma once

#include <array>
#include <cstdint>

#include "hd.h"

namespace dflash {

using Philox4x32Counter = std::array<uint32_t, 4>;
using Philox4x32Key = std::array<uint32_t, 2>;

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

DFLASH_HD inline Philox4x32Counter round(const Philox4x32Counter& x, const Philox4x32Key& k) {
  const uint64_t p0 = uint64_t(kMul0) * x[0];
  const uint64_t p1 = uint64_t(kMul1) * x[2];
  const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
  const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
  return {hi1 ^ x[1] ^ k[0], lo1, hi0 ^ x[3] ^ k[1], lo0};
}
}  // namespace philox_detail

// The raw block function: 10 rounds, the key bumped before rounds 2..10.
DFLASH_HD inline Philox4x32Counter philox4x32_10(Philox4x32Counter x, Philox4x32Key k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += philox_detail::kWeyl0;
      k[1] += philox_detail::kWeyl1;
    }
    x = philox_detail::round(x, k);
  }
  return x;
}

// What the sampler draws at one key. Draw index 1 is the categorical draw for the token emitted at
// that position (a plain sample, the target's draw that a draft is compared with, or a draw from the
// residual after a rejection: acceptance.h); 2 draws a draft from the drafter's distribution and 3
// decides whether the target keeps it (the drafter-distribution rule); index 0 is unused. Layout:
// key = seed, counter = (position, draw, request lo, request hi).
enum Draw : uint32_t { kCategoricalDraw = 1, kDraftDraw = 2, kAcceptDraw = 3 };

// A uniform double in [0, 1) with 53 random bits (from the first two output words).
DFLASH_HD inline double uniform(uint64_t seed, uint64_t request, uint32_t position, uint32_t draw) {
  const Philox4x32Counter out = philox4x32_10(
      {position, draw, uint32_t(request), uint32_t(request >> 32)}, {uint32_t(seed), uint32_t(seed >> 32)});
  const uint64_t bits = (uint64_t(out[0]) << 21) ^ (uint64_t(out[1]) >> 11);  // 32 + 21 = 53 bits
  return double(bits) * 0x1.0p-53;
}

}  // namespace dflash
