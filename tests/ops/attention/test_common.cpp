// The argument checks every attention op shares.
#include <gtest/gtest.h>

#include "ops/attention/common.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using ops::attention::check_qkv;
using testing::error_of;

TEST(AttentionCommon, AcceptsCrossAttentionShapes) {
  Tensor q = Tensor::zeros({2, 3, 5, 4}), k = Tensor::zeros({2, 3, 7, 4}),
         v = Tensor::zeros({2, 3, 7, 6});
  auto s = check_qkv("test", q, k, v, testing::padding_mask(2, 7, {0, 2}), false);
  EXPECT_EQ(s.B, 2);
  EXPECT_EQ(s.H, 3);
  EXPECT_EQ(s.N, 5);
  EXPECT_EQ(s.M, 7);
  EXPECT_EQ(s.d, 4);
  EXPECT_EQ(s.dv, 6);
}

TEST(AttentionCommon, ErrorsNameTheArgumentAndShapes) {
  Tensor q = Tensor::zeros({2, 3, 5, 4}), k = Tensor::zeros({2, 3, 7, 4}),
         v = Tensor::zeros({2, 3, 7, 6});
  EXPECT_NE(error_of([&] { check_qkv("x", q, k, v, Tensor(), true); }).find("N = 5, M = 7"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", q, Tensor::zeros({2, 3, 7, 5}), v, Tensor(), false);
            }).find("k [2, 3, 7, 5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", q, k, Tensor::zeros({2, 3, 6, 6}), Tensor(), false);
            }).find("v"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", q, k, v, Tensor::ones({2, 5}, DType::boolean), false);
            }).find("key_padding_mask must be [B, M] = [2, 7]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", q, k, v, Tensor::ones({2, 7}), false);
            }).find("bool or u8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", q.to(DType::f64), k, v, Tensor(), false);
            }).find("k is f32 but q is f64"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_qkv("x", Tensor::zeros({5, 4}), k, v, Tensor(), false);
            }).find("q must be"),
            std::string::npos);
}

}  // namespace
}  // namespace forge
