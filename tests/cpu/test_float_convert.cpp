// checkpoint/float_convert: a checkpoint's BF16 / F16 / F32 elements converted as torch's
// Tensor.to converts them. Every bf16 and every half value survives the round trip through float;
// random floats round to the nearest representable neighbour, ties to the even one; the edges
// (ties, overflow to infinity, half subnormals, NaN, signed zero) by their bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/float_convert.h"
#include "common/error.h"

namespace moejit::checkpoint {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float bf16_value(uint16_t b) { return to_float(reinterpret_cast<const unsigned char*>(&b), "BF16"); }
float half_value(uint16_t h) { return to_float(reinterpret_cast<const unsigned char*>(&h), "F16"); }

TEST(FloatConvert, EveryBf16AndHalfValueRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    if (std::isnan(bf16_value(b))) {
      EXPECT_TRUE(std::isnan(bf16_value(float_to_bf16(bf16_value(b))))) << bits;
    } else {
      ASSERT_EQ(float_to_bf16(bf16_value(b)), b) << std::hex << bits;
    }
    if (std::isnan(half_value(b))) {
      EXPECT_TRUE(std::isnan(half_value(float_to_half(half_value(b))))) << bits;
    } else {
      ASSERT_EQ(float_to_half(half_value(b)), b) << std::hex << bits;
    }
  }
}

// `bits` is the nearest value of the format to f among its neighbours (bits +- 1 of the same sign),
// and of two equally near ones the even.
template <typename Decode>
void expect_nearest_even(float f, uint16_t bits, uint16_t max_finite, Decode decode) {
  const double x = f, got = decode(bits);
  for (int step : {-1, 1}) {
    const int other = (bits & 0x7fff) + step;
    if (other < 0 || other > max_finite) continue;
    const double neighbour = decode(static_cast<uint16_t>((bits & 0x8000) | other));
    const double d_got = std::fabs(got - x), d_other = std::fabs(neighbour - x);
    ASSERT_LE(d_got, d_other) << f << " -> 0x" << std::hex << bits;
    if (d_got == d_other) ASSERT_EQ(bits & 1, 0) << "tie not to even: " << f;
  }
}

TEST(FloatConvert, RandomFloatsRoundToTheNearestEven) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    // Random bits over the whole float range, and values in [-0.5, 0.5) with all 24 bits set at
    // random (half's subnormals among them).
    const float f = i % 2 ? from_bits(any_bits(rng)) : std::ldexp(static_cast<float>(any_bits(rng) >> 8), -24) - 0.5f;
    if (!std::isfinite(f)) continue;
    if (std::fabs(f) < 3.38e38f) expect_nearest_even(f, float_to_bf16(f), 0x7f7f, bf16_value);
    if (std::fabs(f) < 65504.0f) expect_nearest_even(f, float_to_half(f), 0x7bff, half_value);
  }
}

TEST(FloatConvert, EdgesByTheirBits) {
  // bf16: ties between 1 and the next value go to the even one; above a tie goes up.
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)), 0x3f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)), 0x3f82);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00000001)), 0x0000);  // the smallest float subnormal
  EXPECT_TRUE(std::isnan(bf16_value(float_to_bf16(from_bits(0x7f800001)))));  // a NaN whose set bits are all dropped
  // half: the largest finite, the overflow threshold, subnormals and their ties.
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);         // a tie between 0 and 2^-24: even
  EXPECT_EQ(float_to_half(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_half(0x1.8p-24f), 0x0002);       // a tie between 1 and 2 units: even
  EXPECT_EQ(float_to_half(0x1.ffffp-15f), 0x0400);    // a subnormal that rounds into the smallest normal
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);  // a tie: even
  EXPECT_EQ(float_to_half(1.0f + 0x1.8p-10f), 0x3c02);
  EXPECT_EQ(float_to_half(std::nanf("")) & 0x7fff, 0x7e00);
}

TEST(FloatConvert, ArraysConvertOnceOrCopy) {
  const std::vector<float> f = {1.0f, from_bits(0x3f818000), -2.5f, 70000.0f};
  const auto* src = reinterpret_cast<const unsigned char*>(f.data());
  const std::vector<unsigned char> bf16 = convert_floats(src, "F32", 4, "BF16");
  ASSERT_EQ(bf16.size(), 8u);
  std::vector<uint16_t> b(4);
  std::memcpy(b.data(), bf16.data(), 8);
  EXPECT_EQ(b, (std::vector<uint16_t>{0x3f80, 0x3f82, 0xc020, float_to_bf16(70000.0f)}));
  // Widening is exact, and a second narrowing to the same format changes nothing.
  const std::vector<unsigned char> back = convert_floats(bf16.data(), "BF16", 4, "F32");
  EXPECT_EQ(convert_floats(back.data(), "F32", 4, "BF16"), bf16);
  // bf16 -> half goes through the exact float: 70000 is past half's range.
  const std::vector<unsigned char> half = convert_floats(bf16.data(), "BF16", 4, "F16");
  std::vector<uint16_t> h(4);
  std::memcpy(h.data(), half.data(), 8);
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3c00, float_to_half(bf16_value(0x3f82)), 0xc100, 0x7c00}));
  EXPECT_EQ(convert_floats(src, "F32", 4, "F32"), std::vector<unsigned char>(src, src + 16));
  try {
    convert_floats(src, "F8_E4M3", 4, "BF16");
    ADD_FAILURE() << "no InvalidInput for F8_E4M3";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("dtype F8_E4M3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moejit::checkpoint
