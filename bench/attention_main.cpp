// bench_attention: see bench/attention.cpp.
#include <cstdio>
#include <exception>

#include "bench/attention.h"

int main(int argc, char** argv) {
  try {
    return bench_attention_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: error: %s\n", e.what());
    return 1;
  }
}
