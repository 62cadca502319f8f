// The attention benchmark as a function, so that both its own program
// (bench_attention) and the test that times every case of the list
// (tests/ops/attention/test_cases.cpp) run it.
#pragma once

// argv[0] is the program name; see bench/attention.cpp for the options.
// Returns the exit status; throws on bad arguments.
int bench_attention_main(int argc, char** argv);
