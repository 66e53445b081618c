// cost_model.h: how long one executor phase call takes, by (rows, block size), learnt from timings.
//
// The adaptive policy (adaptive.h) compares block sizes it may never have run, so the model must
// answer for any (rows, B): a measured cell answers with its own running mean; otherwise a line
// a + b * tokens (tokens = rows * B) fitted by least squares, over the measured cells with the same
// number of rows when there are two block sizes of them (an executor that loops over rows has a
// per-row intercept a global line would miss), else over every measured cell. The fit is redone on
// each call (a handful of cells). Seeded calibrations and live timings are the same kind of data, but
// for a shape's first live call, which is not kept: it pays one-time set-up (onnxruntime plans a new
// shape, a GPU captures a CUDA graph), and a cell holding it looks too dear for the policy ever to
// choose, and so re-time, that block again (seen: B = 4 timed once at 43 ms, where it runs in 35, left
// a 2-core CPU verifying B = 5 at 40 ms for good, 5-9 % slower than a fixed B = 4).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
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

  // One timed call over `rows` rows at block size `block`: the first of its shape is dropped (above).
  void observe(int64_t rows, int64_t block, double seconds);
  // A timing taken after an untimed call of the same shape (a calibration's): kept from the first.
  void observe_warm(int64_t rows, int64_t block, double seconds);
  // Estimated seconds of a call; unset before any observation.
  std::optional<double> predict(int64_t rows, int64_t block) const;
  std::vector<Cell> cells() const;
  bool empty() const { return cells_.empty(); }

 private:
  void record(int64_t rows, int64_t block, double seconds);  // a checked timing into its cell's mean
  std::map<std::pair<int64_t, int64_t>, Cell> cells_;
  std::set<std::pair<int64_t, int64_t>> first_seen_;  // shapes whose first live call was dropped
};

}  // namespace dflash
