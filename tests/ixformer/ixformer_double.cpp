// TEST DOUBLE, NOT IXFORMER: see ixformer_double.h. Definitions of the ixformer::infer functions
// declared in backends/ixformer/ixformer_api.h, computed on the CPU with the float64 reference.
#include "tests/ixformer/ixformer_double.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "backends/ixformer/ixformer_api.h"
#include "compiler/moe_config.h"
#include "tests/reference/reference.h"

namespace ixformer_double {
namespace {

struct State {
  std::vector<Call> calls;
  bool strict = true;
  // What the last moe_compute_token_index_api produced (CPU copies), for the meaning checks.
  bool have_index = false;
  int64_t num_experts = 0;
  at::Tensor flat_ids, src_dst, dst_src, counts;
};

State& state() {
  static State s;
  return s;
}

[[noreturn]] void violation(const std::string& function, const std::string& what) {
  throw ContractViolation(fmt::format("ixformer test double: {}: {}", function, what));
}

std::string describe(const at::Tensor& t) {
  return fmt::format("{}[{}]@{}", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ","), t.device().str());
}

// Records one call; tensors are copied to the CPU after the function ran.
class Recorder {
 public:
  explicit Recorder(const char* function) { call_.function = function; }
  void tensor(const char* name, const at::Tensor& t) {
    call_.args[name] = describe(t);
    tensors_.emplace_back(name, t);
  }
  void optional(const char* name, const std::optional<at::Tensor>& t) {
    if (t.has_value())
      tensor(name, *t);
    else
      call_.args[name] = "none";
  }
  template <typename V>
  void scalar(const char* name, const V& v) {
    call_.args[name] = fmt::format("{}", v);
  }
  void commit() {
    for (auto& [name, t] : tensors_) call_.tensors[name] = t.detach().to(at::kCPU).clone();
    state().calls.push_back(std::move(call_));
  }

 private:
  Call call_;
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

void require(bool ok, const char* function, const std::string& what) {
  if (!ok) violation(function, what);
}

void require_tensor(const char* function, const char* name, const at::Tensor& t, at::ScalarType dtype,
                    std::vector<int64_t> shape, const at::Device& device) {
  require(t.defined(), function, fmt::format("{} is undefined", name));
  require(t.scalar_type() == dtype, function,
          fmt::format("{} must be {}, got {}", name, c10::toString(dtype), c10::toString(t.scalar_type())));
  require(t.sizes() == at::IntArrayRef(shape), function,
          fmt::format("{} must have shape [{}], got {}", name, fmt::join(shape, ", "), describe(t)));
  require(t.device() == device, function,
          fmt::format("{} must be on {}, got {}", name, device.str(), t.device().str()));
  require(t.is_contiguous(), function, fmt::format("{} must be contiguous", name));
}

bool half_type(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

std::vector<double> to_doubles(const at::Tensor& t) {
  at::Tensor d = t.detach().to(at::kCPU).to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

std::vector<int> to_ints(const at::Tensor& t) {
  at::Tensor d = t.detach().to(at::kCPU).to(at::kInt).contiguous();
  return std::vector<int>(d.data_ptr<int>(), d.data_ptr<int>() + d.numel());
}

at::Tensor ints_tensor(const std::vector<int>& v) {
  return at::tensor(std::vector<int32_t>(v.begin(), v.end()), at::TensorOptions().dtype(at::kInt));
}

// Writes `value` (a CPU tensor) into `out`, wherever `out` lives, in out's dtype.
void store(at::Tensor& out, const at::Tensor& value) { out.copy_(value.to(out.scalar_type()).view(out.sizes())); }

// The meaning checks for an index tensor passed under the name `name`, which must hold what
// moe_compute_token_index_api returned as `want` ("dst_src" or "src_dst").
void require_index(const char* function, const char* name, const at::Tensor& got, const char* want) {
  State& s = state();
  if (!s.strict) return;
  require(s.have_index, function, fmt::format("{} given before any moe_compute_token_index_api call", name));
  const at::Tensor& expected = std::string(want) == "dst_src" ? s.dst_src : s.src_dst;
  const at::Tensor& other = std::string(want) == "dst_src" ? s.src_dst : s.dst_src;
  at::Tensor g = got.detach().to(at::kCPU);
  if (g.numel() == expected.numel() && at::equal(g, expected)) return;
  if (g.numel() == other.numel() && at::equal(g, other))
    violation(function, fmt::format("{} got the {} tensor of moe_compute_token_index_api; {} takes {} ({}). The names "
                                    "are swapped",
                                    name, std::string(want) == "dst_src" ? "src_dst (pair_pos)" : "dst_src (sorted_pair)",
                                    name, want, std::string(want) == "dst_src" ? "sorted_pair" : "pair_pos"));
  violation(function, fmt::format("{} is not the {} of the last moe_compute_token_index_api call", name, want));
}

}  // namespace

const std::vector<Call>& calls() { return state().calls; }

std::vector<std::string> call_names() {
  std::vector<std::string> names;
  for (const auto& c : state().calls) names.push_back(c.function);
  return names;
}

void reset() { state() = State{}; }

void set_strict(bool strict) { state().strict = strict; }

}  // namespace ixformer_double

// ---------------------------------------------------------------------------------------------
// The ixformer functions, TEST DOUBLE versions.
namespace ixformer::infer {

using ixformer_double::describe;
using ixformer_double::require;
using ixformer_double::require_tensor;
using ixformer_double::Recorder;
using ixformer_double::state;

void topk_softmax(torch::Tensor& topk_weights, torch::Tensor& topk_indices, torch::Tensor& token_expert_indices,
                  torch::Tensor& gating_output, bool renormalize) {
  const char* fn = "topk_softmax";
  Recorder rec(fn);
  rec.tensor("topk_weights", topk_weights);
  rec.tensor("topk_indices", topk_indices);
  rec.tensor("token_expert_indices", token_expert_indices);
  rec.tensor("gating_output", gating_output);
  rec.scalar("renormalize", renormalize);
  require(gating_output.dim() == 2, fn, "gating_output must be [T, E]");
  const int64_t T = gating_output.size(0), E = gating_output.size(1);
  require(topk_weights.dim() == 2, fn, "topk_weights must be [T, K]");
  const int64_t K = topk_weights.size(1);
  const at::Device dev = gating_output.device();
  require_tensor(fn, "gating_output", gating_output, at::kFloat, {T, E}, dev);  // fp32 only
  require_tensor(fn, "topk_weights", topk_weights, at::kFloat, {T, K}, dev);
  require_tensor(fn, "topk_indices", topk_indices, at::kInt, {T, K}, dev);
  require_tensor(fn, "token_expert_indices", token_expert_indices, at::kInt, {T, K}, dev);
  require(K >= 1 && K <= E, fn, fmt::format("K = {} must be in 1..E = {}", K, E));
  // ixformer's handling of NaN/inf is not specified: moejit maps them (SPEC.md) before the call.
  require(at::isfinite(gating_output).all().item<bool>(), fn,
          "gating_output holds NaN or inf; map them as SPEC.md says before calling");

  moejit::MoeConfig c;
  c.experts = static_cast<int>(E);
  c.topk = static_cast<int>(K);
  c.scoring = moejit::Scoring::Softmax;
  c.topk_method = moejit::TopkMethod::Greedy;
  c.renormalize = renormalize;
  c.routed_scaling_factor = 1.0;
  auto r = moejit::reference::route(c, T, ixformer_double::to_doubles(gating_output), {});
  ixformer_double::store(topk_weights, at::tensor(r.weights, at::kDouble));
  ixformer_double::store(topk_indices, ixformer_double::ints_tensor(r.ids));
  // vLLM's meaning: the source row of pair (t, j) in a [K, T] layout.
  at::Tensor tei = at::arange(K, at::kInt).unsqueeze(0) * static_cast<int>(T) + at::arange(T, at::kInt).unsqueeze(1);
  ixformer_double::store(token_expert_indices, tei);
  rec.commit();
}

void moe_compute_token_index_api(torch::Tensor& topk_ids, torch::Tensor& src_dst, torch::Tensor& dst_src,
                                 torch::Tensor& expert_sizes_gpu, const std::optional<torch::Tensor>& expert_mask,
                                 const std::optional<torch::Tensor>& expert_sizes_cpu,
                                 const std::optional<torch::Tensor>& expand_tokens_gpu, int64_t start_expert_id,
                                 int64_t end_expert_id, int64_t num_experts) {
  const char* fn = "moe_compute_token_index_api";
  Recorder rec(fn);
  rec.tensor("topk_ids", topk_ids);
  rec.tensor("src_dst", src_dst);
  rec.tensor("dst_src", dst_src);
  rec.tensor("expert_sizes_gpu", expert_sizes_gpu);
  rec.optional("expert_mask", expert_mask);
  rec.optional("expert_sizes_cpu", expert_sizes_cpu);
  rec.optional("expand_tokens_gpu", expand_tokens_gpu);
  rec.scalar("start_expert_id", start_expert_id);
  rec.scalar("end_expert_id", end_expert_id);
  rec.scalar("num_experts", num_experts);
  const at::Device dev = topk_ids.device();
  const int64_t M = topk_ids.numel();
  require(topk_ids.scalar_type() == at::kInt && topk_ids.is_contiguous(), fn, "topk_ids must be contiguous int32");
  require_tensor(fn, "src_dst", src_dst, at::kInt, {M}, dev);
  require_tensor(fn, "dst_src", dst_src, at::kInt, {M}, dev);
  require_tensor(fn, "expert_sizes_gpu", expert_sizes_gpu, at::kInt, {num_experts}, dev);
  require(!expert_mask && !expand_tokens_gpu, fn, "expert_mask and expand_tokens_gpu are not modeled by the double");
  if (expert_sizes_cpu)
    require_tensor(fn, "expert_sizes_cpu", *expert_sizes_cpu, at::kInt, {num_experts}, at::Device(at::kCPU));
  require(start_expert_id == 0 && end_expert_id == num_experts, fn,
          fmt::format("expert range [{}, {}] of {}: only the full range (0, num_experts, num_experts) is modeled "
                      "(whether end_expert_id is inclusive is not specified)",
                      start_expert_id, end_expert_id, num_experts));
  std::vector<int> ids = ixformer_double::to_ints(topk_ids);
  for (int64_t f = 0; f < M; ++f)
    require(ids[f] >= 0 && ids[f] < num_experts, fn,
            fmt::format("topk_ids[{}] = {} is outside [0, {})", f, ids[f], num_experts));

  moejit::MoeConfig c;
  c.experts = static_cast<int>(num_experts);
  c.topk = 1;  // the index is over flat pairs; K does not enter it
  auto ix = moejit::reference::index(c, M, ids);
  ixformer_double::store(src_dst, ixformer_double::ints_tensor(ix.pair_pos));     // src_dst = pair_pos
  ixformer_double::store(dst_src, ixformer_double::ints_tensor(ix.sorted_pair));  // dst_src = sorted_pair
  ixformer_double::store(expert_sizes_gpu, ixformer_double::ints_tensor(ix.counts));
  if (expert_sizes_cpu) {
    at::Tensor host = *expert_sizes_cpu;
    ixformer_double::store(host, ixformer_double::ints_tensor(ix.counts));
  }
  auto& s = state();
  s.have_index = true;
  s.num_experts = num_experts;
  s.flat_ids = ixformer_double::ints_tensor(ids);
  s.src_dst = ixformer_double::ints_tensor(ix.pair_pos);
  s.dst_src = ixformer_double::ints_tensor(ix.sorted_pair);
  s.counts = ixformer_double::ints_tensor(ix.counts);
  rec.commit();
}

void moe_expand_input(torch::Tensor outputs, torch::Tensor inputs, torch::Tensor dst_to_src,
                      const std::optional<torch::Tensor>& src_to_dst, int64_t dst_tokens, int64_t expand_factor) {
  const char* fn = "moe_expand_input";
  Recorder rec(fn);
  rec.tensor("outputs", outputs);
  rec.tensor("inputs", inputs);
  rec.tensor("dst_to_src", dst_to_src);
  rec.optional("src_to_dst", src_to_dst);
  rec.scalar("dst_tokens", dst_tokens);
  rec.scalar("expand_factor", expand_factor);
  require(inputs.dim() == 2, fn, "inputs must be [T, H]");
  const int64_t T = inputs.size(0), H = inputs.size(1);
  const at::Device dev = inputs.device();
  require(expand_factor >= 1 && dst_tokens == T * expand_factor, fn,
          fmt::format("dst_tokens {} must be tokens {} x expand_factor {}", dst_tokens, T, expand_factor));
  require_tensor(fn, "inputs", inputs, inputs.scalar_type(), {T, H}, dev);
  require_tensor(fn, "outputs", outputs, inputs.scalar_type(), {dst_tokens, H}, dev);
  require_tensor(fn, "dst_to_src", dst_to_src, at::kInt, {dst_tokens}, dev);
  ixformer_double::require_index(fn, "dst_to_src", dst_to_src, "dst_src");
  if (src_to_dst) {
    require_tensor(fn, "src_to_dst", *src_to_dst, at::kInt, {dst_tokens}, dev);
    ixformer_double::require_index(fn, "src_to_dst", *src_to_dst, "src_dst");
  }
  at::Tensor d2s = dst_to_src.to(at::kCPU).to(at::kLong);
  require(d2s.numel() == 0 || (d2s.min().item<int64_t>() >= 0 && d2s.max().item<int64_t>() < dst_tokens), fn,
          "dst_to_src holds values outside [0, dst_tokens)");
  ixformer_double::store(outputs, inputs.to(at::kCPU).index_select(0, at::floor_divide(d2s, expand_factor)));
  rec.commit();
}

void moe_w16a16_group_gemm(torch::Tensor output, torch::Tensor inputs, torch::Tensor weights,
                           torch::Tensor tokens_per_experts, const std::optional<torch::Tensor>& dst_to_src,
                           const std::optional<torch::Tensor>& bias, std::string format, int64_t persistent,
                           int64_t output_n) {
  const char* fn = "moe_w16a16_group_gemm";
  Recorder rec(fn);
  rec.tensor("output", output);
  rec.tensor("inputs", inputs);
  rec.tensor("weights", weights);
  rec.tensor("tokens_per_experts", tokens_per_experts);
  rec.optional("dst_to_src", dst_to_src);
  rec.optional("bias", bias);
  rec.scalar("format", format);
  rec.scalar("persistent", persistent);
  rec.scalar("output_n", output_n);
  require(format == "TN", fn, fmt::format("format '{}' is not modeled; TN (weights [E, N, K]) is", format));
  require(!bias, fn, "bias is not modeled by the double");
  require(persistent >= 0, fn, "persistent must be >= 0");
  require(inputs.dim() == 2 && weights.dim() == 3, fn, "inputs must be [M, K] and weights [E, N, K]");
  const int64_t rows = inputs.size(0), Kd = inputs.size(1), E = weights.size(0), N = weights.size(1);
  const at::Device dev = inputs.device();
  require(ixformer_double::half_type(inputs.scalar_type()), fn, fmt::format("w16a16: inputs must be bf16 or fp16, got {}",
                                                            c10::toString(inputs.scalar_type())));
  require_tensor(fn, "inputs", inputs, inputs.scalar_type(), {rows, Kd}, dev);
  require_tensor(fn, "weights", weights, inputs.scalar_type(), {E, N, Kd}, dev);
  require_tensor(fn, "output", output, inputs.scalar_type(), {output_n, N}, dev);
  // The trap: the counts are read on the host.
  require(tokens_per_experts.device().is_cpu(), fn,
          fmt::format("tokens_per_experts must be a host (CPU) tensor, got one on {}", tokens_per_experts.device().str()));
  require_tensor(fn, "tokens_per_experts", tokens_per_experts, at::kInt, {E}, at::Device(at::kCPU));
  require(output_n == rows, fn, fmt::format("output_n {} must be the number of rows {}", output_n, rows));
  at::Tensor counts = tokens_per_experts.to(at::kLong);
  require(counts.min().item<int64_t>() >= 0 && counts.sum().item<int64_t>() == rows, fn,
          fmt::format("tokens_per_experts must be >= 0 and sum to the rows of inputs ({}), sum is {}", rows,
                      counts.sum().item<int64_t>()));
  auto& s = state();
  if (s.strict) {
    require(s.have_index && s.num_experts == E && at::equal(tokens_per_experts.to(at::kInt), s.counts), fn,
            "tokens_per_experts must be the expert_sizes of the last moe_compute_token_index_api call");
  }
  at::Tensor dest;  // row r of the result goes to output row dest[r]
  if (dst_to_src) {
    require_tensor(fn, "dst_to_src", *dst_to_src, at::kInt, {rows}, dev);
    ixformer_double::require_index(fn, "dst_to_src", *dst_to_src, "dst_src");
    dest = dst_to_src->to(at::kCPU).to(at::kLong);
    require(at::equal(std::get<0>(at::sort(dest)), at::arange(rows, dest.options())), fn,
            "dst_to_src must be a permutation of [0, output_n)");
  } else {
    dest = at::arange(rows, at::kLong);
  }
  at::Tensor x = inputs.to(at::kCPU).to(at::kDouble);
  at::Tensor w = weights.to(at::kCPU).to(at::kDouble);
  at::Tensor result = at::zeros({output_n, N}, at::kDouble);
  int64_t begin = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n > 0) {
      at::Tensor y = at::matmul(x.narrow(0, begin, n), w[e].t());
      result.index_copy_(0, dest.narrow(0, begin, n), y);
    }
    begin += n;
  }
  ixformer_double::store(output, result);
  rec.commit();
}

void silu_and_mul(torch::Tensor& input, torch::Tensor& output) {
  const char* fn = "silu_and_mul";
  Recorder rec(fn);
  rec.tensor("input", input);
  rec.tensor("output", output);
  require(input.dim() == 2 && output.dim() == 2 && input.size(0) == output.size(0) &&
              input.size(1) == 2 * output.size(1),
          fn,
          fmt::format("silu_and_mul(input, output): input must be [M, 2I] and output [M, I]; got input {}, output {} "
                      "(arguments swapped?)",
                      describe(input), describe(output)));
  const int64_t M = output.size(0), I = output.size(1);
  require_tensor(fn, "input", input, input.scalar_type(), {M, 2 * I}, input.device());
  require_tensor(fn, "output", output, input.scalar_type(), {M, I}, input.device());
  at::Tensor x = input.to(at::kCPU).to(at::kDouble);
  at::Tensor gate = x.narrow(1, 0, I), up = x.narrow(1, I, I);
  ixformer_double::store(output, gate / (1.0 + at::exp(-gate)) * up);
  rec.commit();
}

void moe_output_reduce_sum(torch::Tensor outputs, torch::Tensor inputs, const std::optional<torch::Tensor>& mul_weight,
                           const std::optional<torch::Tensor>& mask,
                           const std::optional<torch::Tensor>& extra_residual, double scaling_factor) {
  const char* fn = "moe_output_reduce_sum";
  Recorder rec(fn);
  rec.tensor("outputs", outputs);
  rec.tensor("inputs", inputs);
  rec.optional("mul_weight", mul_weight);
  rec.optional("mask", mask);
  rec.optional("extra_residual", extra_residual);
  rec.scalar("scaling_factor", scaling_factor);
  require(inputs.dim() == 3, fn, fmt::format("inputs must be [T, K, H], got {}", describe(inputs)));
  const int64_t T = inputs.size(0), K = inputs.size(1), H = inputs.size(2);
  const at::Device dev = inputs.device();
  require_tensor(fn, "inputs", inputs, inputs.scalar_type(), {T, K, H}, dev);
  require_tensor(fn, "outputs", outputs, inputs.scalar_type(), {T, H}, dev);
  require(!mask, fn, "mask is not modeled by the double");
  at::Tensor y = inputs.to(at::kCPU).to(at::kDouble);
  at::Tensor sum;
  if (mul_weight) {
    require_tensor(fn, "mul_weight", *mul_weight, at::kFloat, {T, K}, dev);
    sum = (y * mul_weight->to(at::kCPU).to(at::kDouble).unsqueeze(-1)).sum(1);
  } else {
    sum = y.sum(1);
  }
  // The double's reading of "scaling_factor applies only with a residual":
  //   with extra_residual:    out = scaling_factor * sum + residual
  //   without extra_residual: out = sum   (scaling_factor is ignored)
  if (extra_residual) {
    require_tensor(fn, "extra_residual", *extra_residual, inputs.scalar_type(), {T, H}, dev);
    sum = scaling_factor * sum + extra_residual->to(at::kCPU).to(at::kDouble);
  }
  ixformer_double::store(outputs, sum);
  rec.commit();
}

}  // namespace ixformer::infer
