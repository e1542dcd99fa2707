// TEST DOUBLE, NOT IXFORMER.
//
// A CPU stand-in for the six ixformer functions the ILU backend calls (backends/ixformer/ixformer_api.h),
// linked into the contract tests in place of libixformer.so so that the adapter's plumbing can be
// checked where there is no Iluvatar device. It computes with moejit's float64 reference
// (tests/reference) and SPEC.md's reading of each argument, and it is strict: every argument's
// dtype, shape, device and *meaning* is checked (e.g. dst_to_src must be the dst_src that
// moe_compute_token_index_api produced, tokens_per_experts must be a host tensor), and a violation
// throws ContractViolation naming the function and the argument. Every call is recorded so tests
// can assert the order and the arguments.
//
// It says nothing about ixformer's speed, its rounding, or its behaviour on inputs moejit never
// passes (expert ranges, masks, bias, formats other than TN); those are rejected as "not modeled".
// Tensors may live on the CPU or on a CUDA device; the double computes on the CPU either way.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ixformer_double {

// The adapter broke the API contract as SPEC.md states it.
struct ContractViolation : std::logic_error {
  using std::logic_error::logic_error;
};

struct Call {
  std::string function;                       // e.g. "moe_expand_input"
  std::map<std::string, std::string> args;    // every argument: scalars as text, tensors as
                                              // "BFloat16[17,64]@cpu", absent optionals as "none"
  std::map<std::string, at::Tensor> tensors;  // CPU copies of every tensor argument after the call
};

// The calls since the last reset(), in order.
const std::vector<Call>& calls();
std::vector<std::string> call_names();

// Forgets the calls and the index state; strict checks on.
void reset();

// Off: the meaning checks (index tensors, counts) are skipped and the double just computes, so a
// test can show that a wrong adapter also gives wrong numbers. Shape/dtype checks stay on.
void set_strict(bool strict);

}  // namespace ixformer_double
