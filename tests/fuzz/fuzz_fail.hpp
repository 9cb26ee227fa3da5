// A broken invariant in a fuzz harness: names the harness line (the check
// and its comment are the reason) before the trap, so CI's log says what
// failed and not only where libFuzzer caught the signal.
#pragma once

#include <cstdio>

[[noreturn]] inline void kvs_fuzz_fail(const char* file, int line) {
  std::fprintf(stderr, "fuzz invariant broken at %s:%d\n", file, line);
  std::fflush(stderr);
  __builtin_trap();
}

#define KVS_FUZZ_FAIL() kvs_fuzz_fail(__FILE__, __LINE__)
