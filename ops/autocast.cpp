#include "ops/autocast.h"

namespace forge::ops {

namespace {
thread_local DType current = DType::f32;
}  // namespace

DType autocast_dtype() {
  return current;
}

bool autocasts(const Tensor& t) {
  return current != DType::f32 && t.defined() && t.dtype() == DType::f32 &&
         (t.device().is_cuda() || current == DType::bf16);
}

AutocastGuard::AutocastGuard(DType dtype) : previous_(current) {
  FORGE_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32,
              "AutocastGuard: expected bf16, f16 or f32 (off), got {}", dtype_name(dtype));
  current = dtype;
}

AutocastGuard::~AutocastGuard() {
  current = previous_;
}

}  // namespace forge::ops
