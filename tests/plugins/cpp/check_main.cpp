// Runs the registered TEST cases: all of them, or the ones named as arguments. Exit status 1 on any failure.
#include <cstring>

#include "check.h"

int main(int argc, char** argv) {
  int ran = 0;
  for (const check::Case& c : check::cases()) {
    bool wanted = argc < 2;
    for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], c.name) == 0;
    if (!wanted) continue;
    const int before = check::failures();
    c.run();
    ++ran;
    std::printf("%s %s\n", check::failures() == before ? "ok  " : "FAIL", c.name);
  }
  std::printf("%d cases, %d failed checks\n", ran, check::failures());
  return check::failures() == 0 && ran > 0 ? 0 : 1;
}
