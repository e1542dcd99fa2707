#include "checkpoint/float_convert.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace moejit::checkpoint {
namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent == 0) {
    float f = static_cast<float>(mantissa) * 0x1p-24f;  // subnormal (or zero)
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

int element_bytes(std::string_view dtype) { return dtype == "F32" ? 4 : 2; }

void check_dtype(std::string_view dtype) {
  if (!is_float_dtype(dtype))
    throw InvalidInput(fmt::format("dtype {}: not a floating-point dtype moejit converts; allowed: BF16, F16, F32", dtype));
}

}  // namespace

bool is_float_dtype(std::string_view dtype) { return dtype == "BF16" || dtype == "F16" || dtype == "F32"; }

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "BF16";
    case DType::FP16: return "F16";
    case DType::FP32: return "F32";
  }
  return "?";
}

float to_float(const unsigned char* p, std::string_view dtype) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == "BF16") {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return half_to_float(h);  // F16
}

uint16_t float_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  // A NaN's low mantissa bits could all be dropped, leaving infinity: set the quiet bit instead.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff, plus 1 when the kept part is odd, carries into bit 16 exactly when the dropped
  // half is above one half, or equal to it with an odd kept part: ties to even. A carry out of the
  // mantissa raises the exponent, up to infinity, as it should.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t float_to_half(float f) {
  uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to infinity (65504's mantissa is odd)
  if (x < 0x38800000u) {                        // below 2^-14: a half subnormal, or zero
    const int e = static_cast<int>(x >> 23);
    const int shift = 126 - e;    // the value in units of 2^-24 is the significand >> shift
    if (shift > 24) return sign;  // below 2^-25 (float subnormals too): rounds to zero
    const uint32_t significand = (x & 0x7fffffu) | 0x800000u;
    uint32_t q = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // a carry into the smallest normal is right
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (((x >> 23) - 112u) << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

std::vector<unsigned char> convert_floats(const unsigned char* src, std::string_view from, int64_t count,
                                          std::string_view to) {
  check_dtype(from);
  check_dtype(to);
  const size_t in_bytes = static_cast<size_t>(element_bytes(from)), out_bytes = static_cast<size_t>(element_bytes(to));
  std::vector<unsigned char> out(static_cast<size_t>(count) * out_bytes);
  if (from == to) {
    std::memcpy(out.data(), src, out.size());
    return out;
  }
  for (int64_t i = 0; i < count; ++i) {
    const float f = to_float(src + static_cast<size_t>(i) * in_bytes, from);
    unsigned char* dst = out.data() + static_cast<size_t>(i) * out_bytes;
    if (to == "F32") {
      std::memcpy(dst, &f, 4);
    } else {
      const uint16_t h = to == "BF16" ? float_to_bf16(f) : float_to_half(f);
      std::memcpy(dst, &h, 2);
    }
  }
  return out;
}

}  // namespace moejit::checkpoint
