// Element types. f32/f64 are the CPU compute types (f64 is what gradcheck runs
// in); bf16/f16 are the GPU's low-precision types, and bf16 also the operand
// type of the CPU's bf16 GEMM (ops/blas.h) under autocast; the integer types
// and bool hold indices and masks.
#pragma once

#include <cstddef>
#include <bit>
#include <cstdint>
#include <string>

// The dispatch macros below raise errors with FORGE_FAIL (core/error.h, which
// core/tensor.h includes); this header itself stays free of fmt so that CUDA
// sources (.cu, which nvcc compiles without fmt) can use the dtypes.

namespace forge {

enum class DType : uint8_t { f32, f64, i32, i64, u8, boolean, bf16, f16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "f64", ...
bool is_floating(DType t);

// bf16 and f16 on the host, as their bit patterns: round to nearest even from
// f32 (NaN stays NaN, overflow goes to infinity; f16 keeps subnormals), exact
// widening back to f32. The bf16 pair is inline and branch-free so that the
// conversion loops of Tensor::to vectorise.
inline uint16_t float_to_bf16_bits(float v) {
  const auto u = std::bit_cast<uint32_t>(v);
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);  // a NaN stays quiet
}
inline float bf16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}
uint16_t float_to_f16_bits(float v);
float f16_bits_to_float(uint16_t b);

// The element of a CPU bf16 tensor: its bit pattern, a type of its own so
// that data<BF16>() is checked and a bf16 GEMM has its own overload.
enum class BF16 : uint16_t {};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}
template <>
constexpr DType dtype_of<BF16>() {
  return DType::bf16;
}

}  // namespace forge

// One case of a dispatch switch: binds `alias` to the C++ type T and runs the body.
#define FORGE_DISPATCH_CASE(dt, T, alias, ...) \
  case ::forge::DType::dt: {                   \
    using alias = T;                           \
    return __VA_ARGS__();                      \
  }

// Runs the body with `scalar_t` bound to the C++ type of a floating dtype the
// CPU computes in (f32, f64); any other dtype is an error naming the op.
#define FORGE_DISPATCH_FLOAT(dtype, op_name, ...)                       \
  [&] {                                                                 \
    switch (dtype) {                                                    \
      FORGE_DISPATCH_CASE(f32, float, scalar_t, __VA_ARGS__)            \
      FORGE_DISPATCH_CASE(f64, double, scalar_t, __VA_ARGS__)           \
      default:                                                          \
        FORGE_FAIL("{}: expected a f32 or f64 tensor, got {}", op_name, \
                   ::forge::dtype_name(dtype));                         \
    }                                                                   \
  }()

// Same for the index dtypes (i32, i64).
#define FORGE_DISPATCH_INDEX(dtype, op_name, ...)                              \
  [&] {                                                                        \
    switch (dtype) {                                                           \
      FORGE_DISPATCH_CASE(i32, int32_t, index_t, __VA_ARGS__)                  \
      FORGE_DISPATCH_CASE(i64, int64_t, index_t, __VA_ARGS__)                  \
      default:                                                                 \
        FORGE_FAIL("{}: expected an i32 or i64 index tensor, got {}", op_name, \
                   ::forge::dtype_name(dtype));                                \
    }                                                                          \
  }()

// Every CPU storage type: floats, indices, u8 and bool.
#define FORGE_DISPATCH_ALL(dtype, op_name, ...)                                             \
  [&] {                                                                                     \
    switch (dtype) {                                                                        \
      FORGE_DISPATCH_CASE(f32, float, scalar_t, __VA_ARGS__)                                \
      FORGE_DISPATCH_CASE(f64, double, scalar_t, __VA_ARGS__)                               \
      FORGE_DISPATCH_CASE(i32, int32_t, scalar_t, __VA_ARGS__)                              \
      FORGE_DISPATCH_CASE(i64, int64_t, scalar_t, __VA_ARGS__)                              \
      FORGE_DISPATCH_CASE(u8, uint8_t, scalar_t, __VA_ARGS__)                               \
      FORGE_DISPATCH_CASE(boolean, bool, scalar_t, __VA_ARGS__)                             \
      default:                                                                              \
        FORGE_FAIL("{}: dtype {} has no CPU kernels", op_name, ::forge::dtype_name(dtype)); \
    }                                                                                       \
  }()
