// The GPU tests' harness: a random problem (config, token count, inputs and weights as the device
// holds them), its upload, one poisoned forward with everything it left read back, and the check
// of every stage against the float64 reference (tests/reference/reference.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/moe_config.h"
#include "gpu_util.h"
#include "runtime/layer.h"
#include "tests/reference/reference.h"

namespace moejit::test {

// ---------------------------------------------------------------------------------------------
// Element types as stored on the device. E4M3: float8_e4m3fn (common/fp8.h).
enum class Elem { BF16, FP16, FP32, I8, E4M3 };
Elem elem_of(DType dtype);
int elem_bytes(Elem elem);
// The value `v` becomes when stored as `elem` (round to nearest even; int8 values must be integral;
// e4m3 saturates to +-448).
float round_to(Elem elem, float v);
void encode(Elem elem, float v, uint8_t* dst);
double decode(Elem elem, const uint8_t* src);

// A host tensor in the device's representation; read as doubles on demand, so a 65536-token
// input does not also live as 8-byte values.
struct HostTensor {
  Elem elem = Elem::FP32;
  int64_t count = 0;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(Elem e, int64_t n) : elem(e), count(n), bytes(static_cast<size_t>(n) * elem_bytes(e)) {}
  void set(int64_t i, float v) { encode(elem, v, bytes.data() + i * elem_bytes(elem)); }
  double at(int64_t i) const { return decode(elem, bytes.data() + i * elem_bytes(elem)); }
  std::vector<double> doubles(int64_t begin, int64_t end) const;
  std::vector<double> doubles() const { return doubles(0, count); }
};

// ---------------------------------------------------------------------------------------------
// Seeds. The base comes from MOEJIT_GPU_TEST_SEED (default 0; "random" picks one from the clock
// and prints it). Each draw's seed mixes the base, the full test name and a per-test counter, so
// one test gives the same draws whether it runs alone (--gtest_filter) or with the others.
uint64_t base_seed();
std::string current_test_name();  // "Suite.Name" (parameterized: "Prefix/Suite.Name/3")
class Seeds {
 public:
  explicit Seeds(std::string name = current_test_name()) : name_(std::move(name)) {}
  uint64_t next() { return mix_seed(mix_seed(base_seed(), fnv1a(name_)), counter_++); }
  // How to get the same draws again, for failure messages.
  std::string how_to_reproduce() const;

 private:
  std::string name_;
  uint64_t counter_ = 0;
};

// ---------------------------------------------------------------------------------------------
// One problem: a config (with its expert-parallel rank), a token count and every input.
enum class Tensor : uint64_t {
  Hidden = 1, Logits, Residual, Bias, W13, W2, W13Scale, W2Scale, InputSmooth, ActSmooth, W13Bias, W2Bias
};

struct ProblemOptions {
  bool residual = false;
  // Redraw equal logits within a row, so the routing reference rarely reports ties and the ids
  // check stays strict (hostile tests turn this off and write their own logits).
  bool distinct_logits = true;
  // fp8 weight scales. By default (both 0) each block's e4m3 values (fp8_block: a 128 x 128 block;
  // fp8_tensor: the whole expert matrix) are a normal draw times a random magnitude 2^u, u in
  // [-5, 7] (subnormals to saturation), and the block's fp32 scale undoes that magnitude, so the
  // dequantized weights give the unit-variance GEMM outputs of the 16-bit dtypes. With a range,
  // every scale is log-uniform in [fp8_scale_min, fp8_scale_max] (e.g. 1e-6..1e4, values a 16-bit
  // or approximate scale path would lose) and the e4m3 values compensate as far as e4m3 reaches
  // (magnitude clamped to [2^-6, 2^6]), so the dequantized weights then differ in magnitude from
  // block to block by up to the range's width: bf16 keeps such outputs in range, fp16 may not.
  double fp8_scale_min = 0, fp8_scale_max = 0;
};

struct Problem {
  MoeConfig config;
  int64_t tokens = 0;
  uint64_t seed = 0;             // weights, bias, input_smooth
  uint64_t activation_seed = 0;  // hidden, logits, residual
  std::string reproduce;         // printed with every failure
  ProblemOptions options;
  HostTensor hidden;                // [T, H] dtype
  HostTensor logits;                // [T, E] router dtype
  HostTensor residual;              // [T, H] dtype; count 0 when absent
  std::vector<float> bias;          // [E]; noaux_tc only
  std::vector<float> input_smooth;  // [E + S, H]; w8a8 only (global, as every rank receives it)

  bool w8a8() const { return config.quant == Quant::W8A8Int8; }
  bool fp8() const { return is_fp8(config.quant); }
  bool noaux() const { return config.topk_method == TopkMethod::NoauxTc; }
  std::vector<double> bias_doubles() const { return {bias.begin(), bias.end()}; }
  // One line: the config's fields that matter, T, the seed and how to reproduce.
  std::string describe() const;
  // The same inputs seen by another expert-parallel rank (weights are per global expert, so
  // every rank's slice comes from the same values).
  Problem for_rank(int ep_size, int ep_rank) const;
};

Problem make_problem(const MoeConfig& config, int64_t tokens, uint64_t seed, const std::string& reproduce,
                     const ProblemOptions& options = {});
// Rewrites the activations (hidden, logits, residual) with values from a new seed; weights stay.
void redraw_activations(Problem& problem, uint64_t seed);

// Weights: element type, elements per expert, and one global expert's slice in storage order.
// The scale tensors (W13Scale, W2Scale) have quant_tensor_shapes(config)'s shapes: per expert
// N1 / H (w8a8), ceil(N1/128) * ceil(H/128) / ceil(H/128) * ceil(I/128) (fp8_block), 1
// (fp8_tensor); none without quantization.
Elem weight_elem(const MoeConfig& config, Tensor t);
int64_t expert_elems(const MoeConfig& config, Tensor t);
void expert_bytes(const Problem& p, Tensor t, int global_expert, uint8_t* dst);
void expert_doubles(const Problem& p, Tensor t, int global_expert, double* dst);
// E_loc * (N1*H + H*I): the weights of one rank (E_loc + S with fused shared experts).
int64_t weight_elements(const MoeConfig& config);
// The global expert whose weights a rank's local expert holds: the routed s + l, or a fused shared
// expert E + (l - E_loc), generated like any other expert.
int global_expert_of_local(const MoeConfig& config, int local);
// Above this many weight elements the reference gets only the experts the checked tokens use
// (compaction), e.g. the full-size presets (up to 17 G weights).
constexpr int64_t kMaterializeLimit = int64_t{320} << 20;  // 2.5 GB of doubles

// The rank's weights as the reference wants them ([E_loc, ...] doubles, input_smooth [E, H];
// fp8: e4m3 values and their scales).
reference::Weights reference_weights(const Problem& p);

// ---------------------------------------------------------------------------------------------
// Device side.
struct DeviceInputs {
  DeviceBuffer hidden, logits, residual, bias, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias;
  // router_gemm layers: the gate weight [E, H]; when set, inputs() passes it and no router_logits.
  // router_bias layers: the router's bias [E] (dtype) beside it.
  DeviceBuffer gate_weight, gate_bias;
  LayerInputs inputs() const;
};
// A host tensor's bytes in a new device buffer.
DeviceBuffer upload_tensor(const HostTensor& t);
DeviceInputs upload(const Problem& p);
// Copies hidden, logits and residual into the existing buffers (same addresses), on `stream`.
void upload_activations(const Problem& p, DeviceInputs& d, cudaStream_t stream);

constexpr size_t kGuardBytes = 4096;  // poisoned bytes after the output and the workspace
constexpr uint8_t kPoison = 0xFF;     // NaN in bf16, fp16 and fp32; -1 in int32

// What one forward left on the device (buffers kept alive) and its small arrays on the host.
struct GpuRun {
  MoeConfig config;
  int64_t tokens = 0;
  DeviceBuffer out_buffer, workspace_buffer;  // each with kGuardBytes after the used part
  size_t out_bytes = 0, workspace_bytes = 0;
  WorkspaceOffsets offsets{};

  std::vector<uint8_t> out;         // [T, H] dtype bytes
  std::vector<float> topk_weights;  // [T*K]
  std::vector<int> topk_ids;        // [T*K]
  std::vector<int> counts;          // [E_loc]
  std::vector<int> expert_offsets;  // [E_loc + 1]
  std::vector<int> sorted_pair;     // [T*K] (valid up to rows)
  std::vector<int> pair_pos;        // [T*K]
  int64_t rows = -1;                // expert_offsets[E_loc] when it is in [0, T*K], else -1
  // GEMM 1 quantized its own output (fp8_block tiles of whole scale groups): act_q and act_scale
  // are GEMM 1's and act_f32 is never written; "act" rows are then act_q dequantized.
  bool gemm1_quantized_act = false;
  uint8_t poison = kPoison;
  bool out_guard_intact = true, workspace_guard_intact = true;
  // Only for the harness's own host tests (test_harness.cpp): when set, it stands in for the
  // device workspace, so check_run can be shown to pass a correct run and fail broken ones.
  std::vector<uint8_t> host_workspace;

  double out_at(int64_t i) const;
  // Rows [begin, end) of an expert-sorted workspace buffer as doubles: "act" (act_f32 for w8a8
  // and fp8; act_q times act_scale where gemm1_quantized_act) or "y".
  std::vector<double> rows_of(const char* which, int64_t begin, int64_t end) const;
  std::vector<uint8_t> raw(int64_t offset, size_t bytes) const;  // workspace bytes
};

// Allocates output and workspace (workspace_bytes(T) + guard), fills both with `poison` bytes on
// `stream`, runs forward, synchronizes and reads back the small arrays.
GpuRun run_forward(const Layer& layer, const DeviceInputs& in, int64_t tokens, cudaStream_t stream,
                   uint8_t poison = kPoison);
// Reads back what a forward on run.out_buffer / run.workspace_buffer left (run_forward calls it).
void download_results(GpuRun& run);

// Layer::experts with the caller's routing ([T*K] ids and weights), poisoned like run_forward;
// the returned run's topk_ids / topk_weights are the caller's.
GpuRun run_experts(const Layer& layer, const DeviceInputs& in, int64_t tokens, const std::vector<int>& ids,
                   const std::vector<float>& weights, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Checks.
struct Tolerances {
  double act, y, out, layer;
  double weight_rel = 1e-5;  // routing weights, relative, whatever the logits' dtype (see .cpp)
};
Tolerances tolerances_for(const MoeConfig& config);

struct CheckOptions {
  // Tokens whose outputs and expert rows are compared with the reference; empty: all. Routing and
  // index are always checked for every token.
  std::vector<int64_t> sample = {};
  // Also run reference::layer end to end (full weights only; small problems).
  bool reference_layer = false;
  // Give the reference only the experts the checked tokens use even for small weights (the path
  // the full-size presets take), so the harness's host tests cover it.
  bool force_compaction = false;
};

// Compares every stage with the reference; every mismatch is a non-fatal gtest failure carrying
// p.describe(). Returns true when everything matched. Quantized configs also get their
// quantizations compared with the reference's rule on the same values: w8a8's a_q / act_q rows;
// fp8's a_q / a_scale of each checked token that has a local pair (GEMM 1 reads only those) and
// act_q / act_scale of each checked expert row (from the GPU's own act_f32). For fp8 the output's
// error against the unquantized layer over the dequantized weights (SPEC.md: reported) is recorded
// as the test property fp8_error_vs_unquantized, for problems small enough, and not checked.
bool check_run(const Problem& p, const GpuRun& run, const CheckOptions& options = {});

// Stages 2-6 only, for a run of Layer::experts whose routing the caller gave (run.topk_ids and
// run.topk_weights hold it): index, expert rows, output and the w8a8 / fp8 quantizations.
bool check_experts_run(const Problem& p, const GpuRun& run, const CheckOptions& options = {});

// Checks only what holds whatever the logits are: ids in range and distinct per row (routed: the
// layer's own routing; false for an experts-only run, whose ids the caller gave, repeats allowed
// when topk > experts), weights and output finite, guards intact. Returns true when all hold.
bool check_invariants(const Problem& p, const GpuRun& run, bool routed = true);

// For a forward that must have done nothing (T = 0, rejected arguments): every byte of the output
// and the workspace, guards included, still holds the poison.
bool check_untouched(const GpuRun& run, const Problem& p);

// The reference's experts stages for the listed tokens given the GPU's routing, run in parallel
// over token chunks. Pair (i, j) of the listed token i has act/y rows at [i*K + j] (zero when its
// expert is not local; local[i*K + j] says which).
struct ReferenceExperts {
  std::vector<double> out;     // [n, H]
  std::vector<double> act;     // [n*K, I]
  std::vector<double> y;       // [n*K, H]
  std::vector<uint8_t> local;  // [n*K] (bytes, not vector<bool>: chunks write it concurrently)
};
ReferenceExperts reference_experts(const Problem& p, const std::vector<int64_t>& tokens, const std::vector<int>& ids,
                                   const std::vector<double>& weights, const reference::Weights* full);

// A short, readable form of a config for test names and messages.
std::string short_config(const MoeConfig& c);

}  // namespace moejit::test
