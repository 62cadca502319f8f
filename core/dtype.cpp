#include "core/dtype.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/names.h"

namespace forge {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::boolean:
      return 1;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
  }
  FORGE_FAIL("unknown dtype code {}", static_cast<int>(t));
}

// The names in the enum's order (core/names.h).
constexpr NameTable<DType, 8> kDTypeNames{
    "dtype", {"f32", "f64", "i32", "i64", "u8", "bool", "bf16", "f16"}};

const char* dtype_name(DType t) {
  return name_of(kDTypeNames, t);
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

uint16_t float_to_f16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below the smallest normal 2^-14: a subnormal multiple of 2^-24, rounded
    // to nearest even by the FPU in the addition (exact for these magnitudes).
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // in units of 2^-24, < 1024
    const float r = std::nearbyint(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t h = abs - (112u << 23);
  h += 0x0FFFu + ((h >> 13) & 1u);
  return static_cast<uint16_t>(sign | (h >> 13));
}

float f16_bits_to_float(uint16_t b) {
  const uint32_t sign = (static_cast<uint32_t>(b) & 0x8000u) << 16;
  const uint32_t exp = (b >> 10) & 0x1Fu, man = b & 0x3FFu;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24.
    const float m = static_cast<float>(man) * (1.0f / 16777216.0f);
    std::memcpy(&u, &m, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

}  // namespace forge
