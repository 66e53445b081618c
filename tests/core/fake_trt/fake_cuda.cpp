// A fake CUDA driver (libcuda.so.1) for the C++ TensorRT executor's tests on a CPU: the calls
// csrc/cuda_device.cpp resolves, over host memory ("device" pointers are host pointers). Like a GPU's, the
// one stream's copies, fills and launches run later than the call: queued, in order, until a
// synchronisation (cuStreamSynchronize, cuMemFree, cuMemFreeHost, or a fake library running its own work on
// the stream: fake_stream.h), so an executor that rewrites a host array before its upload ran, or reads a
// download before waiting for it, gets what a GPU would give it. Launching the decision kernels
// (csrc/decide_kernel.cu: what every (row, position) decides, each row's decision, the decided tokens'
// logprobs, the drafter rule's draws) runs their rules compiled for the host (csrc/decide.h) with the kernels' own
// argument layouts and grids: what it proves is the executor's side of the launches (which rows,
// offsets, positions, drafts, keys and scratch it hands them; a row's decision reads only what the
// token launch wrote), not the kernels on a GPU. Memory calls need a current context on the calling
// thread, as the real driver's do. fake_cuda_live() counts live allocations (device and pinned host),
// so a test can see that an executor frees every buffer it made; fake_cuda_unpinned_copies() counts
// host <-> device copies whose host side is not page-locked memory from cuMemHostAlloc;
// fake_cuda_draft_draws() and fake_cuda_drafter_positions() count the drafter rule's work on the device;
// fake_cuda_block_launches() and fake_cuda_wide_launches() the target-token launches in the one-block and
// the cluster form (this fake plays a GPU of SM 9.0 or later, which has both, and kSms SMs);
// fake_cuda_misfit_blocks() the one-block launches whose threads break CudaDevice::decide_threads' rule
// (512 while the blocks fit kSms, 256 past it), fake_cuda_halved_blocks() those of 256; fake_cuda_wide_draws() the
// draft kernel's in the cluster form; fake_cuda_graph_launches() the CUDA graphs launched (a capture records
// the stream's work, each launch queues it again).
#include <cuda.h>

#include <atomic>
#include <functional>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "decide.h"
#include "fake_stream.h"
#include "penalties.h"
#include "state_rebuild.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
std::atomic<long> live{0};
// Page-locked host ranges (cuMemHostAlloc) and copies to or from host memory outside them: the
// executor stages everything that crosses in pinned memory, so a test expects none.
std::mutex pinned_lock;
std::map<const char*, size_t> pinned;
std::atomic<long> unpinned_copies{0};
// the drafter rule on the "device": draft-kernel launches, and verify positions decided by its test
std::atomic<long> draft_draws{0}, drafter_positions{0};
// launches of the target-token kernel in its one-block and its cluster form; of the draft kernel's cluster form
std::atomic<long> block_launches{0}, wide_launches{0}, wide_draws{0}, misfit_blocks{0}, halved_blocks{0},
    penalty_launches{0}, logprobs_launches{0};
constexpr int kSms = 32;  // the fake GPU's SMs (cuDeviceGetAttribute)
bool is_pinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> hold(pinned_lock);
  auto at = pinned.upper_bound(static_cast<const char*>(p));
  if (at == pinned.begin()) return false;
  --at;
  return static_cast<const char*>(p) + bytes <= at->first + at->second;
}
// Like the real driver, memory calls act on the calling thread's current context: none, none work.
thread_local CUcontext current = nullptr;
// The stream's queued work, run in order by flush().
std::mutex queue_lock;
std::vector<std::function<void()>> queue;
// A CUDA graph: the work recorded while it was captured. While capturing, work is recorded, not queued.
using Recorded = std::vector<std::function<void()>>;
Recorded* capture = nullptr;
std::atomic<long> graph_launches{0};
void enqueue(std::function<void()> work) {
  std::lock_guard<std::mutex> hold(queue_lock);
  (capture ? *capture : queue).push_back(std::move(work));
}
bool capturing() {
  std::lock_guard<std::mutex> hold(queue_lock);
  return capture != nullptr;
}
void flush() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> hold(queue_lock);
    work.swap(queue);
  }
  for (auto& w : work) w();
}
FakeStream stream{&flush, &capturing, &enqueue};
}

#define NEEDS_CONTEXT \
  if (!current) return CUDA_ERROR_INVALID_CONTEXT

EXPORT long fake_cuda_live() { return live.load(); }
EXPORT long fake_cuda_unpinned_copies() { return unpinned_copies.load(); }
EXPORT void fake_cuda_flush() { flush(); }
EXPORT long fake_cuda_draft_draws() { return draft_draws.load(); }
EXPORT long fake_cuda_drafter_positions() { return drafter_positions.load(); }
EXPORT long fake_cuda_wide_launches() { return wide_launches.load(); }
EXPORT long fake_cuda_block_launches() { return block_launches.load(); }
EXPORT long fake_cuda_graph_launches() { return graph_launches.load(); }
// CUDA graphs: capture records the stream's work (a graph's and an instantiated graph's live count as
// allocations, so an executor that leaves one behind shows in fake_cuda_live); a launch queues a copy.
EXPORT CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode) {
  NEEDS_CONTEXT;
  std::lock_guard<std::mutex> hold(queue_lock);
  if (capture) return CUDA_ERROR_ILLEGAL_STATE;
  capture = new Recorded;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream, CUgraph* graph) {
  NEEDS_CONTEXT;
  std::lock_guard<std::mutex> hold(queue_lock);
  if (!capture) return CUDA_ERROR_ILLEGAL_STATE;
  *graph = reinterpret_cast<CUgraph>(capture);
  capture = nullptr;
  ++live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long) {
  NEEDS_CONTEXT;
  *exec = reinterpret_cast<CUgraphExec>(new Recorded(*reinterpret_cast<Recorded*>(graph)));
  ++live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream) {
  NEEDS_CONTEXT;
  for (const auto& work : *reinterpret_cast<Recorded*>(exec)) enqueue(work);
  ++graph_launches;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  delete reinterpret_cast<Recorded*>(exec);
  --live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  delete reinterpret_cast<Recorded*>(graph);
  --live;
  return CUDA_SUCCESS;
}
EXPORT long fake_cuda_wide_draws() { return wide_draws.load(); }
EXPORT long fake_cuda_penalty_launches() { return penalty_launches.load(); }
EXPORT long fake_cuda_logprobs_launches() { return logprobs_launches.load(); }
EXPORT long fake_cuda_misfit_blocks() { return misfit_blocks.load(); }
EXPORT long fake_cuda_halved_blocks() { return halved_blocks.load(); }
EXPORT CUresult cuInit(unsigned int) { return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute != CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) return CUDA_ERROR_INVALID_VALUE;
  *value = kSms;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) {
  static int primary;
  *context = reinterpret_cast<CUcontext>(&primary);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  current = context;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream* created, unsigned int) {
  *created = reinterpret_cast<CUstream>(&stream);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream) {
  NEEDS_CONTEXT;
  flush();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  NEEDS_CONTEXT;
  void* memory = std::malloc(bytes);
  if (!memory) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(memory, 0xA5, bytes);  // garbage, as cuMemAlloc's memory is: the executor must zero it
  *p = reinterpret_cast<CUdeviceptr>(memory);
  ++live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEEDS_CONTEXT;
  flush();  // as the real one: it waits for the work queued before it
  std::free(reinterpret_cast<void*>(p));
  --live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  enqueue([=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes); });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* copy, CUstream) {
  NEEDS_CONTEXT;
  if (copy->srcMemoryType != CU_MEMORYTYPE_DEVICE || copy->dstMemoryType != CU_MEMORYTYPE_DEVICE ||
      copy->WidthInBytes > copy->srcPitch || copy->WidthInBytes > copy->dstPitch)
    return CUDA_ERROR_INVALID_VALUE;  // what the real driver refuses too
  enqueue([c = *copy] {
    for (size_t r = 0; r < c.Height; ++r)
      std::memmove(reinterpret_cast<char*>(c.dstDevice) + c.dstXInBytes + (c.dstY + r) * c.dstPitch,
                   reinterpret_cast<const char*>(c.srcDevice) + c.srcXInBytes + (c.srcY + r) * c.srcPitch,
                   c.WidthInBytes);
  });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned int) {
  NEEDS_CONTEXT;
  *p = std::malloc(bytes);
  if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> hold(pinned_lock);
  pinned[static_cast<const char*>(*p)] = bytes;
  ++live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFreeHost(void* p) {
  NEEDS_CONTEXT;
  flush();
  {
    std::lock_guard<std::mutex> hold(pinned_lock);
    if (!pinned.erase(static_cast<const char*>(p))) return CUDA_ERROR_INVALID_VALUE;
  }
  std::free(p);
  --live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  if (!is_pinned(src, bytes)) ++unpinned_copies;
  enqueue([=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });  // reads the host array when it runs
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  if (!is_pinned(dst, bytes)) ++unpinned_copies;
  enqueue([=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char value, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  enqueue([=] { std::memset(reinterpret_cast<void*>(p), value, bytes); });
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult, const char** message) {
  *message = "fake CUDA error";
  return CUDA_SUCCESS;
}

namespace {
int module_image;  // the one module: whatever image is loaded, its functions are the core's kernels
int tokens_function;
int tokens_wide_function;  // dflash_target_tokens_wide: this fake plays a GPU of SM 9.0 or later
int decide_function;
int logprobs_function;
int penalize_function;
int draw_function;
int draw_wide_function;  // dflash_draw_drafts_wide
int rebuild_delta_function;
int rebuild_conv_function;
}  // namespace

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  NEEDS_CONTEXT;
  if (!image) return CUDA_ERROR_INVALID_IMAGE;
  *module = reinterpret_cast<CUmodule>(&module_image);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule, const char* name) {
  if (std::strcmp(name, "dflash_target_tokens") == 0)
    *function = reinterpret_cast<CUfunction>(&tokens_function);
  else if (std::strcmp(name, "dflash_target_tokens_wide") == 0)
    *function = reinterpret_cast<CUfunction>(&tokens_wide_function);
  else if (std::strcmp(name, "dflash_decide_rows") == 0)
    *function = reinterpret_cast<CUfunction>(&decide_function);
  else if (std::strcmp(name, "dflash_draw_drafts") == 0)
    *function = reinterpret_cast<CUfunction>(&draw_function);
  else if (std::strcmp(name, "dflash_draw_drafts_wide") == 0)
    *function = reinterpret_cast<CUfunction>(&draw_wide_function);
  else if (std::strcmp(name, "dflash_decided_logprobs") == 0)
    *function = reinterpret_cast<CUfunction>(&logprobs_function);
  else if (std::strcmp(name, "dflash_penalize") == 0)
    *function = reinterpret_cast<CUfunction>(&penalize_function);
  else if (std::strcmp(name, "dflash_rebuild_delta") == 0)
    *function = reinterpret_cast<CUfunction>(&rebuild_delta_function);
  else if (std::strcmp(name, "dflash_rebuild_conv") == 0)
    *function = reinterpret_cast<CUfunction>(&rebuild_conv_function);
  else
    return CUDA_ERROR_NOT_FOUND;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads,
                               unsigned, unsigned, unsigned, CUstream, void** args, void**) {
  NEEDS_CONTEXT;
  if (grid_z != 1) return CUDA_ERROR_INVALID_VALUE;
  if (function == reinterpret_cast<CUfunction>(&tokens_function)) {
    const bool fits = int64_t(grid_x) * grid_y <= kSms;
    if (threads != (fits ? 512u : 256u)) ++misfit_blocks;
    if (threads == 256) ++halved_blocks;
  }
  const bool wide = function == reinterpret_cast<CUfunction>(&tokens_wide_function) ||
                    function == reinterpret_cast<CUfunction>(&draw_wide_function);
  if (wide && grid_x % dflash::kDecideCluster != 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  if (function == reinterpret_cast<CUfunction>(&tokens_wide_function)) ++wide_launches;
  if (function == reinterpret_cast<CUfunction>(&tokens_function)) ++block_launches;
  if (function == reinterpret_cast<CUfunction>(&draw_wide_function)) ++wide_draws;
  if (function == reinterpret_cast<CUfunction>(&tokens_function) ||
      function == reinterpret_cast<CUfunction>(&tokens_wide_function)) {
    // dflash_target_tokens(logits, vocab, rows, drafts, drafter, probs, order, tokens): block (b, j) ->
    // tokens[b * grid_y + j], kKept where draft j is kept; dflash_target_tokens_wide: the same from a cluster
    // of kDecideCluster blocks (b * kDecideCluster + rank, j)
    const unsigned count = wide ? grid_x / dflash::kDecideCluster : grid_x;
    const float* logits = *static_cast<const float**>(args[0]);
    const int64_t vocab = *static_cast<int64_t*>(args[1]);
    const dflash::DecideRow* rows = *static_cast<const dflash::DecideRow**>(args[2]);
    const int64_t* drafts = *static_cast<const int64_t**>(args[3]);
    const dflash::DraftQ drafter = *static_cast<dflash::DraftQ*>(args[4]);
    float* probs = *static_cast<float**>(args[5]);
    int32_t* order = *static_cast<int32_t**>(args[6]);
    int32_t* tokens = *static_cast<int32_t**>(args[7]);
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < count; ++b)
        for (unsigned j = 0; j < grid_y; ++j) {
          const dflash::DecideRow& row = rows[b];
          if (j > row.num_drafts) continue;
          const int64_t at = b * int64_t(grid_y) + j;
          const float* logits_row = logits + (row.first + j) * vocab;
          int64_t token;
          if (j < row.num_drafts && row.q >= 0 && !row.sampling.greedy()) {
            ++drafter_positions;
            token = dflash::drafter_position(logits_row, vocab, drafts[row.drafts + j],
                                             drafter.q + row.q + j * drafter.draft_vocab, drafter.draft_of, row.sampling,
                                             row.stream, row.position + j, probs + at * vocab, order + at * vocab);
          } else {
            token = dflash::sample_row(logits_row, vocab, row.sampling, row.stream, row.position + j, probs + at * vocab,
                                       order + at * vocab);
            if (j < row.num_drafts && token == drafts[row.drafts + j]) token = dflash::kKept;
          }
          tokens[at] = int32_t(token);
        }
    });
    return CUDA_SUCCESS;
  }
  if (function == reinterpret_cast<CUfunction>(&draw_function) || wide) {
    // dflash_draw_drafts(scores, columns, top_k, rows, ids, q, probs, order, tokens): DFlash, block (b, j);
    // DFlash2, block (b, 0) walking the row's positions; dflash_draw_drafts_wide: DFlash's from a cluster of
    // kDecideCluster blocks (b * kDecideCluster + rank, j)
    const float* scores = *static_cast<const float**>(args[0]);
    const int64_t* columns = *static_cast<const int64_t**>(args[1]);
    const int64_t top_k = *static_cast<int64_t*>(args[2]);
    const dflash::DecideRow* rows = *static_cast<const dflash::DecideRow**>(args[3]);
    const int64_t* ids = *static_cast<const int64_t**>(args[4]);
    const dflash::DraftQ q = *static_cast<dflash::DraftQ*>(args[5]);
    float* probs = *static_cast<float**>(args[6]);
    int32_t* order = *static_cast<int32_t**>(args[7]);
    int64_t* tokens = *static_cast<int64_t**>(args[8]);
    const int64_t V = q.draft_vocab;
    if (top_k > 0 && (grid_y != 1 || wide)) return CUDA_ERROR_INVALID_VALUE;
    const unsigned count = wide ? grid_x / dflash::kDecideCluster : grid_x;
    ++draft_draws;
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < count; ++b) {
        const dflash::DecideRow& row = rows[b];
        if (top_k > 0) {
          if (row.num_drafts == 0) continue;
          dflash::selector_walk(scores + row.first * top_k * top_k, columns + row.first * top_k, row.num_drafts, top_k, V,
                                row.sampling, row.stream, row.position, q.q + row.first * V, tokens + row.first,
                                probs + row.first * top_k, order + row.first * top_k);
          if (ids)
            for (int64_t j = 0; j < row.num_drafts; ++j)
              if (tokens[row.first + j] >= 0) tokens[row.first + j] = ids[tokens[row.first + j]];
          continue;
        }
        for (unsigned j = 0; j < grid_y && j < row.num_drafts; ++j) {
          const int64_t at = row.first + j;
          const int64_t id = dflash::draft_row(scores + at * V, V, row.sampling, row.stream, row.position + j,
                                               q.q + at * V, order + at * V);
          tokens[at] = ids && id >= 0 ? ids[id] : id;
        }
      }
    });
    return CUDA_SUCCESS;
  }
  if (function == reinterpret_cast<CUfunction>(&rebuild_delta_function)) {
    // dflash_rebuild_delta(states, inputs, rows, tokens, shape): block (row, value head), a thread per column
    float* states = *static_cast<float**>(args[0]);
    const float* inputs = *static_cast<const float**>(args[1]);
    const dflash::RebuildRow* rows = *static_cast<const dflash::RebuildRow**>(args[2]);
    const int64_t tokens = *static_cast<int64_t*>(args[3]);
    const dflash::DeltaShape shape = *static_cast<dflash::DeltaShape*>(args[4]);
    if (int64_t(grid_y) != shape.value_heads) return CUDA_ERROR_INVALID_VALUE;
    const int64_t size = shape.value_heads * shape.key_dim * shape.value_dim;
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < grid_x; ++b)
        for (unsigned h = 0; h < grid_y; ++h)
          for (int64_t v = 0; v < shape.value_dim; ++v)
            dflash::rebuild_delta_column(states + rows[b].place * size, inputs + rows[b].run_row * tokens * shape.width(),
                                         rows[b].kept, shape, h, v);
    });
    return CUDA_SUCCESS;
  }
  if (function == reinterpret_cast<CUfunction>(&rebuild_conv_function)) {
    // dflash_rebuild_conv(states, inputs, rows, channels, width, tokens, element): block row
    char* states = *static_cast<char**>(args[0]);
    const char* inputs = *static_cast<const char**>(args[1]);
    const dflash::RebuildRow* rows = *static_cast<const dflash::RebuildRow**>(args[2]);
    const int64_t channels = *static_cast<int64_t*>(args[3]), width = *static_cast<int64_t*>(args[4]),
                  tokens = *static_cast<int64_t*>(args[5]), element = *static_cast<int64_t*>(args[6]);
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < grid_x; ++b)
        for (int64_t c = 0; c < channels; ++c)
          dflash::rebuild_conv_channel(states + (rows[b].place * channels + c) * width * element,
                                       inputs + (rows[b].run_row * channels + c) * tokens * element, rows[b].kept, width,
                                       element);
    });
    return CUDA_SUCCESS;
  }
  if (function == reinterpret_cast<CUfunction>(&penalize_function)) {
    // dflash_penalize(logits, vocab, rows, entries, tokens, masks): block (b, k), for k < the row's
    // positions, adjusts that logits row in place (penalties.h), masks it, then min_p's cut over the row
    float* logits = *static_cast<float**>(args[0]);
    const int64_t vocab = *static_cast<int64_t*>(args[1]);
    const dflash::PenaltyRow* rows = *static_cast<const dflash::PenaltyRow**>(args[2]);
    const dflash::PenaltyEntry* entries = *static_cast<const dflash::PenaltyEntry**>(args[3]);
    const int32_t* tokens = *static_cast<const int32_t**>(args[4]);
    const uint32_t* masks = *static_cast<const uint32_t**>(args[5]);
    ++penalty_launches;
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < grid_x; ++b)
        for (unsigned k = 0; k < grid_y && k < rows[b].positions; ++k) {
          for (unsigned t = 0; t < threads; ++t)  // the block's threads, one after another
            dflash::penalize_position(logits, vocab, rows[b], k, entries, tokens, t, threads);
          for (unsigned t = 0; t < threads; ++t)  // after the barrier
            dflash::mask_position(logits, vocab, rows[b], k, masks, t, threads);
          if (rows[b].min_p_cut) dflash::cut_min_p(logits + (rows[b].first + k) * vocab, vocab, rows[b]);
        }
    });
    return CUDA_SUCCESS;
  }
  if (function == reinterpret_cast<CUfunction>(&logprobs_function)) {
    // dflash_decided_logprobs(logits, vocab, rows, drafts, verdicts, order, logprobs): block (b, j), for
    // j <= the row's accepted count, -> logprobs[(b * grid_y + j) * (1 + kMaxLogprobs)]
    const float* logits = *static_cast<const float**>(args[0]);
    const int64_t vocab = *static_cast<int64_t*>(args[1]);
    const dflash::DecideRow* rows = *static_cast<const dflash::DecideRow**>(args[2]);
    const int64_t* drafts = *static_cast<const int64_t**>(args[3]);
    const dflash::Verdict* verdicts = *static_cast<const dflash::Verdict**>(args[4]);
    int32_t* order = *static_cast<int32_t**>(args[5]);
    dflash::TokenLogprob* logprobs = *static_cast<dflash::TokenLogprob**>(args[6]);
    ++logprobs_launches;
    enqueue([=] {  // runs when the stream gets to it
      for (unsigned b = 0; b < grid_x; ++b)
        for (unsigned j = 0; j < grid_y; ++j) {
          const dflash::DecideRow& row = rows[b];
          if (row.sampling.logprobs < 0 || j > verdicts[b].accepted) continue;
          const int64_t at = b * int64_t(grid_y) + j;
          const int64_t token = j < verdicts[b].accepted ? drafts[row.drafts + j] : verdicts[b].next;
          dflash::logprobs_row(logits + (row.first + j) * vocab, vocab, token, row.sampling.logprobs,
                               logprobs + at * (1 + dflash::kMaxLogprobs), order + at * vocab);
        }
    });
    return CUDA_SUCCESS;
  }
  if (function != reinterpret_cast<CUfunction>(&decide_function) || grid_y != 1) return CUDA_ERROR_INVALID_VALUE;
  // dflash_decide_rows(rows, tokens, out, positions): a row reads what its positions decided
  const dflash::DecideRow* rows = *static_cast<const dflash::DecideRow**>(args[0]);
  const int32_t* tokens = *static_cast<const int32_t**>(args[1]);
  dflash::Verdict* out = *static_cast<dflash::Verdict**>(args[2]);
  const int64_t positions = *static_cast<int64_t*>(args[3]);
  enqueue([=] {
    for (unsigned b = 0; b < grid_x; ++b) out[b] = dflash::verdict_from_tokens(rows[b].num_drafts, tokens + b * positions);
  });
  return CUDA_SUCCESS;
}
