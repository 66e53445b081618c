// device.h: where a slot executor's buffers live, and the element types its graphs exchange.
//
// The slot executor (slot_executor.h) keeps caches, states and graph outputs in a Device's memory
// and host arrays (token ids, lengths, logits) on the host. onnxruntime on the CPU runs graphs over
// host memory, so its device is the host and staging costs nothing (no copy); TensorRT's is a CUDA
// device, where inputs are uploaded and outputs downloaded around each run.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "decide.h"
#include "penalties.h"
#include "errors.h"
#include "state_rebuild.h"

namespace dflash {

// Element types of graph I/O. Caches, features and conv states are in the bundle's dtype;
// recurrent states and logits are float32; ids and lengths int64.
enum class DType { float32, float16, bfloat16, int64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::int64: return 8;
  }
  DFLASH_INVARIANT(false);
  return 0;
}

// A bundle's dtype name (bundle.json "dtype") -> its DType; one line for any other.
inline DType float_dtype(const std::string& name, const std::string& who) {
  if (name == "float32") return DType::float32;
  if (name == "float16") return DType::float16;
  if (name == "bfloat16") return DType::bfloat16;
  throw Error(who + ": unknown dtype '" + name + "' (float32, float16 or bfloat16)");
}

// Memory the graphs read and write. Every call is ordered after the previous ones (a CUDA device
// uses one stream); `synchronize` waits for all of them before the host reads a download.
class Device {
 public:
  virtual ~Device() = default;
  virtual bool is_host() const = 0;  // its pointers are host pointers: staging is free
  virtual void* allocate(size_t bytes) = 0;  // zero-filled
  virtual void free(void* p) noexcept = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;      // device -> device
  // `rows` rows of `width` bytes, device -> device, rows `dst_pitch` / `src_pitch` bytes apart: one
  // call for every head of a slot (a CUDA device issues one 2-D copy, not one copy per head).
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                         size_t rows) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;    // host -> device
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // device -> host
  // Host memory for the arrays that cross (Staged): page-locked on a GPU, where a copy from pageable
  // memory would be staged by the driver through its own buffer and block the host; plain elsewhere.
  virtual void* host_allocate(size_t bytes) { return std::malloc(bytes); }
  virtual void host_free(void* p) noexcept { std::free(p); }
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // Whether `decide` runs here: a GPU decides the rows of a phase where their logits are (decide.h's
  // rules as a kernel), so only verdicts cross to the host. False: the executor downloads logits.
  virtual bool decides() const { return false; }
  // rows[0..count) over logits [*, vocab] -> out[0..count); every pointer is this device's memory,
  // scratch probs [count, positions, vocab] (read only for sampled rows) and order: [count, positions]
  // decisions, then [count, positions, vocab] (read only for sampled rows and rows asking for logprobs);
  // `positions`: the most logits rows a row decides (its drafts + 1); drafter: the drafter rule's q rows
  // for rows with DecideRow::q >= 0 (decide.h); logprobs (null: no row asks) [count, positions, 1 +
  // kMaxLogprobs]: a row that asks gets its decided tokens' entries (decide.h's logprobs_row_by).
  // Ordered after the calls before it, like a copy.
  virtual void decide(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
                      const int64_t* drafts, const DraftQ& drafter, float* probs, int32_t* order, Verdict* out,
                      TokenLogprob* logprobs) {
    (void)logits, (void)vocab, (void)rows, (void)count, (void)positions, (void)drafts, (void)drafter, (void)probs,
        (void)order, (void)out, (void)logprobs;
    DFLASH_INVARIANT(false);
  }
  // Given tokens' log-probabilities (a prompt's): row k's tokens j <= verdicts[k].accepted (its drafts,
  // then verdicts[k].next) under logits rows rows[k].first + j -> logprobs [count, positions, 1 +
  // kMaxLogprobs] with rows[k].sampling.logprobs top ones (decide.h's logprobs_row_by); scratch order
  // [count, positions, vocab]. Only where `decides`; ordered after the calls before it.
  virtual void score(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
                     const int64_t* drafts, const Verdict* verdicts, int32_t* order, TokenLogprob* logprobs) {
    (void)logits, (void)vocab, (void)rows, (void)count, (void)positions, (void)drafts, (void)verdicts, (void)order,
        (void)logprobs;
    DFLASH_INVARIANT(false);
  }
  // Penalties and constraint masks (penalties.h) of rows[0..count) over logits [*, vocab], in place,
  // `positions` the most any row has; rows, entries, tokens and masks are this device's memory. Only
  // where `decides`; ordered after the calls before it.
  virtual void penalize(float* logits, int64_t vocab, const PenaltyRow* rows, int64_t count, int64_t positions,
                        const PenaltyEntry* entries, const int32_t* tokens, const uint32_t* masks) {
    (void)logits, (void)vocab, (void)rows, (void)count, (void)positions, (void)entries, (void)tokens, (void)masks;
    DFLASH_INVARIANT(false);
  }
  // The drafter rule's drafts of a block pass's rows (decide_kernel.cu's dflash_draw_drafts states the
  // layouts): rows[0..count), each drawing `drafts` positions (num_drafts) or none (0); scores: the
  // block pass's logits [count, drafts, q.draft_vocab], or with top_k > 0 a DFlash2 selector's scores
  // [count, drafts, k, k] and columns [count, drafts, k]; ids: a draft id's target id (null: the same)
  // -> tokens [count, drafts] and q.q [count, drafts, q.draft_vocab]. Scratch: probs [count, drafts, k],
  // order [count, drafts, max(k, draft_vocab)]. Only where `decides`; ordered after the calls before it.
  virtual void draw_drafts(const float* scores, const int64_t* columns, int64_t top_k, const DecideRow* rows,
                           int64_t count, int64_t drafts, const int64_t* ids, const DraftQ& q, float* probs,
                           int32_t* order, int64_t* tokens) {
    (void)scores, (void)columns, (void)top_k, (void)rows, (void)count, (void)drafts, (void)ids, (void)q, (void)probs,
        (void)order, (void)tokens;
    DFLASH_INVARIANT(false);
  }
  // One linear layer's states of a commit's partly kept rows, rebuilt in place (state_rebuild.h);
  // every pointer in `job` is this device's memory. Ordered after the calls before it, like a copy.
  virtual void rebuild_states(const StateRebuild& job) = 0;

  uint64_t host_bytes = 0;  // bytes staged across the host boundary so far (Staged uploads and downloads)
};

// The host as a device: what onnxruntime's CPU provider reads and writes.
class HostDevice final : public Device {
 public:
  bool is_host() const override { return true; }
  void* allocate(size_t bytes) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes of slot buffers");
    return p;
  }
  void free(void* p) noexcept override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override {
    for (size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void rebuild_states(const StateRebuild& job) override { host_rebuild(job); }
  void synchronize() override {}
};

// Owned device memory of one element type, grown on demand (never shrunk: buffers are reused
// every step, so after the first steps nothing is allocated).
class Buffer {
 public:
  Buffer(Device& device, DType dtype) : device_(&device), dtype_(dtype) {}
  Buffer(Buffer&& o) noexcept : device_(o.device_), dtype_(o.dtype_), data_(o.data_), count_(o.count_) {
    o.data_ = nullptr;
    o.count_ = 0;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer& operator=(Buffer&&) = delete;
  ~Buffer() {
    if (data_) device_->free(data_);
  }

  // At least `count` elements (zero-filled when newly allocated; old contents are not kept).
  void reserve(size_t count) {
    if (count <= count_ && data_) return;
    if (data_) device_->free(data_);
    data_ = nullptr;
    data_ = device_->allocate(count * dtype_size(dtype_));
    count_ = count;
  }
  DType dtype() const { return dtype_; }
  size_t element() const { return dtype_size(dtype_); }
  size_t bytes() const { return count_ * element(); }
  // Gives the memory back (the next reserve allocates anew).
  void release() {
    if (data_) device_->free(data_);
    data_ = nullptr;
    count_ = 0;
  }
  // Element `index` (bounds checked against what was reserved).
  char* at(size_t index) const {
    DFLASH_INVARIANT(data_ && index <= count_);
    return static_cast<char*>(data_) + index * element();
  }

 private:
  Device* device_;
  DType dtype_;
  void* data_ = nullptr;
  size_t count_ = 0;
};

// std::vector's allocator over a device's host memory (Device::host_allocate).
template <typename T>
struct HostAllocator {
  using value_type = T;
  Device* device;
  explicit HostAllocator(Device& d) : device(&d) {}
  template <typename U>
  HostAllocator(const HostAllocator<U>& other) : device(other.device) {}
  T* allocate(size_t n) {
    void* p = device->host_allocate(n * sizeof(T));
    if (!p) throw Error("out of host memory allocating " + std::to_string(n * sizeof(T)) + " staging bytes");
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { device->host_free(p); }
  bool operator==(const HostAllocator& other) const { return device == other.device; }
  bool operator!=(const HostAllocator& other) const { return device != other.device; }
};

// A host array a graph reads (upload before the run) or writes (download after it), in the device's
// host memory (pinned on a GPU). On a host device the graph uses the array itself, so neither moves
// a byte. T is the element type, or char for raw bytes of `dtype` (features, in the bundle's dtype).
template <typename T>
class Staged {
 public:
  Staged(Device& device, DType dtype) : host(HostAllocator<T>(device)), device_(&device), mirror_(device, dtype) {
    DFLASH_INVARIANT(sizeof(T) == dtype_size(dtype) || sizeof(T) == 1);
  }
  std::vector<T, HostAllocator<T>> host;

  void* device_data() { return device_data(host.size()); }
  // The device array for `count` elements of T: a graph may fill it and the device read it without the
  // host array ever holding them (a GPU's logits, decided there). On a host device it is the host array.
  void* device_data(size_t count) {
    if (device_->is_host()) {
      DFLASH_INVARIANT(count <= host.size());
      return host.data();
    }
    // raw bytes round up to whole elements: a mirror one element short is written past by the upload
    mirror_.reserve((count * sizeof(T) + mirror_.element() - 1) / mirror_.element());
    return mirror_.at(0);
  }
  DType dtype() const { return mirror_.dtype(); }
  // Gives the host array's and the mirror's memory back (both grow anew at the next use).
  void release() {
    std::vector<T, HostAllocator<T>>(host.get_allocator()).swap(host);
    mirror_.release();
  }
  void upload() {
    if (device_->is_host()) return;
    device_->upload(device_data(), host.data(), host.size() * sizeof(T));
    device_->host_bytes += host.size() * sizeof(T);
  }
  void download() {
    if (device_->is_host()) return;
    device_->download(host.data(), device_data(), host.size() * sizeof(T));
    device_->host_bytes += host.size() * sizeof(T);
  }

 private:
  Device* device_;
  Buffer mirror_;
};

}  // namespace dflash
