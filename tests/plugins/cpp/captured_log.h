// A TensorRT logger finder that keeps what the plugin library logs, for tests of its error messages.
#pragma once

#include <NvInferRuntime.h>

#include <string>

extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder);  // the library's entry point

class CapturedLog : public nvinfer1::ILoggerFinder, public nvinfer1::ILogger {
 public:
  CapturedLog() { setLoggerFinder(this); }
  ~CapturedLog() override { setLoggerFinder(nullptr); }
  nvinfer1::ILogger* findLogger() override { return this; }
  void log(Severity severity, const char* message) noexcept override {
    if (severity <= Severity::kERROR) text += std::string(message) + "\n";
  }
  bool contains(const std::string& part) const { return text.find(part) != std::string::npos; }
  std::string text;
};
