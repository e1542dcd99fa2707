// Conversions between the floating-point dtypes a checkpoint stores and a layer takes (safetensors
// names "BF16", "F16", "F32"), on the host, as torch's `Tensor.to` computes them: widening is
// exact; narrowing rounds once, to nearest even (from a float: bf16 and fp16 are each one rounding
// of the exact value, never a double rounding through another format), fp16 overflows to
// infinity past 65504, and NaN stays NaN (quiet, its sign kept; torch makes every bf16 NaN 0x7fc0).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit::checkpoint {

// Whether `dtype` is one of "BF16", "F16", "F32".
bool is_float_dtype(std::string_view dtype);

// The safetensors name of a layer dtype: "BF16", "F16" or "F32".
const char* safetensors_dtype(DType dtype);

// The element at `p` (of dtype BF16, F16 or F32) as a float: exact.
float to_float(const unsigned char* p, std::string_view dtype);

// `f` rounded to nearest even as bf16 bits / IEEE half bits.
uint16_t float_to_bf16(float f);
uint16_t float_to_half(float f);

// `count` elements of dtype `from` at `src` as dtype `to` (both BF16, F16 or F32): a copy when they
// are the same, else each element widened to float (exact) and rounded once to `to`. Throws
// InvalidInput naming a dtype that is not one of the three.
std::vector<unsigned char> convert_floats(const unsigned char* src, std::string_view from, int64_t count,
                                          std::string_view to);

}  // namespace moejit::checkpoint
