// A minimal harness for the plugin library's C++ tests: TEST(name) registers a case, CHECK(cond)
// records a failure with its line, check_main.cpp runs every case (or those named on the command line).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace check {

struct Case {
  const char* name;
  void (*run)();
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

inline int& failures() {
  static int count = 0;
  return count;
}

struct Register {
  Register(const char* name, void (*run)()) { cases().push_back({name, run}); }
};

inline std::string show(const std::string& s) { return '"' + s + '"'; }
inline std::string show(const char* s) { return s ? show(std::string(s)) : "null"; }
template <size_t N>
std::string show(const char (&s)[N]) {
  return show(std::string(s));
}
template <typename T>
std::string show(const T& value) {
  return std::to_string(value);
}

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "%s:%d: %s\n", file, line, what.c_str());
}

}  // namespace check

#define TEST(name)                                              \
  static void name();                                           \
  static const check::Register name##_registered{#name, &name}; \
  static void name()

#define CHECK(cond) ((cond) ? void() : check::fail(__FILE__, __LINE__, std::string("CHECK failed: ") + #cond))

// Equality of two printable values (numbers or strings), showing both on failure.
#define CHECK_EQ(a, b)                                                                                          \
  do {                                                                                                          \
    const auto& check_a_ = (a);                                                                                 \
    const auto& check_b_ = (b);                                                                                 \
    if (!(check_a_ == check_b_))                                                                                \
      check::fail(__FILE__, __LINE__,                                                                           \
                  std::string("CHECK_EQ failed: ") + #a + " == " + #b + " (" + check::show(check_a_) + " vs " + \
                      check::show(check_b_) + ")");                                                             \
  } while (0)
