// decide_kernel.cu: decide.h's rules as CUDA kernels over logits in GPU memory.
//
// Built by setup.py with nvcc into a fatbin that the core embeds and loads through the CUDA driver
// (cuda_device.cpp): nothing links to the CUDA runtime.
//
// A verify's three kernels, launched in order on one stream: dflash_target_tokens decides every (row,
// position) at once, one block each: a greedy row's argmax, a sampled row's draw (decide.h's rules run by
// the block's threads together, BlockThreads), or the drafter rule's test of the draft there. Every
// position draws from its own counter-based uniforms, so the positions past a rejected draft cost time,
// never tokens. dflash_decide_rows then walks each row's positions to the first not kept, and
// dflash_decided_logprobs takes the decided tokens' log-probabilities where a row asks, one block per
// (row, position) again. A draft under the drafter rule runs dflash_draw_drafts after the block pass.
// For few (row, position) pairs, SM 9.0 and later run dflash_target_tokens_wide instead: the same rules
// over a cluster of blocks per pair (ClusterThreads), so one row's verify spreads over the GPU.
#include <cooperative_groups.h>

#include "decide.h"
#include "penalties.h"

namespace {

constexpr int kThreads = 512;
static_assert(kThreads <= dflash::kMaxThreads, "RowShared.partial holds a value per thread");

// decide.h's Threads policy for a CUDA block.
struct BlockThreads : dflash::SharedBins<BlockThreads> {
  __device__ static int id() { return threadIdx.x; }
  __device__ static int worker() { return threadIdx.x; }
  __device__ static int count() { return blockDim.x; }
  __device__ static void sync() { __syncthreads(); }
  __device__ static unsigned add(unsigned* at, unsigned value) { return atomicAdd(at, value); }
  __device__ static void sort(int32_t* order, int64_t n, const float* p) {
    dflash::decide_detail::bitonic_sort<BlockThreads>(order, n, p);
  }
};

// (value, index) a beats b under torch.argmax: a NaN beats any number, then the larger value, then the
// smaller index; index -1 is "nothing yet".
__device__ bool beats(float av, int64_t ai, float bv, int64_t bi) {
  if (bi < 0) return ai >= 0;
  if (ai < 0) return false;
  const bool an = av != av, bn = bv != bv;
  if (an != bn) return an;
  if (!an && av != bv) return av > bv;
  return ai < bi;
}

// Each thread keeps kLoads loads in flight (one at a time left a block waiting on memory latency:
// ~260 us for a 152k-token row on an H200, 2 GB/s).
constexpr int kLoads = 8;

// The block's argmax over the tokens first + threadIdx.x + k * stride (-1 if it has none).
__device__ int64_t block_argmax(const float* __restrict__ row, int64_t vocab, int64_t first, int64_t stride,
                                float* values, int64_t* indices) {
  float best = 0.0f;
  int64_t at = -1;
  for (int64_t base = first + threadIdx.x; base < vocab; base += stride * kLoads) {
    float loaded[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + u * stride;
      loaded[u] = i < vocab ? row[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + u * stride;
      if (i < vocab && beats(loaded[u], i, best, at)) {
        best = loaded[u];
        at = i;
      }
    }
  }
  values[threadIdx.x] = best;
  indices[threadIdx.x] = at;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half && beats(values[threadIdx.x + half], indices[threadIdx.x + half], values[threadIdx.x],
                                    indices[threadIdx.x])) {
      values[threadIdx.x] = values[threadIdx.x + half];
      indices[threadIdx.x] = indices[threadIdx.x + half];
    }
    __syncthreads();
  }
  const int64_t out = indices[0];
  __syncthreads();  // indices[0] is rewritten by the next call
  return out;
}

// A sampled position's token, or the drafter rule's verdict on draft j there (kKept; kNoToken: none):
// decide.h's rules run by `Threads` together. The caller handles a greedy position.
template <class Threads>
__device__ int64_t sampled_token(const float* logits_row, int64_t vocab, const dflash::DecideRow& row, int64_t j,
                                 const int64_t* drafts, const dflash::DraftQ& drafter, float* probs, int32_t* order,
                                 dflash::RowShared& shared) {
  const uint32_t position = row.position + uint32_t(j);
  if (j < row.num_drafts && row.q >= 0)
    return dflash::drafter_position_by<Threads>(logits_row, vocab, drafts[row.drafts + j],
                                                drafter.q + row.q + j * drafter.draft_vocab, drafter.draft_of,
                                                row.sampling, row.stream, position, probs, order, shared);
  const int64_t token = dflash::sample_row_by<Threads>(logits_row, vocab, row.sampling, row.stream, position, probs,
                                                       order, shared);
  return j < row.num_drafts && token == drafts[row.drafts + j] ? dflash::kKept : token;
}

}  // namespace

// What each row's positions 0..num_drafts decided -> tokens[b * positions + j]: kKept where draft j is kept,
// else the token emitted there (j == num_drafts: the bonus). A point-mass row takes the target's own
// token at every position (a greedy row's argmax, a sampled row's draw: decide.h's rules run by the
// block's threads together, BlockThreads) and keeps a draft equal to it; a row of the drafter rule (its
// DecideRow::q >= 0) decides each draft by decide.h's drafter_position_by over its q rows in `drafter`.
// Scratch for a sampled row's position: probs and order [vocab] at (b * positions + j) * vocab.
// Launch: grid = (number of rows, positions: the most a row has), block = kThreads.
extern "C" __global__ void __launch_bounds__(kThreads)
    dflash_target_tokens(const float* logits, int64_t vocab, const dflash::DecideRow* rows, const int64_t* drafts,
                         dflash::DraftQ drafter, float* probs, int32_t* order, int32_t* tokens) {
  __shared__ float values[kThreads];
  __shared__ int64_t indices[kThreads];
  __shared__ dflash::RowShared shared;
  const dflash::DecideRow row = rows[blockIdx.x];
  const int64_t j = blockIdx.y, at = blockIdx.x * int64_t(gridDim.y) + j;
  if (j > row.num_drafts) return;  // the same for the whole block
  const float* logits_row = logits + (row.first + j) * vocab;
  int64_t token;
  if (row.sampling.greedy()) {
    token = block_argmax(logits_row, vocab, 0, blockDim.x, values, indices);
    if (token >= 0 && logits_row[token] != logits_row[token]) token = dflash::kNoToken;  // a NaN row: argmax_row's
    if (j < row.num_drafts && token == drafts[row.drafts + j]) token = dflash::kKept;
  } else {
    token = sampled_token<BlockThreads>(logits_row, vocab, row, j, drafts, drafter, probs + at * vocab,
                                        order + at * vocab, shared);
  }
  if (threadIdx.x == 0) tokens[at] = int32_t(token);
}

#if __CUDA_ARCH__ >= 900
namespace {

namespace cg = cooperative_groups;
constexpr int kCluster = dflash::kDecideCluster;
static_assert(kCluster * kThreads <= dflash::kMaxThreads, "RowShared.partial holds a value per cluster thread");

// Each block's own RowShared: block 0's is the cluster's shared state (every block reaches it through
// distributed shared memory); the others' hold only their radix bins.
__shared__ dflash::RowShared cluster_local;

// decide.h's Threads policy for a cluster of kCluster blocks: their threads numbered block after block
// (a strided pass's neighbours read neighbouring memory), the chunk walkers interleaved across the blocks,
// cluster-wide barriers, and the shared state of block 0 for all. A radix pass adds into each block's own
// bins (block 0's are the shared ones), gathered into block 0's after the pass: a near-flat row's runs are
// short, and one add to another SM's shared memory per run left the passes no faster than a block's.
struct ClusterThreads {
  __device__ static int id() { return int(cg::this_cluster().block_rank()) * blockDim.x + threadIdx.x; }
  __device__ static int worker() { return threadIdx.x * kCluster + int(cg::this_cluster().block_rank()); }
  __device__ static int count() { return kCluster * blockDim.x; }
  __device__ static void sync() { cg::this_cluster().sync(); }
  __device__ static unsigned add(unsigned* at, unsigned value) { return atomicAdd(at, value); }
  __device__ static void sort(int32_t* order, int64_t n, const float* p) {
    dflash::decide_detail::bitonic_sort<ClusterThreads>(order, n, p);
  }
  __device__ static unsigned (*bins(dflash::RowShared&))[256] { return cluster_local.bins; }
  __device__ static void clear_bins(dflash::RowShared&, int ways) {
    for (int b = threadIdx.x; b < 256 * ways; b += blockDim.x) cluster_local.bins[b / 256][b % 256] = 0;
  }
  __device__ static void gather_bins(dflash::RowShared& s, int ways) {
    sync();  // every block's adds are in
    if (cg::this_cluster().block_rank() == 0) return;
    for (int b = threadIdx.x; b < 256 * ways; b += blockDim.x)
      if (const unsigned value = cluster_local.bins[b / 256][b % 256]) atomicAdd(&s.bins[b / 256][b % 256], value);
  }
};

}  // namespace

// dflash_target_tokens with a cluster of kCluster blocks per (row, position), for few positions: one
// block's SM alone takes ~40 us a pass over a 152k-token row, so one row's sampled verify of 16 left
// all but 16 SMs idle. The same rules (decide.h over ClusterThreads), the same tokens.
// Launch: grid = (number of rows x kCluster, positions), block = kThreads; SM 9.0 and later.
extern "C" __global__ void __cluster_dims__(dflash::kDecideCluster, 1, 1) __launch_bounds__(kThreads)
    dflash_target_tokens_wide(const float* logits, int64_t vocab, const dflash::DecideRow* rows, const int64_t* drafts,
                              dflash::DraftQ drafter, float* probs, int32_t* order, int32_t* tokens) {
  __shared__ float values[kThreads];
  __shared__ int64_t indices[kThreads];
  __shared__ float cluster_values[kCluster];
  __shared__ int64_t cluster_indices[kCluster];
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t b = blockIdx.x / kCluster, j = blockIdx.y, at = b * int64_t(gridDim.y) + j;
  const dflash::DecideRow row = rows[b];
  if (j > row.num_drafts) return;  // the same for the whole cluster
  const float* logits_row = logits + (row.first + j) * vocab;
  int64_t token;
  if (row.sampling.greedy()) {  // each block's argmax over its share, then block 0's thread 0 over theirs
    const int64_t mine = block_argmax(logits_row, vocab, int64_t(rank) * blockDim.x, kCluster * blockDim.x, values,
                                      indices);
    if (threadIdx.x == 0) {
      cluster.map_shared_rank(cluster_values, 0)[rank] = mine >= 0 ? logits_row[mine] : 0.0f;
      cluster.map_shared_rank(cluster_indices, 0)[rank] = mine;
    }
    cluster.sync();  // block 0's shared memory is written by every block, and read after this alone
    if (rank != 0 || threadIdx.x != 0) return;
    token = -1;
    float best = 0.0f;
    for (int r = 0; r < kCluster; ++r)
      if (beats(cluster_values[r], cluster_indices[r], best, token)) {
        best = cluster_values[r];
        token = cluster_indices[r];
      }
    if (token >= 0 && logits_row[token] != logits_row[token]) token = dflash::kNoToken;  // a NaN row: argmax_row's
    if (j < row.num_drafts && token == drafts[row.drafts + j]) token = dflash::kKept;
  } else {
    dflash::RowShared& shared = *cluster.map_shared_rank(&cluster_local, 0);
    token = sampled_token<ClusterThreads>(logits_row, vocab, row, j, drafts, drafter, probs + at * vocab,
                                          order + at * vocab, shared);
    cluster.sync();  // block 0 stays until every block is done with its shared memory
    if (rank != 0) return;
  }
  if (threadIdx.x == 0) tokens[at] = int32_t(token);
}

// dflash_draw_drafts for a DFlash drafter (top_k 0) with a cluster of kCluster blocks per (row, draft), for
// few pairs: the same draws (draft_row_by over ClusterThreads). The same arguments; columns and top_k unused.
// Launch: grid = (number of rows x kCluster, the most drafts), block = kThreads; SM 9.0 and later.
extern "C" __global__ void __cluster_dims__(dflash::kDecideCluster, 1, 1) __launch_bounds__(kThreads)
    dflash_draw_drafts_wide(const float* scores, const int64_t*, int64_t, const dflash::DecideRow* rows,
                            const int64_t* ids, dflash::DraftQ q, float*, int32_t* order, int64_t* tokens) {
  const cg::cluster_group cluster = cg::this_cluster();
  const dflash::DecideRow row = rows[blockIdx.x / kCluster];
  const int64_t V = q.draft_vocab, j = blockIdx.y, at = row.first + j;
  if (j >= row.num_drafts) return;  // the same for the whole cluster
  dflash::RowShared& shared = *cluster.map_shared_rank(&cluster_local, 0);
  const int64_t id = dflash::draft_row_by<ClusterThreads>(scores + at * V, V, row.sampling, row.stream,
                                                          row.position + uint32_t(j), q.q + at * V, order + at * V,
                                                          shared);
  cluster.sync();  // block 0 stays until every block is done with its shared memory
  // kNoToken (no draw: NaN scores) stays as it is
  if (cluster.block_rank() == 0 && threadIdx.x == 0) tokens[at] = ids && id >= 0 ? ids[id] : id;
}
#endif

// The penalties of rows[b] (penalties.h) at its position k, in place, its tokens strided over the block's
// threads (each token written by one thread). Launch: grid = (number of rows, the most positions), any
// block size.
// Then, for a row with a constraint, its mask at that position (the vocabulary strided over the threads),
// and for a row with min_p, the block's largest logit at that position (a shared-memory reduction;
// block = kPenaltyThreads, a power of two) and min_p's cut (penalties.h).
extern "C" __global__ void __launch_bounds__(256)
    dflash_penalize(float* logits, int64_t vocab, const dflash::PenaltyRow* rows, const dflash::PenaltyEntry* entries,
                    const int32_t* tokens, const uint32_t* masks) {
  const dflash::PenaltyRow row = rows[blockIdx.x];
  if (int64_t(blockIdx.y) >= row.positions) return;  // the same for the whole block
  dflash::penalize_position(logits, vocab, row, blockIdx.y, entries, tokens, threadIdx.x, blockDim.x);
  if (row.mask >= 0) {
    __syncthreads();  // every penalty written: the mask's stride shares tokens out otherwise
    dflash::mask_position(logits, vocab, row, blockIdx.y, masks, threadIdx.x, blockDim.x);
  }
  if (!row.min_p_cut) return;
  __shared__ float largest[256];
  float* out = logits + (row.first + int64_t(blockIdx.y)) * vocab;
  __syncthreads();  // every penalty written
  float max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) max = fmaxf(max, out[i]);
  largest[threadIdx.x] = max;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) largest[threadIdx.x] = fmaxf(largest[threadIdx.x], largest[threadIdx.x + half]);
    __syncthreads();
  }
  const float threshold = dflash::min_p_threshold(largest[0], row);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (out[i] < threshold) out[i] = -INFINITY;
}

// rows[b] -> out[b], from what their positions decided (dflash_target_tokens): the drafts kept up to
// the first position that emits a token of its own. Launch: grid = number of rows, block = 1 thread.
extern "C" __global__ void dflash_decide_rows(const dflash::DecideRow* rows, const int32_t* tokens, dflash::Verdict* out,
                                              int64_t positions) {
  out[blockIdx.x] = dflash::verdict_from_tokens(rows[blockIdx.x].num_drafts, tokens + blockIdx.x * positions);
}

// The drafter rule's drafts of rows[b] (num_drafts 0: none drawn, the block pass's argmax stands) ->
// tokens[row.first + j] (target ids: ids maps a draft id, null: the same), their distributions into
// q.q [row.first + j, q.draft_vocab]. A DFlash drafter (top_k 0): block (b, j) draws position j from the
// block pass's logits scores [row.first + j, draft_vocab] (scratch: order [the same shape]); grid =
// (number of rows, the most drafts). A DFlash2 drafter: block (b, 0) walks the selector's scores
// [row.first + j, k, k] and columns [row.first + j, k] (scratch: probs and order [row.first + j, k]);
// grid = (number of rows, 1). Block = kThreads.
extern "C" __global__ void __launch_bounds__(kThreads)
    dflash_draw_drafts(const float* scores, const int64_t* columns, int64_t top_k, const dflash::DecideRow* rows,
                       const int64_t* ids, dflash::DraftQ q, float* probs, int32_t* order, int64_t* tokens) {
  __shared__ dflash::RowShared shared;
  const dflash::DecideRow row = rows[blockIdx.x];
  const int64_t V = q.draft_vocab;
  if (top_k == 0) {
    const int64_t j = blockIdx.y, at = row.first + j;
    if (j >= row.num_drafts) return;  // the same for the whole block
    const int64_t id = dflash::draft_row_by<BlockThreads>(scores + at * V, V, row.sampling, row.stream,
                                                          row.position + uint32_t(j), q.q + at * V, order + at * V,
                                                          shared);
    if (threadIdx.x == 0) tokens[at] = ids && id >= 0 ? ids[id] : id;  // kNoToken: no draw (NaN scores)
    return;
  }
  if (row.num_drafts == 0) return;
  const int64_t first = row.first;
  dflash::selector_walk_by<BlockThreads>(scores + first * top_k * top_k, columns + first * top_k, row.num_drafts,
                                         top_k, V, row.sampling, row.stream, row.position, q.q + first * V,
                                         tokens + first, probs + first * top_k, order + first * top_k, shared);
  if (threadIdx.x == 0 && ids)
    for (int64_t j = 0; j < row.num_drafts; ++j)
      if (tokens[first + j] >= 0) tokens[first + j] = ids[tokens[first + j]];
}

// The log-probabilities of each decided token (dflash_decide_rows's verdicts: the kept drafts, then
// `next`) of the rows with SamplingParams::logprobs >= 0, at [b, j, 0..] of [rows, positions, 1 +
// kMaxLogprobs], with order [vocab] at (b * positions + j) * vocab as scratch.
// Launch: grid = (number of rows, positions), block = kThreads.
extern "C" __global__ void __launch_bounds__(kThreads)
    dflash_decided_logprobs(const float* logits, int64_t vocab, const dflash::DecideRow* rows, const int64_t* drafts,
                            const dflash::Verdict* verdicts, int32_t* order, dflash::TokenLogprob* logprobs) {
  __shared__ dflash::RowShared shared;
  const dflash::DecideRow row = rows[blockIdx.x];
  const dflash::Verdict verdict = verdicts[blockIdx.x];
  const int64_t j = blockIdx.y, at = blockIdx.x * int64_t(gridDim.y) + j;
  if (row.sampling.logprobs < 0 || j > verdict.accepted) return;  // the same for the whole block
  const int64_t token = j < verdict.accepted ? drafts[row.drafts + j] : verdict.next;
  dflash::logprobs_row_by<BlockThreads>(logits + (row.first + j) * vocab, vocab, token, row.sampling.logprobs,
                                        logprobs + at * (1 + dflash::kMaxLogprobs), order + at * vocab, shared);
}
