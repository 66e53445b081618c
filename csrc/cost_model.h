// cost_model.h: how long one executor phase call takes, by (rows, block size), learnt from timings.
//
// The adaptive policy (adaptive.h) compares block sizes it may never have run, so the model must
// answer for any (rows, B): a measured cell answers with its own running mean; otherwise a line
// a + b * tokens (tokens = rows * B) fitted by least squares, over the measured cells with the same
// number of rows when there are two block sizes of them (an executor that loops over rows has a
// per-row intercept a global line would miss), else over every measured cell. The fit is redone on
// each call (a handful of cells). A call that paid one-time set-up (onnxruntime planning a new shape,
// a GPU capturing a CUDA graph: Executor::set_up_runs) is not a timing and must not come here: a cell
// holding one looks too dear for the policy ever to choose, and so re-time, that block again (seen: B
// = 4 timed once at 43 ms, where it runs in 35, left a 2-core CPU verifying B = 5 at 40 ms for good,
// 5-9 % slower than a fixed B = 4).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace dflash {

class CostModel {
 public:
  struct Cell {
    int64_t rows = 0, block = 0;
    double seconds = 0.0;  // running mean
    int64_t count = 0;
  };

  // One timed call over `rows` rows at block size `block`, set-up paid before it.
  void observe(int64_t rows, int64_t block, double seconds);
  // Estimated seconds of a call; unset before any observation.
  std::optional<double> predict(int64_t rows, int64_t block) const;
  std::vector<Cell> cells() const;
  bool empty() const { return cells_.empty(); }

 private:
  std::map<std::pair<int64_t, int64_t>, Cell> cells_;
};

}  // namespace dflash
