// Shared by the checkpoint tests (test_checkpoint.cpp: the format, atomic
// writes, corrupt checkpoints; test_checkpoint_manager.cpp: a run's
// retention, pointers, fallbacks and kills): made-up checkpoints, byte-level
// damage, and the fixture that resets the fault hook around each test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "core/fault.h"
#include "core/safetensors.h"
#include "tests/test_util.h"
#include "train/checkpoint.h"

namespace forge::train::checkpoint_testing {

namespace fs = std::filesystem;
using namespace forge::testing;

inline std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A checkpoint whose every byte depends on `seed`, with awkward values: the
// extremes of i64, -0.0, subnormals, a uint64 seed above INT64_MAX in the state.
inline Checkpoint make_checkpoint(uint64_t seed) {
  Generator g(seed);
  Checkpoint c;
  c.model["blocks.0.w"] = Tensor::randn({3, 4}, DType::f32, &g);
  c.model["blocks.0.b"] =
      Tensor::from_vector<double>({-0.0, 5e-324, 1e300, static_cast<double>(seed) / 3.0}, {4});
  c.model["steps"] = Tensor::from_vector<int64_t>(
      {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
       static_cast<int64_t>(seed)},
      {3});
  c.optimizer["state.0.exp_avg"] = Tensor::randn({3, 4}, DType::f32, &g);
  c.optimizer["state.0.exp_avg_sq"] = Tensor::rand({2, 2}, DType::f64, &g);
  c.optimizer["state.0.step"] = Tensor::scalar(static_cast<double>(seed), DType::i64);
  c.recipe_yaml = fmt::format("model:\n  dim: 8\n  name: \"vit \\u00e9\"\nseed: {}\n", seed);
  json::Object state;
  state.emplace_back("step", json::Value(static_cast<int64_t>(seed * 100)));
  state.emplace_back("epoch", json::Value(2));
  state.emplace_back("rng", json::Value(json::Array{json::Value(uint64_t{0xfedcba9876543210ULL}),
                                                    json::Value(seed)}));
  state.emplace_back("lr", json::Value(3e-4 * static_cast<double>(seed)));
  c.state = json::Value(std::move(state));
  return c;
}

inline bool same_tensors(const std::map<std::string, Tensor>& a,
                         const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.dtype() != t.dtype() || it->second.shape() != t.shape() ||
        bytes_of(it->second) != bytes_of(t))
      return false;
  }
  return true;
}

inline bool same(const Checkpoint& a, const Checkpoint& b) {
  return same_tensors(a.model, b.model) && same_tensors(a.optimizer, b.optimizer) &&
         a.recipe_yaml == b.recipe_yaml && a.state == b.state;
}

// The header length of safetensors `bytes`: the data section starts at 8 + it.
inline uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// Flips one bit in the middle of `tensor`'s bytes in the data section of the
// safetensors file `path`, leaving its header as it was.
inline void flip_tensor_byte(const fs::path& path, const std::string& tensor) {
  std::string bytes = read_file(path);
  const uint64_t n = header_length(bytes);
  const json::Value offsets =
      json::parse(bytes.substr(8, n), "header").at(tensor).at("data_offsets");
  const uint64_t begin = offsets.at(0).as_uint(), end = offsets.at(1).as_uint();
  ASSERT_LT(begin, end) << tensor << " has no bytes";
  const size_t at = 8 + n + (begin + end) / 2;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x04);
  write_file(path, bytes);
}

// Rewrites the safetensors file `path` as a writer without checksums made it:
// the same tensors, offsets and bytes, and no __metadata__ key starting with
// `prefix`.
inline void strip_metadata(const fs::path& path, const std::string& prefix) {
  const std::string bytes = read_file(path);
  const uint64_t n = header_length(bytes);
  json::Value header = json::parse(bytes.substr(8, n), "header");
  std::erase_if(header["__metadata__"].as_object(),
                [&](const auto& kv) { return kv.first.starts_with(prefix); });
  std::string text = json::dump(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  write_file(path, std::string(reinterpret_cast<const char*>(&m), 8) + text + bytes.substr(8 + n));
}

// A checkpoint directory as attnforge wrote it before checksums.
inline void strip_checksums(const fs::path& dir) {
  strip_metadata(dir / "model.safetensors", "xxh3_64:");
  strip_metadata(dir / "optimizer.safetensors", "xxh3_64:");
  strip_metadata(dir / "optimizer.safetensors", "state_json_xxh3_64");
}

// Changes a digit of state.json's "epoch" (2 -> 3): still valid JSON, still an object.
inline void change_state_digit(const fs::path& dir) {
  std::string text = read_file(dir / "state.json");
  const size_t at = text.find("\"epoch\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 9] = '3';
  write_file(dir / "state.json", text);
}

// A fresh directory per test; fault hooks reset around each.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fault::arm({});
    set_checkpoint_rename_exchange(true);
  }
  void TearDown() override {
    fault::arm({});
    set_checkpoint_rename_exchange(true);
  }
  testing::TempDir tmp_;
  const fs::path root_ = tmp_.path();
};

}  // namespace forge::train::checkpoint_testing
