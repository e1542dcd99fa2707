// common/fp8.h, the host float8_e4m3fn codec of the reference, the torch op's CPU kernel and the
// tests, against values worked out by hand and against a brute-force nearest-value search over
// the 253 finite codes. (tests/gpu/test_harness.cpp also compares it with cuda_fp8.h's conversion.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/fp8.h"

namespace moejit::fp8 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool is_nan_code(uint8_t c) { return (c & 0x7f) == 0x7f; }

// Codes 0x00..0x7e, the finite non-negative values in increasing order.
std::vector<double> positive_values() {
  std::vector<double> v;
  for (int c = 0; c <= 0x7e; ++c) v.push_back(decode_e4m3(static_cast<uint8_t>(c)));
  return v;
}

// The code nearest to x by exhaustive search, ties to the even code (even mantissa), magnitudes
// past 448 saturating: the rule, written without frexp or exponent arithmetic.
uint8_t brute_force_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  static const std::vector<double> values = positive_values();
  if (a >= values.back()) return sign | 0x7e;
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(values[c] - a), db = std::fabs(values[best] - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return sign | static_cast<uint8_t>(best);
}

TEST(Fp8E4m3, DecodesHandWorkedCodes) {
  // (1 + m/8) * 2^(e-7) for exponent field e > 0; m * 2^-9 for e = 0.
  const std::pair<uint8_t, double> cases[] = {
      {0x00, 0.0},        {0x01, 0.001953125},  // 2^-9, the smallest subnormal
      {0x07, 7.0 / 512},  {0x08, 0.015625},     // 2^-6, the smallest normal
      {0x38, 1.0},        {0x39, 1.125},   {0x3f, 1.875},  {0x40, 2.0},   {0x45, 3.25},
      {0x6c, 96.0},       {0x77, 240.0},   {0x78, 256.0},  {0x7d, 416.0}, {0x7e, 448.0},
      {0xb8, -1.0},       {0xaa, -0.3125}, {0xfe, -448.0}, {0x81, -0.001953125}};
  for (const auto& [code, value] : cases) EXPECT_EQ(decode_e4m3(code), value) << std::hex << int(code);
  EXPECT_EQ(decode_e4m3(0x80), 0.0);
  EXPECT_TRUE(std::signbit(decode_e4m3(0x80)));
  EXPECT_TRUE(std::isnan(decode_e4m3(0x7f)));
  EXPECT_TRUE(std::isnan(decode_e4m3(0xff)));
}

TEST(Fp8E4m3, EveryCodeRoundTripsAndTheOrderIsMonotone) {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const double v = decode_e4m3(code);
    if (is_nan_code(code)) {
      ++nan_codes;
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_TRUE(is_nan_code(encode_e4m3(v))) << c;
      continue;
    }
    EXPECT_EQ(encode_e4m3(v), code) << "code 0x" << std::hex << c << " value " << v;
    EXPECT_EQ(round_e4m3(v), v) << c;
    // The sign bit alone negates.
    EXPECT_EQ(decode_e4m3(static_cast<uint8_t>(c ^ 0x80)), -v) << c;
  }
  EXPECT_EQ(nan_codes, 2);
  const std::vector<double> v = positive_values();
  for (size_t c = 1; c < v.size(); ++c) EXPECT_LT(v[c - 1], v[c]) << c;
}

// Exactly between two neighbours: the even code; the nearest float either side: that side's code.
TEST(Fp8E4m3, MidpointsRoundToEvenAndNeighboursToTheNearer) {
  const std::vector<double> v = positive_values();
  for (int c = 0; c + 1 <= 0x7e; ++c) {
    const double mid = (v[c] + v[c + 1]) / 2;  // exact in double
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    EXPECT_EQ(encode_e4m3(mid), even) << "between 0x" << std::hex << c << " and 0x" << c + 1;
    EXPECT_EQ(encode_e4m3(-mid), 0x80 | even) << c;
    EXPECT_EQ(encode_e4m3(std::nextafter(mid, 0.0)), c) << c;
    EXPECT_EQ(encode_e4m3(std::nextafter(mid, kInf)), c + 1) << c;
    // A float just off the midpoint (what the device's fp32 division produces).
    EXPECT_EQ(encode_e4m3(std::nextafter(static_cast<float>(mid), 0.0f)), c) << c;
    EXPECT_EQ(encode_e4m3(std::nextafter(static_cast<float>(mid), 1e9f)), c + 1) << c;
  }
}

TEST(Fp8E4m3, HandWorkedRoundings) {
  // [1, 2): steps of 1/8. 1.0625 is halfway between 1 (m 0) and 1.125 (m 1): even -> 1.
  EXPECT_EQ(encode_e4m3(1.0625), 0x38);
  // 1.1875 halfway between 1.125 (m 1) and 1.25 (m 2): even -> 1.25.
  EXPECT_EQ(encode_e4m3(1.1875), 0x3a);
  // [2, 4): steps of 1/4. pi - 3 = 0.1416 > 0.125: up to 3.25 = 2 * (1 + 5/8), exponent 1 + 7 = 8.
  EXPECT_EQ(encode_e4m3(3.14159265), 0x45);
  // [0.25, 0.5): steps of 1/32. 0.3 = 9.6 steps: 10 steps = 0.3125 = 0.25 * (1 + 2/8), exponent 5.
  EXPECT_EQ(encode_e4m3(-0.3), 0xaa);
  EXPECT_EQ(round_e4m3(-0.3), -0.3125);
  // [64, 128): steps of 8. 100 is halfway between 96 (m 4) and 104 (m 5): even -> 96.
  EXPECT_EQ(encode_e4m3(100.0), 0x6c);
  EXPECT_EQ(round_e4m3(100.0001), 104.0);
  // Subnormals, steps of 2^-9: 0.01 * 512 = 5.12 -> 5.
  EXPECT_EQ(encode_e4m3(0.01), 0x05);
  // 7.5 steps (halfway between the largest subnormal and the smallest normal): even -> 2^-6.
  EXPECT_EQ(encode_e4m3(7.5 / 512), 0x08);
  // 2.5 steps -> 2; 1.5 steps -> 2; half a step -> 0 (even), a little more -> the smallest subnormal.
  EXPECT_EQ(encode_e4m3(2.5 / 512), 0x02);
  EXPECT_EQ(encode_e4m3(1.5 / 512), 0x02);
  EXPECT_EQ(encode_e4m3(0.5 / 512), 0x00);
  EXPECT_EQ(encode_e4m3(std::nextafter(0.5 / 512, 1.0)), 0x01);
  // Underflow keeps the sign.
  EXPECT_EQ(encode_e4m3(-1e-5), 0x80);
  EXPECT_EQ(encode_e4m3(-0.0), 0x80);
  EXPECT_EQ(encode_e4m3(0.0), 0x00);
}

TEST(Fp8E4m3, SaturatesToPlusMinus448AndKeepsNaN) {
  // 432 is halfway between 416 (m 5) and 448 (m 6): even -> 448; just below -> 416.
  EXPECT_EQ(encode_e4m3(432.0), 0x7e);
  EXPECT_EQ(encode_e4m3(std::nextafter(432.0, 0.0)), 0x7d);
  // Past the largest finite value (where an e4m3 with infinities would round up to 480 or inf),
  // satfinite clamps.
  for (double x : {447.9, 448.0, 449.0, 463.9, 464.0, 480.0, 1e6, 3.4e38, 1e300, kInf}) {
    EXPECT_EQ(encode_e4m3(x), 0x7e) << x;
    EXPECT_EQ(encode_e4m3(-x), 0xfe) << x;
    EXPECT_EQ(round_e4m3(-x), -448.0) << x;
  }
  EXPECT_TRUE(is_nan_code(encode_e4m3(kNaN)));
  EXPECT_TRUE(is_nan_code(encode_e4m3(-kNaN)));
  EXPECT_TRUE(std::isnan(round_e4m3(kNaN)));
}

// Random doubles over the whole range (log-uniform magnitudes from 2^-14 to 2^10, both signs) and
// floats near every representable value: the codec agrees with the exhaustive nearest search.
TEST(Fp8E4m3, AgreesWithBruteForceNearestValue) {
  std::mt19937_64 rng(20240519);
  std::uniform_real_distribution<double> exponent(-14.0, 10.0);
  std::vector<double> probes;
  for (int i = 0; i < 200000; ++i) probes.push_back((rng() & 1 ? -1.0 : 1.0) * std::exp2(exponent(rng)));
  for (double v : positive_values())
    for (double f : {std::nextafter(static_cast<float>(v), 0.0f), std::nextafter(static_cast<float>(v), 1e9f)})
      probes.push_back(f);
  int64_t bad = 0;
  for (double x : probes) {
    const uint8_t want = brute_force_encode(x);
    if (encode_e4m3(x) != want && bad++ < 5)
      ADD_FAILURE() << "encode_e4m3(" << x << ") = 0x" << std::hex << int(encode_e4m3(x)) << ", nearest is 0x"
                    << int(want);
    if (round_e4m3(x) != decode_e4m3(want) && bad++ < 5) ADD_FAILURE() << "round_e4m3(" << x << ")";
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace moejit::fp8
