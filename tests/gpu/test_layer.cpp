// The whole layer against the float64 reference, every stage: small configs for the sanitizers,
// every SPEC.md preset (scaled in bf16/fp16/fp32 and w8a8, full size in bf16) and 200 random
// configurations. Each test draws fresh inputs, poisons output and workspace, and checks what
// check_run (harness.cpp) lists: routing ids/weights, index, act, y, output and the layer.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/layer_compiler.h"
#include "compiler/planner.h"
#include "harness.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"
#include "test_cases.h"

namespace moejit::test {
namespace {

// ---------------------------------------------------------------------------------------------
// Runs one problem on a layer: upload, poisoned forward, check (T = 0: nothing may change).
bool run_and_check(const Layer& layer, const Problem& p, const CheckOptions& options = {}) {
  Stream stream;
  DeviceInputs in = upload(p);
  GpuRun run = run_forward(layer, in, p.tokens, stream.get());
  if (p.tokens == 0) return check_untouched(run, p);
  return check_run(p, run, options);
}

// ---------------------------------------------------------------------------------------------
// Small configs, selected by gpu.memcheck and gpu.racecheck (--gtest_filter=Sanitize.*). Two
// token counts each, in different tile buckets; reference::layer is run literally as well.
void sanitize_config(const MoeConfig& c, std::initializer_list<int64_t> token_counts, bool residual,
                     const LayerOptions& options = {}) {
  Seeds seeds;
  auto layer = Layer::create(c, options);
  for (int64_t T : token_counts) {
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = residual});
    EXPECT_TRUE(run_and_check(*layer, p, {.reference_layer = true})) << "T = " << T;
  }
}

// ---------------------------------------------------------------------------------------------
// A small config on tensor cores: bf16 softmax, gated SiLU; H and I multiples of 8 (tensor cores),
// not of 64 (K tails).
MoeConfig tensor_core_config() {
  MoeConfig c;
  c.experts = 16;
  c.topk = 4;
  c.hidden = 264;
  c.moe_intermediate = 104;
  c.dtype = c.router_dtype = DType::BF16;
  return c;
}

// Both sides of every bucket edge of the layer's own plan: on sm_90a the mid bucket ends where an
// expert's mean rows fill its tile, so the edges move with the config. A 64-row wgmma mid tile (16
// experts, top-4: mid ends at T=255, "short" 256..489, "wide" 490..664) and a 16-row mma.sync one
// (128 experts, top-8: mid ends at 255, then 128-row wgmma tiles).
TEST(Buckets, BothSidesOfEveryEdgeAgainstTheReference) {
  MoeConfig many = tensor_core_config();
  many.experts = 128;
  many.topk = 8;
  for (const MoeConfig& c : {tensor_core_config(), many}) {
    SCOPED_TRACE(fmt::format("E {} K {}", c.experts, c.topk));
    Seeds seeds;
    auto layer = Layer::create(c);
    ASSERT_NE(layer->plan(), nullptr);
    const auto& buckets = layer->plan()->buckets;
    ASSERT_GE(buckets.size(), 3u);
    for (size_t i = 0; i + 1 < buckets.size(); ++i)
      for (int64_t T : {buckets[i].max_tokens, buckets[i + 1].min_tokens}) {
        Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce());
        EXPECT_TRUE(run_and_check(*layer, p)) << buckets[i].name() << " / " << buckets[i + 1].name() << ", T = " << T;
      }
  }
}

// Every tile autotune may pick (tile_candidates) computes the layer correctly, in each bucket's
// row tile (16 and 64 and 128 for the first config, and 192 on sm_90a; 32 for the second).
// bf16 softmax, gated SiLU; H and I multiples of 8 (tensor cores), not of 64 (K tails).
TEST(TileCandidates, EveryCandidateMatchesTheReference) {
  const MoeConfig a = tensor_core_config();
  MoeConfig b = a;  // fp16, non-gated GELU, more experts: the mid bucket tiles 32 rows
  b.experts = 64;
  b.topk = 8;
  b.hidden = 136;
  b.moe_intermediate = 48;
  b.gated = false;
  b.activation = Activation::Gelu;
  b.dtype = b.router_dtype = DType::FP16;
  Seeds seeds;
  std::set<int> row_tiles;
  std::set<GemmKernel> kernels;
  for (const MoeConfig& c : {a, b}) {
    for (const TokenBucket& bucket : plan_buckets(c, default_arch())) {
      const int64_t T = std::min<int64_t>(bucket.max_tokens, bucket.min_tokens + 37);
      for (const auto& [gemm1, gemm2] : tile_candidates(c, bucket, default_arch())) {
        LayerOptions options;
        options.tiles = {{std::string(bucket.name()), true, gemm1}, {std::string(bucket.name()), false, gemm2}};
        auto layer = Layer::create(c, options);
        Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce());
        EXPECT_TRUE(run_and_check(*layer, p)) << short_config(c) << " T=" << T << " gemm1 " << describe(gemm1)
                                              << " gemm2 " << describe(gemm2);
        row_tiles.insert(gemm1.bm);
        kernels.insert({gemm1.kernel, gemm2.kernel});
      }
    }
  }
  if (wgmma_arch(default_arch())) {
    EXPECT_EQ(row_tiles, (std::set<int>{16, 32, 64, 128, 192}));  // 192: three wgmma consumers
    EXPECT_TRUE(kernels.count(GemmKernel::Wgmma)) << "no wgmma tile was run";
  } else {
    EXPECT_EQ(row_tiles, (std::set<int>{16, 32, 64, 128}));
  }
}

// autotune stores its choice, and Layer::create on this device then plans with it.
TEST(Autotune, StoresTheFastestTilesAndCreateUsesThem) {
  const MoeConfig c = tensor_core_config();
  const TuneReport report = autotune(c, 0);
  ASSERT_FALSE(report.stored_in.empty()) << report.why_not_stored;
  size_t candidates = 0;
  const std::vector<TokenBucket> buckets = plan_buckets(c, default_arch());
  for (const auto& bucket : buckets) candidates += tile_candidates(c, bucket, default_arch()).size();
  EXPECT_EQ(report.timings.size(), candidates);
  ASSERT_EQ(report.chosen.size(), 2 * buckets.size());
  for (const auto& t : report.timings) EXPECT_GT(t.ms, 0.0) << t.tiles;

  auto layer = Layer::create(c);
  for (const TileOverride& o : report.chosen) {
    auto named = std::find_if(buckets.begin(), buckets.end(), [&](const auto& x) { return x.name() == o.bucket; });
    ASSERT_NE(named, buckets.end()) << o.bucket;
    const TokenBucket& b = layer->plan()->bucket_for(named->min_tokens);
    ASSERT_EQ(b.name(), o.bucket);
    EXPECT_EQ(describe(o.gemm1 ? b.gemm1 : b.gemm2), describe(o.tile)) << to_string(o);
  }
  Seeds seeds;
  Problem p = make_problem(c, 70, seeds.next(), seeds.how_to_reproduce());
  EXPECT_TRUE(run_and_check(*layer, p));
}

TEST(Sanitize, Bf16Softmax) {
  MoeConfig c;
  c.experts = 12;
  c.topk = 3;
  c.hidden = 200;
  c.moe_intermediate = 72;
  c.dtype = c.router_dtype = DType::BF16;
  sanitize_config(c, {5, 40}, true);
}

TEST(Sanitize, GroupedSigmoidNoauxTc) {
  MoeConfig c = preset("deepseek-v3");
  c.experts = 32;
  c.topk = 4;
  c.num_expert_group = 4;
  c.topk_group = 2;
  c.hidden = 136;
  c.moe_intermediate = 80;
  c.router_dtype = DType::FP32;
  c.weight_layout = WeightLayout::KN;
  sanitize_config(c, {3, 40}, false);
}

// The warpgroup-MMA tiles (sm_90a; mma.sync elsewhere) of the mid, wide (513..664 here: 192 rows)
// and prefill (128 rows) buckets under memcheck (the swizzled stage addressing, the edges) and
// racecheck (the generic-proxy accesses; whether racecheck sees wgmma's own shared-memory reads is
// not documented, so the stage hand-offs rest on the reference checks of TileCandidates as well).
TEST(Sanitize, WgmmaTiles) { sanitize_config(tensor_core_config(), {90, 600, 1000}, true); }

TEST(Sanitize, W8a8Int8) {
  MoeConfig c;
  c.experts = 8;
  c.topk = 2;
  c.hidden = 200;
  c.moe_intermediate = 96;
  c.dtype = c.router_dtype = DType::FP16;
  c.quant = Quant::W8A8Int8;
  c.activation = Activation::Gelu;
  sanitize_config(c, {7, 40}, true);
}

// The 8-bit warpgroup-MMA GEMMs (sm_90a; SIMT elsewhere) in every bucket: decode and mid take 64-row
// tiles, T = 700 (175 rows per expert) 128-row ones. H = 208 and I = 144 are multiples of 16 (16-byte
// rows) but not of 128: partial k-tiles, partial fp8 scale blocks, a weight tile past N.
MoeConfig eight_bit_config(Quant quant) {
  MoeConfig c;
  c.experts = 8;
  c.topk = 2;
  c.hidden = 208;
  c.moe_intermediate = 144;
  c.dtype = c.router_dtype = DType::BF16;
  c.quant = quant;
  return c;
}

TEST(Sanitize, W8a8Int8Wgmma) { sanitize_config(eight_bit_config(Quant::W8A8Int8), {7, 40, 700}, true); }

TEST(Sanitize, Fp8BlockWgmma) { sanitize_config(eight_bit_config(Quant::Fp8Block), {7, 40, 700}, true); }

// experts() given the rows already quantized (LayerInputs::hidden_scale: what expert parallel's fp8
// dispatch delivers) skips stage 3 and gives the output of experts() on the model-dtype rows bit for
// bit: the rows are the bytes and scales the layer's own stage 3 wrote (read back from a forward's
// workspace), and stage 3 quantizes each token's row once, whatever its experts.
TEST(Fp8, ExpertsOnTheLayersOwnQuantizedRowsIsTheLayer) {
  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    const MoeConfig c = eight_bit_config(quant);
    auto layer = Layer::create(c);
    Seeds seeds;
    Stream stream;
    for (int64_t T : {1, 40, 700}) {
      SCOPED_TRACE(fmt::format("{} T = {}", to_string(quant), T));
      Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
      DeviceInputs in = upload(p);
      const GpuRun forward = run_forward(*layer, in, T, stream.get());
      ASSERT_TRUE(check_run(p, forward));
      const GpuRun plain = run_experts(*layer, in, T, forward.topk_ids, forward.topk_weights, stream.get());
      const int64_t groups = activation_scale_groups(c, c.hidden);
      const std::vector<uint8_t> q = forward.raw(forward.offsets.a_q, static_cast<size_t>(T * c.hidden));
      const std::vector<uint8_t> scale = forward.raw(forward.offsets.a_scale, static_cast<size_t>(T * groups * 4));
      DeviceBuffer d_q(q.size()), d_scale(scale.size());
      d_q.upload(q.data(), q.size());
      d_scale.upload(scale.data(), scale.size());
      DeviceInputs quantized = upload(p);
      quantized.hidden = std::move(d_q);
      LayerInputs rows = quantized.inputs();
      rows.hidden_scale = d_scale.as<float>();
      DeviceBuffer ids(forward.topk_ids.size() * 4), weights(forward.topk_weights.size() * 4);
      ids.upload(forward.topk_ids.data(), ids.size());
      weights.upload(forward.topk_weights.data(), weights.size());
      DeviceBuffer out(plain.out.size()), workspace(layer->workspace_bytes(T));
      out.fill(kPoison, stream.get());
      layer->experts(stream.get(), T, ids.as<int>(), weights.as<float>(), rows, out.get(), workspace.get(),
                     workspace.size());
      stream.sync();
      EXPECT_TRUE(out.download_all() == plain.out) << "not experts()'s output on the model-dtype rows";
    }
  }
}

// fp8_block's prefill tiles past 128 weight rows: each K block's partial sums in two passes of half
// the rows. 256 rows where every pass lies in one scale block (H = 384, I = 256: the planner's
// prefill tile), gated GEMM 1 and not (also I = 384: a last column tile half past N, whose GEMM 1
// quantizes one group); 192 rows (passes of 96 that meet block edges) on the odd sizes of
// eight_bit_config.
LayerOptions fp8_block_wide_tiles(int weight_rows, bool gated) {
  auto wg = [](int bn, int stages) { return TileShape{GemmKernel::Wgmma, 128, bn, 128, 128 / 16 + 4, 1, stages}; };
  LayerOptions options;
  options.tiles = {{"prefill", true, wg(gated ? weight_rows / 2 : weight_rows, 4)}, {"prefill", false, wg(weight_rows, 4)}};
  return options;
}

TEST(Sanitize, Fp8BlockTwoPassWgmma) {
  MoeConfig aligned = eight_bit_config(Quant::Fp8Block);
  aligned.hidden = 384;
  aligned.moe_intermediate = 256;
  sanitize_config(aligned, {700, 1001}, true, fp8_block_wide_tiles(256, true));
  MoeConfig plain = aligned;  // not gated: GEMM 1's passes split one half
  plain.gated = false;
  plain.activation = Activation::Gelu;
  sanitize_config(plain, {700}, false, fp8_block_wide_tiles(256, false));
  plain.moe_intermediate = 384;  // GEMM 1's last 256-column tile holds one scale group of two
  sanitize_config(plain, {700}, false, fp8_block_wide_tiles(256, false));
  sanitize_config(eight_bit_config(Quant::Fp8Block), {700, 1001}, true, fp8_block_wide_tiles(192, true));
}

TEST(Sanitize, Fp8TensorWgmma) { sanitize_config(eight_bit_config(Quant::Fp8Tensor), {5, 700}, false); }

// quantize.cuh's whole-row quantizations (w8a8 and fp8_tensor, stage 3 and between the GEMMs) hold
// a row in registers where it is whole 16-byte chunks of at most 64 values a thread; the others
// read it twice: rows of 100 fp16 and 50 fp32 values (not whole chunks), and rows of 16400 values
// (more than 64 a thread at 256 threads), one per stage.
TEST(Sanitize, QuantizeRowsPastTheRegisterPath) {
  for (Quant quant : {Quant::W8A8Int8, Quant::Fp8Tensor}) {
    SCOPED_TRACE(to_string(quant));
    MoeConfig c;
    c.experts = 4;
    c.topk = 2;
    c.dtype = c.router_dtype = DType::FP16;
    c.quant = quant;
    c.hidden = 100;
    c.moe_intermediate = 50;
    sanitize_config(c, {7, 40}, true);
    c.hidden = 16400;
    c.moe_intermediate = 64;
    sanitize_config(c, {5}, false);
    c.hidden = 64;
    c.moe_intermediate = 16400;
    sanitize_config(c, {5}, false);
  }
}

// The 8-bit mma.sync GEMMs (mma_gemm.cuh: int8 from sm_80, e4m3 from sm_89; the planner runs them
// nowhere yet, so tile overrides force them): 16-row tiles in decode (T = 7), 64 in mid (T = 40),
// 128 in prefill (T = 700), with the partial k-tiles, scale blocks and column tiles of H = 208,
// I = 144.
LayerOptions eight_bit_mma_tiles() {
  auto tc = [](int bm, int bn, int stages, int warps_m, int warps_n) {
    return TileShape{GemmKernel::TensorCore, bm, bn, 128, warps_m, warps_n, stages};
  };
  LayerOptions options;
  options.tiles = {{"decode", true, tc(16, 16, 8, 1, 2)},   {"decode", false, tc(16, 32, 8, 1, 2)},
                   {"mid", true, tc(64, 64, 4, 2, 2)},      {"mid", false, tc(64, 128, 4, 2, 2)},
                   {"prefill", true, tc(128, 64, 3, 2, 4)}, {"prefill", false, tc(128, 128, 3, 2, 4)}};
  return options;
}

TEST(Sanitize, W8a8Int8Mma) {
  sanitize_config(eight_bit_config(Quant::W8A8Int8), {7, 40, 700}, true, eight_bit_mma_tiles());
}

TEST(Sanitize, Fp8BlockMma) { sanitize_config(eight_bit_config(Quant::Fp8Block), {7, 40, 700}, true, eight_bit_mma_tiles()); }

TEST(Sanitize, Fp8TensorMma) {
  sanitize_config(eight_bit_config(Quant::Fp8Tensor), {7, 40, 700}, false, eight_bit_mma_tiles());
}

// The tiles the planner gives 8-bit layers on the archs where they run on mma.sync (int8 from
// sm_80, fp8 from sm_89), each bucket's, run here through tile overrides (an sm_80 cubin does not
// load on sm_90): 16-, 32-, 64- and 128-row tiles over two configs (E = 8, K = 2 and E = 32,
// K = 4), T in every bucket.
TEST(Sanitize, EightBitMmaPlannedTiles) {
  for (Quant q : {Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    for (auto [experts, topk] : {std::pair{8, 2}, std::pair{32, 4}}) {
      MoeConfig c = eight_bit_config(q);
      c.experts = experts;
      c.topk = topk;
      const Plan plan = make_plan(c, q == Quant::W8A8Int8 ? "sm_80" : "sm_89");
      LayerOptions options;
      for (const TokenBucket& b : plan.buckets) {
        ASSERT_EQ(b.gemm1.kernel, GemmKernel::TensorCore) << b.name();
        options.tiles.push_back({std::string(b.name()), true, b.gemm1});
        options.tiles.push_back({std::string(b.name()), false, b.gemm2});
      }
      SCOPED_TRACE(fmt::format("quant {} E {} K {}", to_string(q), experts, topk));
      sanitize_config(c, {7, 40, 700}, q != Quant::Fp8Tensor, options);
    }
  }
}

// fp8 on the SIMT template (H not a multiple of 16), fp16, non-gated GELU.
TEST(Sanitize, Fp8BlockSimt) {
  MoeConfig c = eight_bit_config(Quant::Fp8Block);
  c.hidden = 200;
  c.moe_intermediate = 136;
  c.dtype = c.router_dtype = DType::FP16;
  c.gated = false;
  c.activation = Activation::Gelu;
  sanitize_config(c, {7, 40}, true);
}

// gpt-oss's expert biases and clamped SwiGLU (a tight limit, so that both clamps bite) on every GEMM
// kind: mma.sync at decode, wgmma at mid and prefill (tensor_core_config's shape, 513..664 and
// 665+ buckets), the SIMT template (H not a multiple of 8), fp8 and int8 (biases after the scales).
TEST(Sanitize, SwigluOaiBiases) {
  MoeConfig c = tensor_core_config();
  c.activation = Activation::SwigluOai;
  c.swiglu_limit = 0.5;
  c.expert_bias = true;
  sanitize_config(c, {5, 90, 1000}, true);
  c.hidden = 203;
  sanitize_config(c, {7}, false);
  for (Quant q : {Quant::Fp8Block, Quant::W8A8Int8}) {
    MoeConfig e = eight_bit_config(q);
    e.activation = Activation::SwigluOai;
    e.swiglu_limit = 0.5;
    e.expert_bias = true;
    sanitize_config(e, {7, 700}, false);
  }
}

// ---------------------------------------------------------------------------------------------
// Presets.
class Presets : public ::testing::TestWithParam<PresetCase> {};

TEST_P(Presets, Layer) {
  const PresetCase& pc = GetParam();
  const MoeConfig c = preset_config(pc);
  Seeds seeds;
  auto layer = Layer::create(c);
  // Shared experts reach the layer as `residual`, so presets that have them pass one.
  const ProblemOptions options{.residual = c.n_shared_experts > 0};
  for (int64_t T : preset_tokens(pc)) {
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), options);
    EXPECT_TRUE(run_and_check(*layer, p)) << "T = " << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Scaled, Presets, ::testing::ValuesIn(scaled_preset_cases()),
                         [](const auto& info) { return preset_case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(W8a8, Presets, ::testing::ValuesIn(w8a8_preset_cases()),
                         [](const auto& info) { return preset_case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(FullSize, Presets, ::testing::ValuesIn(full_size_preset_cases()),
                         [](const auto& info) { return preset_case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Fp8, Presets, ::testing::ValuesIn(fp8_preset_cases()),
                         [](const auto& info) { return preset_case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Fp8FullSize, Presets, ::testing::ValuesIn(fp8_full_size_preset_cases()),
                         [](const auto& info) { return preset_case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Random configurations: one test each, so a failure names its index and can be rerun alone.
std::mutex g_random_mutex;
std::map<int, std::pair<bool, std::string>> g_random_results;

class RandomConfig : public ::testing::TestWithParam<int> {};

TEST_P(RandomConfig, Layer) {
  const RandomCase rc = random_case(GetParam());
  Seeds seeds;
  Problem p = make_problem(rc.config, rc.tokens, seeds.next(), seeds.how_to_reproduce(), rc.options());
  bool ok = false;
  {
    auto layer = Layer::create(rc.config);
    ok = run_and_check(*layer, p);
  }
  std::lock_guard lock(g_random_mutex);
  g_random_results[GetParam()] = {ok && !HasFailure(), p.describe()};
}

INSTANTIATE_TEST_SUITE_P(Draw, RandomConfig, ::testing::Range(0, kRandomConfigs));

// ---------------------------------------------------------------------------------------------
// The environment: initializes CUDA once, compiles the presets' and random configs' kernels in
// the background while the tests run (NVRTC is the slowest part of a 200-config sweep; the
// kernel cache's single flight makes Layer::create wait for, not repeat, a compile in progress),
// and prints the random configs' pass/fail summary at the end.
class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    base_seed();  // print it first
    if (!gpu_tests_selected()) return;
    try {
      init_cuda();
    } catch (const std::exception& e) {
      // Fatal in the global set-up: gtest runs no test and the binary fails, with this reason.
      GTEST_FAIL() << "no usable CUDA device for the GPU tests: " << e.what();
    }
    const char* prefetch = std::getenv("MOEJIT_GPU_TEST_PREFETCH");
    if (prefetch && std::string(prefetch) == "0") return;
    start_prefetch();
  }

  void init_cuda() {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaFree(nullptr));  // create the primary context, which the layers then use
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::fprintf(stderr, "moejit gpu tests: %d device(s); using 0: %s (sm_%d%d, %.0f GiB)\n", devices, prop.name,
                 prop.major, prop.minor, prop.totalGlobalMem / double(1 << 30));
  }

  void start_prefetch() {
    for (const MoeConfig& c : configs_to_run()) queue_.push_back(c);
    const std::string arch = default_arch();
    const unsigned workers = std::max(1u, std::min(4u, host_threads() / 4));
    for (unsigned i = 0; i < workers; ++i)
      threads_.emplace_back([this, arch] {
        for (;;) {
          MoeConfig c;
          {
            std::lock_guard lock(mutex_);
            if (stop_ || queue_.empty()) return;
            c = queue_.front();
            queue_.pop_front();
          }
          // A compile error is not reported here: the test's own Layer::create repeats the
          // compile (failures are never cached) and reports it with the test.
          try {
            compile_layer(c, arch, global_cache());
          } catch (const std::exception&) {
          }
        }
      });
  }

  void TearDown() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
    std::lock_guard lock(g_random_mutex);
    if (g_random_results.empty()) return;
    int passed = 0;
    std::string failed;
    for (const auto& [i, r] : g_random_results) {
      if (r.first)
        ++passed;
      else
        failed += fmt::format("\n  Draw/RandomConfig.Layer/{}: {}", i, r.second);
    }
    std::fprintf(stderr, "moejit gpu tests: random configs: %d passed, %d failed%s\n", passed,
                 static_cast<int>(g_random_results.size()) - passed, failed.c_str());
  }

 private:
  // Whether the gtest filter selected any test outside the host-only checks of the harness.
  static bool gpu_tests_selected() {
    static const std::set<std::string> kHostOnlySuites = {"Conversions",  "Generator",        "WorkspaceLayout",
                                                          "RandomSweep",  "Configs/CheckRun", "CheckRunSanity",
                                                          "CheckRunSweep"};
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
      if (suite.test_to_run_count() > 0 && !kHostOnlySuites.count(suite.name())) return true;
    }
    return false;
  }

  // The configs of the preset and random tests that the gtest filter selected.
  static std::vector<MoeConfig> configs_to_run() {
    std::map<std::string, PresetCase> presets;
    for (const auto& list : {scaled_preset_cases(), w8a8_preset_cases(), full_size_preset_cases(), fp8_preset_cases(),
                             fp8_full_size_preset_cases()})
      for (const PresetCase& pc : list) presets[preset_case_name(pc)] = pc;
    std::vector<MoeConfig> configs;
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
      const std::string suite_name = suite.name();
      for (int t = 0; t < suite.total_test_count(); ++t) {
        const ::testing::TestInfo& info = *suite.GetTestInfo(t);
        if (!info.should_run()) continue;
        const std::string name = info.name();  // "Layer/<param>"
        const std::string param = name.substr(name.find('/') + 1);
        if (suite_name == "Draw/RandomConfig") configs.push_back(random_case(std::stoi(param)).config);
        if (suite_name.ends_with("/Presets") && presets.count(param)) configs.push_back(preset_config(presets[param]));
      }
    }
    return configs;
  }

  std::mutex mutex_;
  bool stop_ = false;
  std::deque<MoeConfig> queue_;
  std::vector<std::thread> threads_;
};

[[maybe_unused]] ::testing::Environment* const g_environment = ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

}  // namespace
}  // namespace moejit::test
