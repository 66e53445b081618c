// cost_model.cpp: running means per (rows, B) and a least-squares line in tokens between them.
#include "cost_model.h"

#include <algorithm>
#include <string>

#include "errors.h"

namespace dflash {

namespace {
// The first calls average plainly; after that a cell follows drift (a warming cache, another
// process on the machine) with weight 1/kWindow on the newest timing.
constexpr int64_t kWindow = 10;

// a + b * tokens through (tokens, seconds) points; never a negative slope or intercept (a call never
// gets cheaper with more tokens, and costs something): flat when b < 0, through 0 when a < 0.
double fit(const std::vector<std::pair<double, double>>& points, double tokens) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : points) sx += x, sy += y, sxx += x * x, sxy += x * y;
  const double n = double(points.size()), mx = sx / n, my = sy / n;
  const double var = sxx / n - mx * mx;
  if (var <= 0) return my;  // one distinct size: the best guess is its mean
  double b = (sxy / n - mx * my) / var, a = my - b * mx;
  if (b < 0) b = 0, a = my;
  if (a < 0) a = 0, b = sxy / sxx;
  return a + b * tokens;
}

}  // namespace

void CostModel::observe(int64_t rows, int64_t block, double seconds) {
  DFLASH_INVARIANT(rows >= 1 && block >= 1);
  if (!(seconds >= 0)) throw Error("a phase cost must be a number of seconds >= 0, got " + std::to_string(seconds));
  Cell& c = cells_[{rows, block}];
  c.rows = rows;
  c.block = block;
  ++c.count;
  c.seconds += (seconds - c.seconds) / double(std::min(c.count, kWindow));
}

std::optional<double> CostModel::predict(int64_t rows, int64_t block) const {
  if (cells_.empty()) return std::nullopt;
  auto hit = cells_.find({rows, block});
  if (hit != cells_.end()) return hit->second.seconds;
  std::vector<std::pair<double, double>> same_rows, all;
  for (const auto& [key, c] : cells_) {
    all.emplace_back(double(c.rows * c.block), c.seconds);
    if (c.rows == rows) same_rows.emplace_back(double(c.rows * c.block), c.seconds);
  }
  const double tokens = double(rows * block);
  return fit(same_rows.size() >= 2 ? same_rows : all, tokens);
}

std::vector<CostModel::Cell> CostModel::cells() const {
  std::vector<Cell> out;
  for (const auto& [key, c] : cells_) out.push_back(c);
  return out;
}

}  // namespace dflash
