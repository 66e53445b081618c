// errors.h: the two ways the core fails, and how each reaches Python.
//
// A mistake the caller can fix (a request over capacity, no free slot, bad parameters) throws
// dflash::Error with one line saying what, where and how to fix; the binding maps it to
// dflash_trt.errors.DFlashError. A broken internal invariant throws dflash::InvariantError, which
// reaches Python as AssertionError. Neither aborts the process: a server keeps serving the other
// requests, which a C assert() could not promise.
#pragma once

#include <stdexcept>
#include <string>

namespace dflash {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InvariantError : std::logic_error {
  using std::logic_error::logic_error;
};

}  // namespace dflash

// Checked in every build type: these guard memory the executors will write through raw pointers.
#define DFLASH_INVARIANT(cond)                                                                   \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      throw ::dflash::InvariantError(std::string(__FILE__) + ":" + std::to_string(__LINE__) +   \
                                     ": invariant failed: " #cond);                              \
  } while (0)
