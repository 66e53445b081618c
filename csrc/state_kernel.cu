// state_kernel.cu: state_rebuild.h's rules as CUDA kernels, for commits on a GPU.
//
// Built by setup.py with nvcc into a fatbin that the core embeds and loads through the CUDA driver
// (cuda_device.cpp), as decide_kernel.cu. Each launch serves one linear layer and the rows of one
// target Run that a commit keeps part of (RebuildRow: the row's place in the slot buffers, its row
// in the Run's outputs, how many positions it keeps).
#include "state_rebuild.h"

// Block (row, value head), a thread per value column: each column's update reads only itself.
extern "C" __global__ void dflash_rebuild_delta(float* states, const float* inputs, const dflash::RebuildRow* rows,
                                                int64_t tokens, dflash::DeltaShape shape) {
  const dflash::RebuildRow row = rows[blockIdx.x];
  const int64_t h = blockIdx.y, size = shape.value_heads * shape.key_dim * shape.value_dim;
  for (int64_t v = threadIdx.x; v < shape.value_dim; v += blockDim.x)
    dflash::rebuild_delta_column(states + row.place * size, inputs + row.run_row * tokens * shape.width(), row.kept,
                                 shape, h, v);
}

// Block row, a thread per channel.
extern "C" __global__ void dflash_rebuild_conv(char* states, const char* inputs, const dflash::RebuildRow* rows,
                                               int64_t channels, int64_t width, int64_t tokens, int64_t element) {
  const dflash::RebuildRow row = rows[blockIdx.x];
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x)
    dflash::rebuild_conv_channel(states + (row.place * channels + c) * width * element,
                                 inputs + (row.run_row * channels + c) * tokens * element, row.kept, width, element);
}
