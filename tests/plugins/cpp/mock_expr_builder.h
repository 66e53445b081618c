// An IExprBuilder for shape-inference tests, without TensorRT. TensorRT's IExprBuilder and
// IDimensionExpr forward every call to apiv::VExprBuilder / apiv::VDimensionExpr (NvInferImpl.h);
// the mock implements those, and each expression carries its text: a symbol "b" or a constant "4".
#pragma once

#include <NvInferRuntime.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

class MockExpr : public nvinfer1::IDimensionExpr {
 public:
  MockExpr(std::string text, bool constant, int64_t value) : text(std::move(text)), impl_(constant, value) {
    mImpl = &impl_;
  }
  const std::string text;

 private:
  struct Impl : nvinfer1::apiv::VDimensionExpr {
    Impl(bool constant, int64_t value) : constant(constant), value(value) {}
    bool isConstant() const override { return constant; }
    int64_t getConstantValue() const override { return constant ? value : std::numeric_limits<int64_t>::min(); }
    bool isSizeTensor() const override { return false; }
    bool constant;
    int64_t value;
  } impl_;
};

inline std::string text_of(const nvinfer1::IDimensionExpr* expr) {
  return expr ? static_cast<const MockExpr*>(expr)->text : "null";
}

class MockExprBuilder : public nvinfer1::IExprBuilder {
 public:
  MockExprBuilder() : impl_(this) { mImpl = &impl_; }
  const nvinfer1::IDimensionExpr* symbol(const std::string& name) { return make(name, false, 0); }

  // DimsExprs from symbols ("b") and constants ("64").
  nvinfer1::DimsExprs dims(const std::vector<std::string>& names) {
    nvinfer1::DimsExprs out{};
    out.nbDims = static_cast<int32_t>(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const bool number = !names[i].empty() && names[i].find_first_not_of("0123456789") == std::string::npos;
      out.d[i] = number ? constant(std::stoll(names[i])) : symbol(names[i]);
    }
    return out;
  }

 private:
  const nvinfer1::IDimensionExpr* make(std::string text, bool constant, int64_t value) {
    exprs_.push_back(std::make_unique<MockExpr>(std::move(text), constant, value));
    return exprs_.back().get();
  }

  struct Impl : nvinfer1::apiv::VExprBuilder {
    explicit Impl(MockExprBuilder* owner) : owner(owner) {}
    const nvinfer1::IDimensionExpr* constant(int64_t value) override {
      return owner->make(std::to_string(value), true, value);
    }
    // Sums and differences as text, "(s - f)"; any other operation is null, failing the test that asks.
    const nvinfer1::IDimensionExpr* operation(nvinfer1::DimensionOperation op, const nvinfer1::IDimensionExpr& first,
                                              const nvinfer1::IDimensionExpr& second) override {
      const char* sign = op == nvinfer1::DimensionOperation::kSUM   ? " + "
                         : op == nvinfer1::DimensionOperation::kSUB ? " - "
                                                                    : nullptr;
      if (sign == nullptr) return nullptr;
      return owner->make("(" + text_of(&first) + sign + text_of(&second) + ")", false, 0);
    }
    const nvinfer1::IDimensionExpr* declareSizeTensor(int32_t, const nvinfer1::IDimensionExpr&,
                                                      const nvinfer1::IDimensionExpr&) override {
      return nullptr;  // no dflash op has data-dependent output shapes
    }
    MockExprBuilder* owner;
  } impl_;
  std::vector<std::unique_ptr<MockExpr>> exprs_;
};
