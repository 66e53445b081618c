// cuda_device.cpp: the CUDA driver through dlopen, as slot-executor memory.
#include "cuda_device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>

#ifdef DFLASH_WITH_DEVICE_DECIDE
#include "decide_kernel_fatbin.h"  // kDecideKernelFatbin: decide_kernel.cu for every SM setup.py builds
#include "state_kernel_fatbin.h"   // kStateKernelFatbin: state_kernel.cu, the same way
#endif

namespace dflash {

namespace {

void* symbol(void* library, const char* name, const std::string& where, const std::string& who) {
  void* found = dlsym(library, name);
  if (!found) throw Error(who + ": " + where + " has no " + name);
  return found;
}

}  // namespace

// The driver entry points we use (the _v2 names are what cuda.h's macros call).
struct Driver {
  decltype(&::cuInit) init;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetAttribute) device_attribute;
  decltype(&::cuDevicePrimaryCtxRetain) retain;
  decltype(&::cuDevicePrimaryCtxRelease_v2) release;
  decltype(&::cuCtxSetCurrent) set_current;
  decltype(&::cuStreamCreate) stream_create;
  decltype(&::cuStreamDestroy_v2) stream_destroy;
  decltype(&::cuStreamSynchronize) synchronize;
  decltype(&::cuMemAlloc_v2) alloc;
  decltype(&::cuMemFree_v2) free;
  decltype(&::cuMemcpyDtoDAsync_v2) dtod;
  decltype(&::cuMemcpy2DAsync_v2) copy_2d;
  decltype(&::cuMemcpyHtoDAsync_v2) htod;
  decltype(&::cuMemcpyDtoHAsync_v2) dtoh;
  decltype(&::cuMemHostAlloc) host_alloc;
  decltype(&::cuMemFreeHost) host_free;
  decltype(&::cuMemsetD8Async) memset;
  decltype(&::cuGetErrorString) error_string;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) function;
  decltype(&::cuLaunchKernel) launch;
  decltype(&::cuStreamBeginCapture_v2) begin_capture;
  decltype(&::cuStreamEndCapture) end_capture;
  decltype(&::cuGraphInstantiateWithFlags) instantiate;
  decltype(&::cuGraphLaunch) graph_launch;
  decltype(&::cuGraphExecDestroy) graph_exec_destroy;
  decltype(&::cuGraphDestroy) graph_destroy;

  // Loaded once per process and path; the library is never unloaded.
  static std::shared_ptr<const Driver> load(const std::string& path, const std::string& who) {
    static std::mutex mutex;
    static std::map<std::string, std::shared_ptr<const Driver>> loaded;
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = loaded[path]) return found;
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      const char* why = dlerror();
      throw Error(who + " needs an NVIDIA GPU and its driver: cannot load " + path + " (" +
                  (why ? why : "unknown error") + ")");
    }
    auto d = std::make_shared<Driver>();
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::decay_t<decltype(fn)>>(symbol(library, name, path, who));
    };
    get(d->init, "cuInit");
    get(d->device_get, "cuDeviceGet");
    get(d->device_attribute, "cuDeviceGetAttribute");
    get(d->retain, "cuDevicePrimaryCtxRetain");
    get(d->release, "cuDevicePrimaryCtxRelease_v2");
    get(d->set_current, "cuCtxSetCurrent");
    get(d->stream_create, "cuStreamCreate");
    get(d->stream_destroy, "cuStreamDestroy_v2");
    get(d->synchronize, "cuStreamSynchronize");
    get(d->alloc, "cuMemAlloc_v2");
    get(d->free, "cuMemFree_v2");
    get(d->dtod, "cuMemcpyDtoDAsync_v2");
    get(d->copy_2d, "cuMemcpy2DAsync_v2");
    get(d->htod, "cuMemcpyHtoDAsync_v2");
    get(d->dtoh, "cuMemcpyDtoHAsync_v2");
    get(d->host_alloc, "cuMemHostAlloc");
    get(d->host_free, "cuMemFreeHost");
    get(d->memset, "cuMemsetD8Async");
    get(d->error_string, "cuGetErrorString");
    get(d->module_load, "cuModuleLoadData");
    get(d->module_unload, "cuModuleUnload");
    get(d->function, "cuModuleGetFunction");
    get(d->launch, "cuLaunchKernel");
    get(d->begin_capture, "cuStreamBeginCapture_v2");
    get(d->end_capture, "cuStreamEndCapture");
    get(d->instantiate, "cuGraphInstantiateWithFlags");
    get(d->graph_launch, "cuGraphLaunch");
    get(d->graph_exec_destroy, "cuGraphExecDestroy");
    get(d->graph_destroy, "cuGraphDestroy");
    loaded[path] = d;
    return d;
  }
};

// -- device -------------------------------------------------------------------------------------

CudaDevice::CudaDevice(const std::string& driver_path, const std::string& who)
    : who_(who), driver_(Driver::load(driver_path, who)) {
  CUresult init = driver_->init(0);
  if (init != CUDA_SUCCESS) check(init, "initialising CUDA (is there a GPU?)");
  CUdevice device = 0;
  check(driver_->device_get(&device, 0), "opening GPU 0");
  check(driver_->retain(&context_, device), "retaining GPU 0's primary context");
  check(driver_->set_current(context_), "making GPU 0's context current");
  check(driver_->stream_create(&stream_, CU_STREAM_NON_BLOCKING), "creating a stream");
  int sms = 0;
  check(driver_->device_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "reading GPU 0's SM count");
  sms_ = sms;
  // scripts/decide_bench.py times both forms of the target-token kernel, and both block sizes, at the same
  // rows through these
  if (const char* pairs = std::getenv("DFLASH_DECIDE_WIDE_PAIRS")) wide_pairs_ = std::atoll(pairs);
  if (const char* threads = std::getenv("DFLASH_DECIDE_THREADS")) decide_threads_ = unsigned(std::atoi(threads));
}

CudaDevice::~CudaDevice() {
  if (module_) driver_->module_unload(module_);
  if (state_module_) driver_->module_unload(state_module_);
  if (stream_) driver_->stream_destroy(stream_);
  CUdevice device = 0;
  if (context_ && driver_->device_get(&device, 0) == CUDA_SUCCESS) driver_->release(device);
}

void CudaDevice::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  const char* message = nullptr;
  driver_->error_string(result, &message);
  throw Error(who_ + ": CUDA: " + what + ": " + (message ? message : "error " + std::to_string(result)));
}

// The driver API acts on the calling thread's current context, and phases may run on any thread (a
// server's): each call first makes ours current on this thread (once per thread).
void CudaDevice::bind() const {
  thread_local CUcontext current = nullptr;
  if (current == context_) return;
  check(driver_->set_current(context_), "making GPU 0's context current");
  current = context_;
}

void* CudaDevice::allocate(size_t bytes) {
  bind();
  CUdeviceptr p = 0;
  check(driver_->alloc(&p, bytes ? bytes : 1), "allocating slot buffers");
  check(driver_->memset(p, 0, bytes ? bytes : 1, stream_), "zeroing slot buffers");
  return reinterpret_cast<void*>(p);
}

void CudaDevice::free(void* p) noexcept {
  try {
    bind();
  } catch (const Error&) {
    return;  // no context on this thread: nothing can be freed through it (process teardown)
  }
  driver_->synchronize(stream_);  // nothing queued may still use it
  driver_->free(reinterpret_cast<CUdeviceptr>(p));
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  bind();
  if (bytes) check(driver_->dtod(CUdeviceptr(dst), CUdeviceptr(src), bytes, stream_), "copying on the device");
}

void CudaDevice::copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                           size_t rows) {
  bind();
  if (!width || !rows) return;
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = CUdeviceptr(src);
  copy.srcPitch = src_pitch;
  copy.dstDevice = CUdeviceptr(dst);
  copy.dstPitch = dst_pitch;
  copy.WidthInBytes = width;
  copy.Height = rows;
  check(driver_->copy_2d(&copy, stream_), "copying rows on the device");
}

void CudaDevice::upload(void* dst, const void* src, size_t bytes) {
  bind();
  if (bytes) check(driver_->htod(CUdeviceptr(dst), src, bytes, stream_), "copying to the device");
}

void CudaDevice::download(void* dst, const void* src, size_t bytes) {
  bind();
  if (bytes) check(driver_->dtoh(dst, CUdeviceptr(src), bytes, stream_), "copying from the device");
}

void* CudaDevice::host_allocate(size_t bytes) {
  bind();
  void* p = nullptr;
  check(driver_->host_alloc(&p, bytes ? bytes : 1, 0), "allocating page-locked host memory");
  return p;
}

void CudaDevice::host_free(void* p) noexcept {
  if (!p) return;
  try {
    bind();
  } catch (const Error&) {
    return;  // as free(): no context on this thread at process teardown
  }
  driver_->synchronize(stream_);  // no queued copy may still read or write it
  driver_->host_free(p);
}

void CudaDevice::zero(void* dst, size_t bytes) {
  bind();
  if (bytes) check(driver_->memset(CUdeviceptr(dst), 0, bytes, stream_), "zeroing device memory");
}

void CudaDevice::synchronize() {
  bind();
  check(driver_->synchronize(stream_), "waiting for the stream");
}

CUgraphExec CudaDevice::capture(const std::function<bool()>& enqueue) {
  bind();
  // thread-local: another thread's CUDA calls meanwhile are not this capture's business
  check(driver_->begin_capture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "beginning a CUDA graph capture");
  bool queued = false;
  try {
    queued = enqueue();
  } catch (...) {
    CUgraph dropped = nullptr;
    driver_->end_capture(stream_, &dropped);  // out of capture mode whatever the work did
    if (dropped) driver_->graph_destroy(dropped);
    throw;
  }
  CUgraph graph = nullptr;
  const CUresult ended = driver_->end_capture(stream_, &graph);
  CUgraphExec exec = nullptr;
  // work the driver could not capture invalidates the capture: the caller runs it eagerly instead
  if (queued && ended == CUDA_SUCCESS && graph && driver_->instantiate(&exec, graph, 0) != CUDA_SUCCESS)
    exec = nullptr;
  if (graph) driver_->graph_destroy(graph);
  return exec;
}

void CudaDevice::launch(CUgraphExec graph) {
  bind();
  check(driver_->graph_launch(graph, stream_), "launching a CUDA graph");
}

void CudaDevice::destroy(CUgraphExec graph) noexcept {
  if (!graph) return;
  try {
    bind();
  } catch (const Error&) {
    return;  // as free: no context on this thread (process teardown)
  }
  driver_->synchronize(stream_);  // nothing queued may still run it
  driver_->graph_exec_destroy(graph);
}

bool CudaDevice::decides() const {
#ifdef DFLASH_WITH_DEVICE_DECIDE
  return true;
#else
  return false;
#endif
}

#ifdef DFLASH_WITH_DEVICE_DECIDE
void CudaDevice::load_decide_module() {
  if (module_) return;  // once: the driver picks this GPU's SM from the fatbin (or JIT-compiles its PTX)
  check(driver_->module_load(&module_, kDecideKernelFatbin), "loading the decision kernel");
  check(driver_->function(&tokens_, module_, "dflash_target_tokens"), "finding the target-token kernel");
  if (driver_->function(&tokens_wide_, module_, "dflash_target_tokens_wide") != CUDA_SUCCESS) tokens_wide_ = nullptr;
  if (driver_->function(&draw_wide_, module_, "dflash_draw_drafts_wide") != CUDA_SUCCESS) draw_wide_ = nullptr;
  check(driver_->function(&decide_, module_, "dflash_decide_rows"), "finding the decision kernel");
  check(driver_->function(&logprobs_, module_, "dflash_decided_logprobs"), "finding the logprobs kernel");
  check(driver_->function(&draw_, module_, "dflash_draw_drafts"), "finding the draft kernel");
  check(driver_->function(&penalize_, module_, "dflash_penalize"), "finding the penalty kernel");
}
#else
void CudaDevice::load_decide_module() {
  DFLASH_INVARIANT(false);  // decides() is false: the executor decides on the host
}
#endif

unsigned CudaDevice::decide_threads(int64_t pairs) const {
  if (decide_threads_ > 0) return decide_threads_;
  return pairs <= sms_ ? kDecideThreads : kDecideThreads / 2;
}

void CudaDevice::launch_pairs(CUfunction block, CUfunction wide, int64_t rows, int64_t y, void** args,
                              const char* what) {
  // few pairs leave most SMs idle with a block each: a cluster of blocks each then
  const bool clustered = wide && rows * y <= wide_pairs_;
  unsigned threads = clustered ? kDecideThreads : decide_threads(rows * y);
  check(driver_->launch(clustered ? wide : block, unsigned(rows * (clustered ? kDecideCluster : 1)), unsigned(y), 1,
                        threads, 1, 1, 0, stream_, args, nullptr),
        what);
}

void CudaDevice::penalize(float* logits, int64_t vocab, const PenaltyRow* rows, int64_t count, int64_t positions,
                          const PenaltyEntry* entries, const int32_t* tokens, const uint32_t* masks) {
  bind();
  load_decide_module();
  if (count == 0) return;
  void* args[] = {&logits, &vocab, &rows, &entries, &tokens, &masks};
  check(driver_->launch(penalize_, unsigned(count), unsigned(positions), 1, kPenaltyThreads, 1, 1, 0, stream_, args,
                        nullptr),
        "launching the penalty kernel");
}

void CudaDevice::decide(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
                        const int64_t* drafts, const DraftQ& drafter, float* probs, int32_t* order, Verdict* out,
                        TokenLogprob* logprobs) {
  bind();
  load_decide_module();
  if (count == 0) return;
  int32_t* tokens = order;  // the scratch's head (device.h); the per-position ids after it
  int32_t* ids = order + count * positions;
  DraftQ q = drafter;
  void* token_args[] = {&logits, &vocab, &rows, &drafts, &q, &probs, &ids, &tokens};
  launch_pairs(tokens_, tokens_wide_, count, positions, token_args, "launching the target-token kernel");
  void* args[] = {&rows, &tokens, &out, &positions};
  check(driver_->launch(decide_, unsigned(count), 1, 1, 1, 1, 1, 0, stream_, args, nullptr),
        "launching the decision kernel");
  if (logprobs == nullptr) return;
  void* logprob_args[] = {&logits, &vocab, &rows, &drafts, &out, &ids, &logprobs};
  check(driver_->launch(logprobs_, unsigned(count), unsigned(positions), 1, kDecideThreads, 1, 1, 0, stream_,
                        logprob_args, nullptr),
        "launching the logprobs kernel");
}

void CudaDevice::score(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
                       const int64_t* drafts, const Verdict* verdicts, int32_t* order, TokenLogprob* logprobs) {
  bind();
  load_decide_module();
  if (count == 0) return;
  void* args[] = {&logits, &vocab, &rows, &drafts, &verdicts, &order, &logprobs};
  check(driver_->launch(logprobs_, unsigned(count), unsigned(positions), 1, kDecideThreads, 1, 1, 0, stream_, args,
                        nullptr),
        "launching the logprobs kernel");
}

void CudaDevice::draw_drafts(const float* scores, const int64_t* columns, int64_t top_k, const DecideRow* rows,
                             int64_t count, int64_t drafts, const int64_t* ids, const DraftQ& q, float* probs,
                             int32_t* order, int64_t* tokens) {
  bind();
  load_decide_module();
  if (count == 0 || drafts == 0) return;
  DraftQ out = q;
  void* args[] = {&scores, &columns, &top_k, &rows, &ids, &out, &probs, &order, &tokens};
  // a DFlash2 selector's walk is a block per row whatever the rows (no cluster form)
  launch_pairs(draw_, top_k == 0 ? draw_wide_ : nullptr, count, top_k > 0 ? 1 : drafts, args,
               "launching the draft kernel");
}

void CudaDevice::rebuild_states(const StateRebuild& job) {
#ifdef DFLASH_WITH_DEVICE_DECIDE
  bind();
  if (!state_module_) {
    check(driver_->module_load(&state_module_, kStateKernelFatbin), "loading the state kernels");
    check(driver_->function(&rebuild_delta_, state_module_, "dflash_rebuild_delta"), "finding the delta-rule kernel");
    check(driver_->function(&rebuild_conv_, state_module_, "dflash_rebuild_conv"), "finding the conv-state kernel");
  }
  if (job.count == 0) return;
  float* recurrent = job.recurrent;
  const float* delta_inputs = job.delta_inputs;
  const RebuildRow* rows = job.rows;
  int64_t tokens = job.tokens;
  DeltaShape shape = job.shape;
  void* delta_args[] = {&recurrent, &delta_inputs, &rows, &tokens, &shape};
  const unsigned columns = unsigned(std::min<int64_t>(shape.value_dim, 256));
  check(driver_->launch(rebuild_delta_, unsigned(job.count), unsigned(shape.value_heads), 1, columns, 1, 1, 0, stream_,
                        delta_args, nullptr),
        "launching the delta-rule kernel");
  char* conv = job.conv;
  const char* conv_inputs = job.conv_inputs;
  int64_t channels = job.channels, width = job.conv_width, element = job.element;
  void* conv_args[] = {&conv, &conv_inputs, &rows, &channels, &width, &tokens, &element};
  check(driver_->launch(rebuild_conv_, unsigned(job.count), 1, 1, 256, 1, 1, 0, stream_, conv_args, nullptr),
        "launching the conv-state kernel");
#else
  (void)job;
  throw Error("cuda: this dflash_trt core was built without nvcc, so without the kernels that commit a hybrid "
              "target's states on a GPU: rebuild it where nvcc is installed");
#endif
}

}  // namespace dflash
