// bench_attention: see bench/attention.cpp.
#include "bench/attention.h"
#include "bench/bench_args.h"

int main(int argc, char** argv) {
  return forge::bench::bench_main("bench_attention", argc, argv, bench_attention_main);
}
