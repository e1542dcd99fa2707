// float8_e4m3fn on the host (1 sign bit, 4 exponent bits biased by 7, 3 mantissa bits; no
// infinities, 0x7f and 0xff are NaN, the largest finite value is 448): the conversions the CPU
// reference, the torch op's CPU kernel and the tests use. They round as the device's
// cvt.rn.satfinite.e4m3x2.f32 (cuda_fp8.h's __NV_SATFINITE) does: to nearest even, magnitudes past
// 448 (infinities too) to +-448, NaN to NaN. Exact: every e4m3 value is a float.
#pragma once

#include <cmath>
#include <cstdint>

namespace moejit::fp8 {

constexpr double kE4m3Max = 448.0;

inline uint8_t encode_e4m3(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7e;  // 448 and above (and inf): saturate
  if (a < 0.015625) {                      // below the smallest normal 2^-6: multiples of 2^-9
    // nearbyint rounds half to even in the default rounding mode; 8 steps is the smallest normal
    // (0x08), which the encoding continues into.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  int exponent = 0;
  const double fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  int e = exponent - 1;                              // a = m * 2^e, m in [1, 2)
  int mantissa = static_cast<int>(std::nearbyint((fraction * 2.0 - 1.0) * 8.0));
  if (mantissa == 8) mantissa = 0, ++e;
  // a < 448 rounds to at most 448 (e 8, mantissa 6): the exponent field stays below 15 or is 15
  // with a mantissa below 7.
  return sign | static_cast<uint8_t>(((e + 7) << 3) | mantissa);
}

inline double decode_e4m3(uint8_t bits) {
  const int e = (bits >> 3) & 15, m = bits & 7;
  double magnitude;
  if (e == 15 && m == 7)
    magnitude = NAN;
  else if (e == 0)
    magnitude = std::ldexp(m, -9);
  else
    magnitude = std::ldexp(8 + m, e - 10);  // (1 + m/8) * 2^(e-7)
  return (bits & 0x80) ? -magnitude : magnitude;
}

// x rounded to the nearest e4m3 value (saturating), as a double.
inline double round_e4m3(double x) { return decode_e4m3(encode_e4m3(x)); }

}  // namespace moejit::fp8
