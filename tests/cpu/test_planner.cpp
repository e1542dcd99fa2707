// Planner and codegen: determinism, buckets, launch rules and the workspace layout.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "compiler/codegen.h"
#include "common/error.h"
#include "compiler/planner.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/workspace.h"

namespace moejit {
namespace {

TEST(Planner, SameConfigGivesByteIdenticalSource) {
  for (const auto& name : preset_names()) {
    KernelSource a = generate(make_plan(preset(name), "sm_90a"));
    KernelSource b = generate(make_plan(preset(name), "sm_90a"));
    ASSERT_EQ(a.units.size(), b.units.size()) << name;
    for (size_t i = 0; i < a.units.size(); ++i) EXPECT_EQ(a.units[i].source, b.units[i].source) << name;
  }
}

TEST(Planner, EveryKernelIsInExactlyOneUnitWithAUniqueName) {
  for (const auto& name : preset_names()) {
    for (Quant q : {Quant::None, Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
      MoeConfig c = preset(name);
      c.quant = q;
      Plan plan = make_plan(c, "sm_90a");
      KernelSource source = generate(plan);
      std::multiset<std::string> entries;
      for (const auto& u : source.units) entries.insert(u.entries.begin(), u.entries.end());
      std::set<std::string> planned;
      for (const auto& k : plan.kernels) planned.insert(k.entry);
      EXPECT_EQ(planned.size(), plan.kernels.size()) << name << ": duplicate kernel names";
      EXPECT_EQ(entries.size(), planned.size()) << name;
      for (const auto& e : planned) EXPECT_EQ(entries.count(e), 1u) << e;
      for (const auto& b : plan.buckets) {
        // Each bucket's kernel indices point at the kernels of its tiles.
        EXPECT_EQ(plan.kernel_of(b, true).entry, gemm_kernel(c, true, b.gemm1).entry);
        EXPECT_EQ(plan.kernel_of(b, false).entry, gemm_kernel(c, false, b.gemm2).entry);
        EXPECT_EQ(plan.kernel_of(b, true).role, KernelRole::Gemm1);
        EXPECT_EQ(plan.kernel_of(b, false).role, KernelRole::Gemm2);
      }
    }
  }
}

TEST(Planner, RankDoesNotChangeTheSource) {
  MoeConfig rank0 = preset("deepseek-v3");
  rank0.ep_size = 8;
  MoeConfig rank5 = rank0;
  rank5.ep_rank = 5;
  KernelSource a = generate(make_plan(rank0, "sm_90a"));
  KernelSource b = generate(make_plan(rank5, "sm_90a"));
  for (size_t i = 0; i < a.units.size(); ++i) EXPECT_EQ(a.units[i].source, b.units[i].source);
}

// router_gemm changes the routing unit (its router GEMM kernels) and no other: a layer with and
// without it shares the cache entries of its index, GEMM and combine units.
TEST(Planner, RouterGemmChangesOnlyTheRoutingUnit) {
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3"}) {
    MoeConfig with = preset(name);
    with.router_gemm = true;
    const KernelSource a = generate(make_plan(preset(name), "sm_90a")), b = generate(make_plan(with, "sm_90a"));
    ASSERT_EQ(a.units.size(), b.units.size()) << name;
    for (size_t i = 0; i < a.units.size(); ++i) {
      ASSERT_EQ(a.units[i].name, b.units[i].name) << name;
      if (a.units[i].name == "routing")
        EXPECT_NE(a.units[i].source, b.units[i].source) << name;
      else
        EXPECT_EQ(a.units[i].source, b.units[i].source) << name << ": unit " << a.units[i].name;
    }
  }
}

// router_bias changes the router GEMM kernels (their spec and entry names, so the two variants are
// two cache entries) and no other unit: the layer with and without the bias shares the rest.
TEST(Planner, RouterBiasChangesOnlyTheRouterKernels) {
  for (const char* arch : {"sm_90a", "sm_80"}) {
    MoeConfig plain = preset("gpt-oss-20b");
    plain.router_gemm = true;
    MoeConfig biased = plain;
    biased.router_bias = true;
    const Plan a_plan = make_plan(plain, arch), b_plan = make_plan(biased, arch);
    const KernelSource a = generate(a_plan), b = generate(b_plan);
    ASSERT_EQ(a.units.size(), b.units.size()) << arch;
    for (size_t i = 0; i < a.units.size(); ++i) {
      ASSERT_EQ(a.units[i].name, b.units[i].name) << arch;
      if (a.units[i].name == "routing") {
        EXPECT_NE(a.units[i].source, b.units[i].source) << arch;
        EXPECT_NE(b.units[i].source.find("//   router_bias = true"), std::string::npos) << arch;
      } else {
        EXPECT_EQ(a.units[i].source, b.units[i].source) << arch << ": unit " << a.units[i].name;
      }
    }
    ASSERT_EQ(a_plan.kernels.size(), b_plan.kernels.size());
    int router_kernels = 0;
    for (size_t i = 0; i < a_plan.kernels.size(); ++i) {
      const KernelPlan &x = a_plan.kernels[i], &y = b_plan.kernels[i];
      if (x.role != KernelRole::RouterGemm) {
        EXPECT_EQ(x.entry, y.entry);
        continue;
      }
      ++router_kernels;
      EXPECT_NE(x.entry.find("_bf16_bf16"), std::string::npos) << x.entry;
      EXPECT_EQ(x.entry.find("_bias"), std::string::npos) << x.entry;
      EXPECT_NE(y.entry.find("_bf16_bf16_bias"), std::string::npos) << y.entry;
      EXPECT_EQ(x.spec.back().name, "kBias");
      EXPECT_EQ(x.spec.back().value, "false");
      EXPECT_EQ(y.spec.back().value, "true");
    }
    EXPECT_GE(router_kernels, 2) << arch << ": a decode kernel and tensor-core tiles";
  }
}

TEST(Planner, AnyChangedFieldChangesSomeUnit) {
  MoeConfig base = preset("qwen3-30b-a3b");
  auto sources = [](const MoeConfig& c) {
    std::string all;
    for (const auto& u : generate(make_plan(c, "sm_90a")).units) all += u.source;
    return all;
  };
  const std::string reference = sources(base);
  std::vector<std::pair<std::string, std::string>> changes = {
      {"experts", "64"}, {"topk", "4"}, {"scoring", "sigmoid"}, {"renormalize", "false"},
      {"routed_scaling_factor", "2"}, {"hidden", "1024"}, {"moe_intermediate", "512"},
      {"activation", "gelu"}, {"gated", "false"}, {"dtype", "fp16"}, {"router_dtype", "fp32"},
      {"quant", "w8a8_int8"}, {"ep_size", "2"}, {"tp_size", "2"}, {"weight_layout", "kn"}, {"router_gemm", "true"}};
  for (const auto& [field, value] : changes) {
    MoeConfig c = base;
    set_field(c, field, value);
    if (field == "dtype") c.router_dtype = c.dtype;
    EXPECT_NE(sources(c), reference) << field;
  }
}

TEST(Planner, BucketsCoverEveryTokenCountInOrder) {
  for (const std::string arch : {"sm_90a", "sm_80"})
    for (const auto& name : preset_names()) {
      const Plan plan = make_plan(preset(name), arch);
      ASSERT_GE(plan.buckets.size(), 3u);
      EXPECT_LE(plan.buckets.size(), 5u);
      int64_t next = 1;
      std::set<std::string> names;
      for (const auto& b : plan.buckets) {
        EXPECT_EQ(b.min_tokens, next) << name << " " << b.name();
        EXPECT_GE(b.max_tokens, b.min_tokens) << name << " " << b.name();
        EXPECT_TRUE(b.tuned_tokens >= b.min_tokens && b.tuned_tokens <= b.max_tokens) << name << " " << b.name();
        EXPECT_TRUE(names.insert(std::string(b.name())).second) << name << " " << b.name();
        next = b.max_tokens == std::numeric_limits<int64_t>::max() ? -1 : b.max_tokens + 1;
      }
      EXPECT_EQ(next, -1) << name << ": the last bucket is open-ended";
      EXPECT_EQ(plan.bucket_for(32).name(), "decode");
      EXPECT_EQ(plan.bucket_for(33).name(), "mid");
      EXPECT_EQ(plan.bucket_for(arch == "sm_80" ? 512 : 255).name(), "mid") << name;
      EXPECT_EQ(plan.bucket_for(int64_t{1} << 40).name(), "prefill");
    }
  Plan plan = make_plan(preset("mixtral-8x7b"), "sm_90a");
  ASSERT_EQ(plan.buckets.size(), 5u);
  EXPECT_EQ(plan.bucket_for(1).name(), "decode");
  EXPECT_EQ(plan.bucket_for(32).name(), "decode");
  EXPECT_EQ(plan.bucket_for(33).name(), "mid");
  EXPECT_EQ(plan.bucket_for(255).name(), "mid");  // 63.75 rows an expert: one 64-row tile
  EXPECT_EQ(plan.bucket_for(256).name(), "short");
  EXPECT_EQ(plan.bucket_for(489).name(), "short");
  EXPECT_EQ(plan.bucket_for(490).name(), "wide");
  EXPECT_EQ(plan.bucket_for(664).name(), "wide");
  EXPECT_EQ(plan.bucket_for(665).name(), "prefill");
  EXPECT_EQ(plan.bucket_for(int64_t{1} << 40).name(), "prefill");
  EXPECT_EQ(make_plan(preset("mixtral-8x7b"), "sm_80").buckets.size(), 3u);  // 192-row tiles are wgmma's
  EXPECT_EQ(make_plan(preset("mixtral-8x7b"), "sm_80").bucket_for(512).name(), "mid");
  for (const auto& b : plan.buckets) {
    EXPECT_EQ(b.gemm1.bm, b.gemm2.bm) << "one tile schedule serves both GEMMs";
    EXPECT_EQ(b.gemm1.bm % 16, 0);
    EXPECT_EQ(b.gemm1.bn % 16, 0);
    EXPECT_EQ(b.gemm2.bn % 16, 0);
  }
  // Mixtral's 8 experts see many rows each: prefill takes the tallest tile.
  EXPECT_EQ(plan.bucket_for(4096).gemm1.bm, 128);
  EXPECT_EQ(plan.bucket_for(1).gemm1.bm, 16);
}

TEST(Planner, MaxRowTilesBoundsEveryRouting) {
  MoeConfig c = preset("qwen3-30b-a3b");
  // Worst case for tiles: every expert gets a partial tile.
  const int64_t tokens = 1000;
  const int bm = 16;
  int64_t worst = 0;
  const int64_t pairs = tokens * c.topk;
  for (int e = 0; e < c.local_experts(); ++e) {
    int64_t count = pairs / c.local_experts() + (e < pairs % c.local_experts() ? 1 : 0);
    worst += (count + bm - 1) / bm;
  }
  EXPECT_LE(worst, max_row_tiles(c, tokens, bm));
}

TEST(Planner, TensorCoreGemmsWhereTheyApplySimtElsewhere) {
  auto kinds = [](const MoeConfig& c, const std::string& arch = "sm_80") {
    std::set<GemmKernel> k;
    for (const auto& b : plan_buckets(c, arch)) k.insert({b.gemm1.kernel, b.gemm2.kernel});
    return k;
  };
  for (const auto& name : preset_names()) {
    EXPECT_EQ(kinds(preset(name)), std::set{GemmKernel::TensorCore}) << name;
    // On Hopper the 64-, 128- and 192-row tiles (prefill, and mid where experts see many rows) take
    // warpgroup MMA, the rest mma.sync.
    EXPECT_EQ(kinds(preset(name), "sm_90a"), (std::set{GemmKernel::TensorCore, GemmKernel::Wgmma})) << name;
    const TokenBucket prefill = plan_buckets(preset(name), "sm_90a").back();
    EXPECT_EQ(prefill.gemm1.kernel, GemmKernel::Wgmma) << name;
    EXPECT_EQ(prefill.gemm2.kernel, GemmKernel::Wgmma) << name;
  }
  MoeConfig c = preset("qwen3-30b-a3b");
  c.dtype = DType::FP16;
  EXPECT_EQ(kinds(c), std::set{GemmKernel::TensorCore});
  for (auto change : std::vector<std::function<void(MoeConfig&)>>{
           [](MoeConfig& x) { x.dtype = DType::FP32; },
           [](MoeConfig& x) { x.weight_layout = WeightLayout::KN; },
           [](MoeConfig& x) { x.hidden = 2052; },
           [](MoeConfig& x) { x.moe_intermediate = 772; }}) {
    MoeConfig d = preset("qwen3-30b-a3b");
    change(d);
    EXPECT_EQ(kinds(d), std::set{GemmKernel::Simt}) << describe(d);
    EXPECT_EQ(kinds(d, "sm_90a"), std::set{GemmKernel::Simt}) << describe(d);
  }
}

// 8-bit weights: wgmma in every bucket on sm_90a (row tiles of 64 at least), mma.sync elsewhere
// where the arch has the instruction (int8 from sm_80, e4m3 from sm_89), SIMT for fp8 on sm_80 and
// when rows do not split into 16-byte chunks.
TEST(Planner, EightBitWeightsTakeWgmmaOnHopperMmaSyncElsewhere) {
  for (Quant q : {Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    for (const auto& name : preset_names()) {
      MoeConfig c = preset(name);
      c.quant = q;
      SCOPED_TRACE(describe(c));
      for (const auto& b : plan_buckets(c, "sm_90a")) {
        for (const TileShape* t : {&b.gemm1, &b.gemm2}) {
          EXPECT_EQ(t->kernel, GemmKernel::Wgmma);
          EXPECT_GE(t->bm, 64);
          EXPECT_EQ(t->bk, 128) << "a k-tile of 128 bytes holds 128 8-bit elements";
          const int weight_rows = (t == &b.gemm1 && c.gated ? 2 : 1) * t->bn;
          if (q == Quant::Fp8Block) EXPECT_LE(weight_rows, 256);
          EXPECT_EQ(tile_problem(c, t == &b.gemm1, *t, "sm_90a"), "");
        }
      }
      for (const char* arch : {"sm_80", "sm_89"}) {
        const bool mma = q == Quant::W8A8Int8 || std::string(arch) == "sm_89";
        for (const auto& b : plan_buckets(c, arch)) {
          for (const TileShape* t : {&b.gemm1, &b.gemm2}) {
            EXPECT_EQ(t->kernel, mma ? GemmKernel::TensorCore : GemmKernel::Simt) << arch;
            EXPECT_EQ(tile_problem(c, t == &b.gemm1, *t, arch), "") << arch << " " << describe(*t);
          }
        }
      }
    }
    MoeConfig odd = preset("qwen3-30b-a3b");
    odd.quant = q;
    odd.hidden = 2056;  // a multiple of 8 (16-bit chunks) but not of 16
    for (const auto& b : plan_buckets(odd, "sm_90a")) EXPECT_EQ(b.gemm1.kernel, GemmKernel::Simt);
  }
  // Tile requests the 8-bit kernels cannot run are refused with the reason.
  MoeConfig c = preset("deepseek-v3");
  c.quant = Quant::Fp8Block;
  EXPECT_EQ(tile_problem(c, false, wgmma_tile(c, 128, 256, 4), "sm_90a"), "") << "two passes of 128 weight rows";
  EXPECT_NE(tile_problem(c, false, wgmma_tile(c, 192, 128, 4), "sm_90a").find("BM 64 or 128 with fp8_block"),
            std::string::npos);
  EXPECT_NE(tile_problem(c, false, wgmma_tile(c, 128, 128, 4), "sm_80").find("sm_90a"), std::string::npos);
  // mma.sync on 8-bit operands (reachable through tile overrides): int8 from sm_80, e4m3 from sm_89;
  // fp8_block at most 64 accumulators per thread (a running sum beside them).
  TileShape mma{GemmKernel::TensorCore, 64, 64, 128, 2, 2, 4};
  EXPECT_EQ(tile_problem(c, false, mma, "sm_90a"), "");
  EXPECT_EQ(tile_problem(c, false, mma, "sm_89"), "");
  EXPECT_NE(tile_problem(c, false, mma, "sm_80").find("sm_89 or later (the arch is sm_80)"), std::string::npos);
  EXPECT_NE(tile_problem(c, false, TileShape{GemmKernel::TensorCore, 128, 256, 128, 2, 4, 3}, "sm_90a")
                .find("at most 64 accumulators"),
            std::string::npos);
  MoeConfig int8 = c;
  int8.quant = Quant::W8A8Int8;
  EXPECT_EQ(tile_problem(int8, false, TileShape{GemmKernel::TensorCore, 128, 256, 128, 2, 4, 3}, "sm_80"), "");
  EXPECT_NE(tile_problem(int8, false, TileShape{GemmKernel::TensorCore, 64, 64, 64, 2, 2, 4}, "sm_80").find("BK = 128"),
            std::string::npos);
  TileShape shallow = wgmma_tile(c, 128, 128, 4);
  shallow.bk = 64;
  EXPECT_NE(tile_problem(c, false, shallow, "sm_90a").find("BK = 128"), std::string::npos);
}

TEST(Planner, TileOverridesReplaceThePlannersTiles) {
  const MoeConfig c = preset("mixtral-8x7b");
  Plan plan = make_plan(c, "sm_90a",
                        parse_tile_overrides("prefill.gemm1=tc:128x64x64:s4:w2x4, prefill.gemm2=tc:128x128x64:s2:w2x2,"
                                             "decode.gemm2=simt:16x64x32"));
  const TokenBucket& prefill = plan.bucket_for(4096);
  EXPECT_EQ(describe(prefill.gemm1), "128x64x64 (tensor-core, 4 stages, 2x4 warps)");
  EXPECT_EQ(describe(prefill.gemm2), "128x128x64 (tensor-core, 2 stages, 2x2 warps)");
  EXPECT_EQ(describe(plan.bucket_for(1).gemm2), "16x64x32 (simt)");
  EXPECT_NO_THROW(plan.kernel_of(prefill, false));
  EXPECT_EQ(plan.kernel_of(prefill, false).launch.threads, 128);
  EXPECT_EQ(plan.kernel_of(prefill, false).launch.shared_bytes, 2 * (128 + 128) * 128 + 128 * 8);
  // The workspace is sized for the shortest row tile any override may ask for (16).
  EXPECT_GE(workspace_offsets(c, 100).total_bytes - workspace_offsets(c, 100).tile_expert,
            max_row_tiles(c, 100, 16) * 4);
}

TEST(Planner, BadTileOverridesAreRefusedWithTheReason) {
  const MoeConfig c = preset("qwen3-30b-a3b");
  MoeConfig fp32 = c;
  fp32.dtype = DType::FP32;
  fp32.router_dtype = DType::FP32;
  struct Case {
    MoeConfig config;
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {c, "prefill.gemm1", "malformed"},
      {c, "prefill.gemm3=tc:128x64x64:s3:w2x4", "names no GEMM"},
      {c, "prefill.gemm1=tc:128x64:s3:w2x4", "needs BMxBNxBK"},
      {c, "prefill.gemm1=wgmma:128x64x64", "names no kernel form"},
      {c, "prefill.gemm1=tc:128xAx64:s3:w2x4", "malformed number"},
      {c, "huge.gemm1=tc:128x64x64:s3:w2x4", "names no bucket"},
      {c, "prefill.gemm1=tc:64x64x64:s3:w2x4", "must be equal"},
      {c, "prefill.gemm1=tc:128x64x32:s3:w2x4", "BK = 64"},
      {c, "prefill.gemm1=tc:128x128x64:s6:w2x4", "227 KiB"},
      {c, "prefill.gemm2=tc:128x40x64:s3:w2x4", "multiple of 16 * warps_n"},
      {c, "decode.gemm1=tc:8x32x64:s3:w1x2", "BM >= 16"},
      {fp32, "prefill.gemm1=tc:128x64x64:s3:w2x4", "tensor cores"},
      {c, "prefill.gemm1=simt:128x64x64", "48 KiB"},
      {c, "prefill.gemm1=wg:128x128x64", "names no kernel form"},
      {c, "prefill.gemm1=wg:32x64x64:s4", "BM 64, 128 or 192"},
      {c, "prefill.gemm1=wg:128x80x64:s4", "64, 128, 192 or 256"},
      {c, "prefill.gemm1=wg:192x128x64:s4", "at most 192 at BM 192"},
      {c, "prefill.gemm1=wg:128x128x64:s1", "at least 2 stages"},
      {c, "prefill.gemm2=wg:128x256x64:s5", "227 KiB"},
      {fp32, "prefill.gemm1=wg:128x128x64:s4", "tensor cores"},
  };
  for (const auto& k : cases) {
    try {
      make_plan(k.config, "sm_90a", parse_tile_overrides(k.text));
      ADD_FAILURE() << k.text << " was accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(k.message), std::string::npos) << k.text << ": " << e.what();
    }
  }
  // wgmma is sm_90a's alone.
  EXPECT_THROW(
      {
        try {
          make_plan(c, "sm_80", parse_tile_overrides("prefill.gemm1=wg:128x128x64:s4"));
        } catch (const InvalidInput& e) {
          EXPECT_NE(std::string(e.what()).find("needs arch sm_90a (the arch is sm_80)"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidInput);
}

// On sm_90a with 16-bit weights the mid bucket (its tile bm rows high) ends before the T whose mean
// rows an expert, r = T*K/E_loc, reach bm, within [33, 512]; the prefill range's buckets start there
// (bench/RESULTS.md, session 20: past it each expert's second mid tile streams its weights again).
TEST(Planner, MidBucketEndsWhereTheMeanRowsFillItsTile) {
  for (const auto& name : preset_names())
    for (int ep_size : {1, 2, 8}) {
      MoeConfig c = preset(name);
      if (c.experts % ep_size != 0) continue;
      c.ep_size = ep_size;
      const Plan plan = make_plan(c, "sm_90a");
      const TokenBucket& mid = plan.bucket_for(33);
      ASSERT_EQ(mid.name(), "mid");
      const int bm = mid.gemm1.bm;
      auto rows = [&](int64_t t) { return static_cast<double>(t) * c.topk / c.local_experts(); };
      EXPECT_TRUE(mid.max_tokens == 33 || rows(mid.max_tokens) < bm) << name << " ep " << ep_size;
      EXPECT_TRUE(mid.max_tokens == 512 || rows(mid.max_tokens + 1) >= bm) << name << " ep " << ep_size;
      EXPECT_LE(mid.max_tokens, 512);
      EXPECT_NE(plan.bucket_for(mid.max_tokens + 1).name(), "mid");
    }
  // The measured points: Qwen3-30B-A3B leaves its 16-row tiles at T=256 (r = 16), DeepSeek-V3 at 512,
  // Mixtral its 64-row wgmma tiles at 256; Kimi-K2 and Qwen3-Next keep 16 rows through 512.
  EXPECT_EQ(make_plan(preset("qwen3-30b-a3b"), "sm_90a").bucket_for(33).max_tokens, 255);
  EXPECT_EQ(make_plan(preset("deepseek-v3"), "sm_90a").bucket_for(33).max_tokens, 511);
  EXPECT_EQ(make_plan(preset("mixtral-8x7b"), "sm_90a").bucket_for(33).max_tokens, 255);
  EXPECT_EQ(make_plan(preset("kimi-k2"), "sm_90a").bucket_for(33).max_tokens, 512);
  EXPECT_EQ(make_plan(preset("qwen3-next-80b-a3b"), "sm_90a").bucket_for(33).max_tokens, 512);
  // 8-bit weights keep the mid bucket at 33..512 (their tiles were not measured against this rule).
  MoeConfig fp8 = preset("qwen3-30b-a3b");
  fp8.quant = Quant::Fp8Block;
  EXPECT_EQ(make_plan(fp8, "sm_90a").bucket_for(33).max_tokens, 512);
}

// The decode bucket's GEMM 2 takes the mid bucket's 64-row mma.sync tile (and so its kernel) where its
// whole K fits in the 8-stage decode pipeline (16-bit, I_loc <= 512: bench/RESULTS.md, session 20);
// GEMM 1 and longer Ks keep the narrow 32-row, 8-stage tile.
TEST(Planner, DecodeGemm2WidensWhereItsKFitsThePipeline) {
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    const Plan next = make_plan(preset("qwen3-next-80b-a3b"), arch);  // I = 512
    EXPECT_EQ(describe(next.bucket_for(1).gemm2), "16x64x64 (tensor-core, 6 stages, 1x4 warps)") << arch;
    EXPECT_EQ(next.kernel_of(next.bucket_for(1), false).entry, next.kernel_of(next.bucket_for(33), false).entry);
    EXPECT_EQ(describe(next.bucket_for(1).gemm1), "16x16x64 (tensor-core, 8 stages, 1x2 warps)") << arch;
    const Plan qwen3 = make_plan(preset("qwen3-30b-a3b"), arch);  // I = 768
    EXPECT_EQ(describe(qwen3.bucket_for(1).gemm2), "16x32x64 (tensor-core, 8 stages, 1x2 warps)") << arch;
    MoeConfig split = preset("qwen3-30b-a3b");
    split.tp_size = 2;  // I_loc = 384
    EXPECT_EQ(describe(make_plan(split, arch).bucket_for(1).gemm2), "16x64x64 (tensor-core, 6 stages, 1x4 warps)")
        << arch;
  }
}

// On sm_90a the T past the mid bucket where about 30% of the experts pass 128 rows (r + 0.5 sqrt r
// > 128, r = T*K/E_loc) and nearly all stay within 192 (r + 2 sqrt r <= 192) form the "wide" bucket, with
// 192-row tiles; the rest of the prefill range keeps the 128-row ones.
TEST(Planner, WideBucketHoldsTheRowBand) {
  for (const auto& name : preset_names())
    for (int ep_size : {1, 2}) {
      MoeConfig c = preset(name);
      c.ep_size = ep_size;
      const Plan plan = make_plan(c, "sm_90a");
      for (int64_t T = plan.bucket_for(33).max_tokens + 1; T <= 20000; T += 7) {
        const double r = static_cast<double>(T) * c.topk / c.local_experts();
        const bool band = r + 0.5 * std::sqrt(r) > 128 && r + 2 * std::sqrt(r) <= 192;
        const TokenBucket& b = plan.bucket_for(T);
        EXPECT_EQ(b.name() == "wide", band) << name << " ep " << ep_size << " T=" << T;
        EXPECT_EQ(b.gemm1.bm, band ? 192 : 128) << name << " ep " << ep_size << " T=" << T;
      }
    }
  const Plan deepseek = make_plan(preset("deepseek-v3"), "sm_90a");  // T=4096: 128 rows per expert
  ASSERT_EQ(deepseek.buckets.size(), 5u);
  EXPECT_EQ(deepseek.buckets[2].name(), "short");
  EXPECT_EQ(deepseek.buckets[2].max_tokens, 3918);
  const TokenBucket& wide = deepseek.bucket_for(4096);
  EXPECT_EQ(wide.name(), "wide");
  EXPECT_EQ(wide.kind, BucketKind::Wide);
  EXPECT_EQ(wide.min_tokens, 3919);
  EXPECT_EQ(wide.max_tokens, 5318);
  EXPECT_EQ(wide.tuned_tokens, 4096);
  EXPECT_EQ(describe(wide.gemm1), "192x96x64 (wgmma, 4 stages)");
  EXPECT_EQ(describe(wide.gemm2), "192x192x64 (wgmma, 4 stages)");
  EXPECT_EQ(describe(deepseek.bucket_for(3918).gemm2), "128x256x64 (wgmma, 4 stages)");
  EXPECT_EQ(describe(deepseek.bucket_for(5319).gemm2), "128x256x64 (wgmma, 4 stages)");
  const KernelPlan& g1 = deepseek.kernel_of(wide, true);
  EXPECT_EQ(g1.launch.threads, 512);  // three consumer warpgroups and the producer
  EXPECT_EQ(g1.launch.shared_bytes, 4 * (192 + 192) * 128 + 192 * 8 + 4 * 16 + 1024);
  MoeConfig gelu = preset("deepseek-v3");
  gelu.gated = false;
  EXPECT_EQ(describe(make_plan(gelu, "sm_90a").bucket_for(4096).gemm1), "192x192x64 (wgmma, 4 stages)");
  for (const auto& b : make_plan(preset("deepseek-v3"), "sm_80").buckets) EXPECT_NE(b.gemm1.bm, 192);  // mma.sync
  // Overrides name any of the plan's buckets; an unknown one is refused with the list.
  EXPECT_NO_THROW(make_plan(preset("deepseek-v3"), "sm_90a",
                            parse_tile_overrides("wide.gemm1=wg:128x128x64:s4,wide.gemm2=wg:128x256x64:s4")));
  try {
    make_plan(preset("qwen3-30b-a3b"), "sm_80", parse_tile_overrides("wide.gemm1=tc:128x64x64:s3:w2x4"));
    ADD_FAILURE() << "a bucket sm_80's plan does not have was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: decode, mid, prefill"), std::string::npos) << e.what();
  }
}

TEST(Planner, WgmmaTilesKeepTheirShapeInTheKernelPlan) {
  const MoeConfig c = preset("mixtral-8x7b");
  Plan plan = make_plan(c, "sm_90a", parse_tile_overrides("mid.gemm1=wg:64x64x64:s6, mid.gemm2=wg:64x128x64:s3"));
  const TokenBucket& mid = plan.bucket_for(192);
  EXPECT_EQ(describe(mid.gemm1), "64x64x64 (wgmma, 6 stages)");
  const KernelPlan& g1 = plan.kernel_of(mid, true);
  EXPECT_EQ(g1.device_function, "moejit::grouped_gemm_wgmma");
  EXPECT_EQ(g1.launch.threads, 256);  // a consumer warpgroup per 64 rows, one producer warpgroup
  EXPECT_EQ(g1.launch.per_block, 64);
  EXPECT_EQ(g1.launch.shared_bytes, 6 * (64 + 128) * 128 + 64 * 8 + 6 * 16 + 1024);
  const KernelPlan& prefill_g2 = plan.kernel_of(plan.bucket_for(4096), false);
  EXPECT_EQ(prefill_g2.launch.threads, 384);
  EXPECT_EQ(prefill_g2.launch.shared_bytes, 4 * (128 + 256) * 128 + 128 * 8 + 4 * 16 + 1024);
}

TEST(Workspace, IsAPureFunctionWithAlignedDisjointBuffers) {
  for (const auto& name : preset_names()) {
    for (Quant q : {Quant::None, Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
      MoeConfig c = preset(name);
      c.quant = q;
      WorkspaceLayout a = plan_workspace(c, 4097);
      WorkspaceLayout b = plan_workspace(c, 4097);
      ASSERT_EQ(a.total_bytes, b.total_bytes);
      int64_t end = 0;
      for (const auto& buf : a.buffers) {
        EXPECT_EQ(buf.offset % 256, 0) << buf.name;
        EXPECT_GE(buf.offset, end) << buf.name << " overlaps the previous buffer";
        end = buf.offset + buf.bytes;
      }
      EXPECT_LE(end, a.total_bytes);
    }
  }
}

TEST(Workspace, SizesUse64BitArithmetic) {
  MoeConfig c = preset("deepseek-v3");
  WorkspaceLayout ws = plan_workspace(c, 65536);
  // Y alone is 65536 * 8 * 7168 bf16 elements = 7.5 GB: past 2^31.
  EXPECT_EQ(ws.at("y").bytes, int64_t{65536} * 8 * 7168 * 2);
  EXPECT_GT(ws.total_bytes, int64_t{1} << 33);
}

TEST(Workspace, ZeroTokensIsValidAndNegativeIsRefused) {
  MoeConfig c = preset("mixtral-8x7b");
  EXPECT_NO_THROW(plan_workspace(c, 0));
  EXPECT_THROW(plan_workspace(c, -1), InvalidInput);
}

TEST(Planner, InvalidConfigIsRefusedBeforePlanning) {
  MoeConfig c = preset("deepseek-v3");
  c.topk_group = 9;
  EXPECT_THROW(make_plan(c, "sm_90a"), InvalidInput);
}

}  // namespace
}  // namespace moejit
