// moejit's dtypes as torch scalar types, for every piece of code that meets torch tensors.
#pragma once

#include <c10/core/ScalarType.h>

#include "compiler/moe_config.h"

namespace moejit {

inline at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::BF16: return at::kBFloat16;
    case DType::FP16: return at::kHalf;
    case DType::FP32: return at::kFloat;
  }
  return at::kFloat;
}

}  // namespace moejit
