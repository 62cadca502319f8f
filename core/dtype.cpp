#include "core/dtype.h"

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

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::boolean:
      return "bool";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
  }
  return "unknown";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

}  // namespace forge
