// Where a tensor lives: the CPU, or CUDA device `index`.
#pragma once

#include <string>

namespace forge {

struct Device {
  enum class Type { cpu, cuda };
  Type type = Type::cpu;
  int index = 0;

  static Device cpu() { return {Type::cpu, 0}; }
  static Device cuda(int i = 0) { return {Type::cuda, i}; }
  bool is_cpu() const { return type == Type::cpu; }
  bool is_cuda() const { return type == Type::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// Whether this build has the CUDA backend, and how many GPUs are visible
// (0 in a build without CUDA or on a machine without a GPU).
bool cuda_built();
int cuda_device_count();
// Waits for all work queued on a CUDA device (nothing for the CPU).
void cuda_synchronize(Device device);

#ifdef FORGE_WITH_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif

}  // namespace forge

// Opens the CUDA branch of an op: `FORGE_IF_CUDA(x) return cuda_op(x);`. In a
// build without CUDA the branch is discarded at compile time (no tensor can be
// on a GPU there), so the CUDA entry points need no definition.
#define FORGE_IF_CUDA(tensor)        \
  if constexpr (::forge::kCudaBuilt) \
    if ((tensor).device().is_cuda())
