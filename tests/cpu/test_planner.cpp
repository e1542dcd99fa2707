// Planner and codegen: determinism, buckets, launch rules and the workspace layout.
#include <gtest/gtest.h>

#include <set>

#include "compiler/codegen.h"
#include "compiler/error.h"
#include "compiler/plan.h"

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
    for (Quant q : {Quant::None, Quant::W8A8Int8}) {
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
        EXPECT_EQ(planned.count(b.gemm1_entry), 1u);
        EXPECT_EQ(planned.count(b.gemm2_entry), 1u);
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
      {"quant", "w8a8_int8"}, {"ep_size", "2"}, {"tp_size", "2"}, {"weight_layout", "kn"}};
  for (const auto& [field, value] : changes) {
    MoeConfig c = base;
    set_field(c, field, value);
    if (field == "dtype") c.router_dtype = c.dtype;
    EXPECT_NE(sources(c), reference) << field;
  }
}

TEST(Planner, BucketsCoverEveryTokenCountInOrder) {
  Plan plan = make_plan(preset("mixtral-8x7b"), "sm_90a");
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.bucket_for(1).name, "decode");
  EXPECT_EQ(plan.bucket_for(32).name, "decode");
  EXPECT_EQ(plan.bucket_for(33).name, "mid");
  EXPECT_EQ(plan.bucket_for(512).name, "mid");
  EXPECT_EQ(plan.bucket_for(513).name, "prefill");
  EXPECT_EQ(plan.bucket_for(int64_t{1} << 40).name, "prefill");
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

TEST(Workspace, IsAPureFunctionWithAlignedDisjointBuffers) {
  for (const auto& name : preset_names()) {
    for (Quant q : {Quant::None, Quant::W8A8Int8}) {
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
