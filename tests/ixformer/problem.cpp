#include "tests/ixformer/problem.h"

#include "backends/torch/dtype.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moejit::ilu_test {
namespace {

std::vector<double> doubles(const at::Tensor& t) {
  at::Tensor d = t.to(at::kCPU).to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

Problem make_problem(const MoeConfig& c, int64_t T, uint64_t seed, bool residual, at::Device device) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto randn = [&](std::vector<int64_t> shape, double scale, DType dtype) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * scale).to(scalar_type(dtype));
  };
  const int64_t E = c.experts, E_loc = c.local_experts(), H = c.hidden, I = c.local_intermediate();
  Problem p;
  p.config = c;
  p.tokens = T;
  at::Tensor hidden = randn({T, H}, 1.0, c.dtype);
  at::Tensor logits = randn({T, E}, 2.0, c.router_dtype);
  at::Tensor w13 = randn({E_loc, c.gemm1_rows(), H}, 1.0 / std::sqrt(double(H)), c.dtype);
  at::Tensor w2 = randn({E_loc, H, I}, 1.0 / std::sqrt(double(I)), c.dtype);
  p.hidden_d = doubles(hidden);
  p.logits_d = doubles(logits);
  p.weights.w13 = doubles(w13);
  p.weights.w2 = doubles(w2);
  p.hidden = hidden.to(device);
  p.logits = logits.to(device);
  p.w13 = w13.to(device);
  p.w2 = w2.to(device);
  if (c.topk_method == TopkMethod::NoauxTc) {
    at::Tensor bias = randn({E}, 0.05, DType::FP32);
    p.bias_d = doubles(bias);
    p.bias = bias.to(device);
  }
  if (residual) {
    at::Tensor r = randn({T, H}, 1.0, c.dtype);
    p.residual_d = doubles(r);
    p.residual = r.to(device);
  }
  return p;
}

reference::Layer reference_layer(const Problem& p) {
  return reference::layer(p.config, p.tokens, p.hidden_d, p.logits_d, p.bias_d, p.weights, p.residual_d);
}

MoeConfig small_preset(const std::string& name, DType dtype, int64_t hidden, int64_t intermediate) {
  MoeConfig c = preset(name);
  c.hidden = hidden;
  c.moe_intermediate = intermediate;
  c.dtype = dtype;
  c.router_dtype = dtype;
  validate(c);
  return c;
}

std::vector<at::Device> test_devices() {
  std::vector<at::Device> devices{at::Device(at::kCPU)};
  if (torch::cuda::is_available()) devices.emplace_back(at::kCUDA, 0);
  return devices;
}

double tolerance(const MoeConfig& c) { return c.dtype == DType::FP32 ? 1e-5 : 2e-2; }

Comparison compare(const Problem& p, const reference::Layer& ref, const at::Tensor& ids_got, const at::Tensor& out_got) {
  Comparison cmp;
  const int64_t T = p.tokens, K = p.config.topk, H = p.config.hidden;
  if (ids_got.sizes() != at::IntArrayRef({T, K}) || out_got.sizes() != at::IntArrayRef({T, H})) {
    cmp.failure = fmt::format("shapes: ids {} (want [{}, {}]), out {} (want [{}, {}])", fmt::join(ids_got.sizes(), ","),
                              T, K, fmt::join(out_got.sizes(), ","), T, H);
    return cmp;
  }
  at::Tensor ids = ids_got.to(at::kCPU).to(at::kInt).contiguous();
  std::vector<double> out = doubles(out_got);
  std::vector<double> want, got;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t j = 0; j < K; ++j) same = same && ids[t][j].item<int>() == ref.routing.ids[t * K + j];
    if (!same) {
      if (ref.routing.near_tie[t]) {
        ++cmp.near_tie_skipped;
        continue;
      }
      cmp.failure = fmt::format("token {}: routing ids differ from the reference and no near tie explains it", t);
      return cmp;
    }
    ++cmp.compared;
    want.insert(want.end(), ref.experts.out.begin() + t * H, ref.experts.out.begin() + (t + 1) * H);
    got.insert(got.end(), out.begin() + t * H, out.begin() + (t + 1) * H);
  }
  cmp.error = reference::relative_error(want, got);
  if (!(cmp.error <= tolerance(p.config)))
    cmp.failure = fmt::format("relative error {:.3g} > tolerance {:.0e}", cmp.error, tolerance(p.config));
  return cmp;
}

}  // namespace moejit::ilu_test
