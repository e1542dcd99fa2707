// Inputs of one layer call as torch tensors (for the ILU adapter) and as doubles (for the float64
// reference), drawn from a seed; and the comparison of the adapter's result with the reference
// under SPEC.md's tolerance rule.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/moe_config.h"
#include "tests/reference/reference.h"

namespace moejit::ilu_test {

struct Problem {
  MoeConfig config;
  int64_t tokens = 0;
  at::Tensor hidden, logits, w13, w2;
  std::optional<at::Tensor> bias, residual;
  // The same values, widened to double for the reference.
  std::vector<double> hidden_d, logits_d, bias_d, residual_d;
  reference::Weights weights;
};

// Random inputs on `device`, rounded to the config's dtypes before the reference sees them.
Problem make_problem(const MoeConfig& config, int64_t tokens, uint64_t seed, bool residual,
                     at::Device device = at::Device(at::kCPU));

reference::Layer reference_layer(const Problem& p);

// A SPEC.md preset with H and I shrunk (E, K, groups, scoring, scale kept) in `dtype`.
MoeConfig small_preset(const std::string& name, DType dtype, int64_t hidden = 128, int64_t intermediate = 64);

// The devices the tests run on: the CPU, and the first CUDA device when there is one.
std::vector<at::Device> test_devices();

struct Comparison {
  double error = 0;            // relative Frobenius error over the compared tokens
  int64_t compared = 0;        // tokens compared
  int64_t near_tie_skipped = 0;
  std::string failure;         // empty when routing and output agree within tolerance
};
// ids_got [T, K] int32: the routing the adapter used; out_got [T, H]. Tokens whose ids differ from
// the reference are allowed only where the reference marks a near tie; they are left out of the
// output error (SPEC.md: ids exact except near ties).
Comparison compare(const Problem& p, const reference::Layer& ref, const at::Tensor& ids_got, const at::Tensor& out_got);

// SPEC.md's layer tolerance for the config's dtype.
double tolerance(const MoeConfig& config);

}  // namespace moejit::ilu_test
