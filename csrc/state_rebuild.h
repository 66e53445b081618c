// state_rebuild.h: a hybrid target's linear-attention states at a partly accepted block's last kept
// position, rebuilt at commit from the states before the block and what the block's positions fed
// the layer, so that a verify keeps a few KiB per position instead of a whole state per position.
//
// The target graph returns, per Gated DeltaNet layer, the states after each row's last logits row
// (what a prefill and a fully accepted block commit), and for every fed position its conv input
// column (`conv_inputs_<i>` [C, s], the bundle's dtype) and what its recurrence step reads
// (`delta_inputs_<i>` [s, W] float32: the raw key [Hk * Dk], the value [Hv * Dv], the log decay g
// [Hv] and the write strength beta [Hv]). A commit of 0 < kept < len positions advances the slot's
// states (still the ones before the block: the graph reads them, never writes them) over positions
// 0 .. kept - 1 by the rules of dflash_trt/export/delta_rule.py, written once for the host and a GPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "hd.h"

namespace dflash {

struct DeltaShape {
  int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;

  // floats per position of delta_inputs: key, value, g, beta
  DFLASH_HD int64_t width() const { return key_heads * key_dim + value_heads * value_dim + 2 * value_heads; }
};

// What position t of `inputs` [s, width] gives value head h's step: its key head's key (raw) and the
// reciprocal of its L2 norm (eps 1e-6), the head's values, exp(g) and beta.
struct DeltaStep {
  const float* key;
  const float* value;
  float scale, decay, beta;
};

DFLASH_HD inline DeltaStep delta_step(const float* inputs, int64_t t, const DeltaShape& d, int64_t h) {
  const int64_t Dk = d.key_dim, g_at = d.key_heads * Dk + d.value_heads * d.value_dim + h;
  const float* row = inputs + t * d.width();
  const float* key = row + h / (d.value_heads / d.key_heads) * Dk;
  float norm = 0.0f;
  for (int64_t k = 0; k < Dk; ++k) norm += key[k] * key[k];
  return {key, row + d.key_heads * Dk + h * d.value_dim, 1.0f / sqrtf(norm + 1e-6f), expf(row[g_at]),
          row[g_at + d.value_heads]};
}

// Column v of value head h of a recurrent state [Hv, Dk, Dv] (float32, in place), advanced over the
// first `kept` positions of `inputs`: per position, with k its key L2-normalised,
//     S <- S * exp(g);  S[:, v] += k * beta * (value[v] - S[:, v] . k).
DFLASH_HD inline void rebuild_delta_column(float* state, const float* inputs, int64_t kept, const DeltaShape& d,
                                           int64_t h, int64_t v) {
  const int64_t Dk = d.key_dim, Dv = d.value_dim;
  float* column = state + h * Dk * Dv + v;  // S[k, v] at column[k * Dv]
  for (int64_t t = 0; t < kept; ++t) {
    const DeltaStep step = delta_step(inputs, t, d, h);
    float read = 0.0f;
    for (int64_t k = 0; k < Dk; ++k) {
      column[k * Dv] *= step.decay;
      read += column[k * Dv] * (step.key[k] * step.scale);
    }
    const float delta = (step.value[v] - read) * step.beta;
    for (int64_t k = 0; k < Dk; ++k) column[k * Dv] += (step.key[k] * step.scale) * delta;
  }
}

// One channel's conv state [K-1] (elements of `element` bytes, in place) after the first `kept` of
// the block's inputs [s]: the last K-1 columns of (state, inputs[0 .. kept - 1]). In place is safe:
// column j reads column kept + j > j, which no earlier column's write reached.
DFLASH_HD inline void rebuild_conv_channel(char* state, const char* inputs, int64_t kept, int64_t width,
                                           int64_t element) {
  for (int64_t j = 0; j < width; ++j) {
    const int64_t from = kept + j;  // in the window (state's K-1 columns, then the inputs)
    const char* source = from < width ? state + from * element : inputs + (from - width) * element;
    for (int64_t b = 0; b < element; ++b) state[j * element + b] = source[b];
  }
}

struct RebuildRow {
  int64_t place = 0;    // the row's slice of the slot buffers
  int64_t run_row = 0;  // its row in the target Run's outputs
  int64_t kept = 0;     // positions kept: 0 < kept < the block's length
};

// One linear layer's rebuild over `count` rows of one target Run: recurrent states [max_batch, Hv, Dk,
// Dv] float32 and conv states [max_batch, C, K-1] (`element` bytes each) in place, from the Run's
// delta_inputs [n, tokens, width] and conv_inputs [n, C, tokens]. Pointers in the device's memory.
struct StateRebuild {
  float* recurrent = nullptr;
  const float* delta_inputs = nullptr;
  char* conv = nullptr;
  const char* conv_inputs = nullptr;
  const RebuildRow* rows = nullptr;
  int64_t count = 0, tokens = 0, channels = 0, conv_width = 0, element = 0;
  DeltaShape shape;
};

// rebuild_delta_column over every column of value head h at once, a key row at a time, so the host
// compiler vectorises over the columns; per column the same operations in the same order.
inline void rebuild_delta_head(float* state, const float* inputs, int64_t kept, const DeltaShape& d, int64_t h,
                               float* read) {
  const int64_t Dk = d.key_dim, Dv = d.value_dim;
  float* head = state + h * Dk * Dv;
  for (int64_t t = 0; t < kept; ++t) {
    const DeltaStep step = delta_step(inputs, t, d, h);
    for (int64_t v = 0; v < Dv; ++v) read[v] = 0.0f;
    for (int64_t k = 0; k < Dk; ++k) {
      float* line = head + k * Dv;
      const float kn = step.key[k] * step.scale;
      for (int64_t v = 0; v < Dv; ++v) {
        line[v] *= step.decay;
        read[v] += line[v] * kn;
      }
    }
    for (int64_t v = 0; v < Dv; ++v) read[v] = (step.value[v] - read[v]) * step.beta;  // delta
    for (int64_t k = 0; k < Dk; ++k) {
      float* line = head + k * Dv;
      const float kn = step.key[k] * step.scale;
      for (int64_t v = 0; v < Dv; ++v) line[v] += kn * read[v];
    }
  }
}

// The host's rebuild (a host device's memory is host memory).
inline void host_rebuild(const StateRebuild& job) {
  const DeltaShape& d = job.shape;
  const int64_t size = d.value_heads * d.key_dim * d.value_dim;
  std::vector<float> read(d.value_dim);
  for (int64_t i = 0; i < job.count; ++i) {
    const RebuildRow& row = job.rows[i];
    for (int64_t h = 0; h < d.value_heads; ++h)
      rebuild_delta_head(job.recurrent + row.place * size, job.delta_inputs + row.run_row * job.tokens * d.width(),
                         row.kept, d, h, read.data());
    for (int64_t c = 0; c < job.channels; ++c)
      rebuild_conv_channel(job.conv + (row.place * job.channels + c) * job.conv_width * job.element,
                           job.conv_inputs + (row.run_row * job.channels + c) * job.tokens * job.element, row.kept,
                           job.conv_width, job.element);
  }
}

}  // namespace dflash
