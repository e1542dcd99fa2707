// Autotune's CPU side: the candidate tiles it times, the MOEJIT_TILES form it stores, and the
// tuning store a layer reads back (the timing itself needs a GPU: tests/gpu/test_layer.cpp).
#include <gtest/gtest.h>

#include <set>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "compiler/planner.h"
#include "compiler/workspace.h"
#include "compiler/tuning_store.h"

namespace moejit {
namespace {

TEST(TileCandidates, PlannersFirstEveryOneValidAndDistinct) {
  for (const std::string arch : {"sm_90a", "sm_80"})
  for (const auto& name : preset_names()) {
    const MoeConfig c = preset(name);
    for (const TokenBucket& b : plan_buckets(c, arch)) {
      const auto candidates = tile_candidates(c, b, arch);
      ASSERT_FALSE(candidates.empty());
      EXPECT_EQ(describe(candidates[0].first), describe(b.gemm1)) << name << " " << b.name();
      EXPECT_EQ(describe(candidates[0].second), describe(b.gemm2)) << name << " " << b.name();
      EXPECT_GE(candidates.size(), 3u) << name << " " << b.name() << ": too little to choose from";
      std::set<std::string> seen;
      for (const auto& [g1, g2] : candidates) {
        EXPECT_EQ(g1.bm, g2.bm) << "the GEMMs share one tile schedule";
        // 128- and 192-row buckets offer each other's heights (tile_candidates).
        EXPECT_TRUE(g1.bm == b.gemm1.bm || (std::min(g1.bm, b.gemm1.bm) == 128 && std::max(g1.bm, b.gemm1.bm) == 192))
            << describe(g1);
        EXPECT_TRUE(seen.insert(describe(g1) + describe(g2)).second) << "duplicate " << describe(g1);
        if (arch != "sm_90a") EXPECT_NE(g1.kernel, GemmKernel::Wgmma) << "wgmma is sm_90a-only";
        EXPECT_NO_THROW(make_plan(c, arch, {{std::string(b.name()), true, g1}, {std::string(b.name()), false, g2}}))
            << name << " " << b.name() << " " << describe(g1) << " / " << describe(g2);
      }
    }
  }
  MoeConfig fp32 = preset("qwen3-30b-a3b");
  fp32.dtype = fp32.router_dtype = DType::FP32;
  for (const TokenBucket& b : plan_buckets(fp32, "sm_90a"))
    EXPECT_EQ(tile_candidates(fp32, b, "sm_90a").size(), 1u) << b.name();
}

TEST(TileCandidates, OverrideTextRoundTrips) {
  const MoeConfig c = preset("mixtral-8x7b");
  for (const TokenBucket& b : plan_buckets(c, "sm_90a"))
    for (const auto& [g1, g2] : tile_candidates(c, b, "sm_90a"))
      for (const TileOverride& o : {TileOverride{std::string(b.name()), true, g1}, TileOverride{std::string(b.name()), false, g2}}) {
        const auto parsed = parse_tile_overrides(to_string(o));
        ASSERT_EQ(parsed.size(), 1u);
        EXPECT_EQ(parsed[0].bucket, o.bucket);
        EXPECT_EQ(parsed[0].gemm1, o.gemm1);
        EXPECT_EQ(describe(parsed[0].tile), describe(o.tile)) << to_string(o);
      }
  EXPECT_EQ(to_string(TileOverride{"decode", false, {GemmKernel::Simt, 16, 64, 32}}), "decode.gemm2=simt:16x64x32");
}

// A record as autotune publishes it (store_tuning): the chosen tiles in MOEJIT_TILES form as the
// entry's text. Written directly, so a record this planner refuses can be stored too.
void publish_record(DiskCache& disk, const MoeConfig& c, const std::string& device, const std::string& text) {
  CachedBinary record;
  record.arch = "sm_90a";
  record.key = tuning_key(c, "sm_90a", device);
  record.source = text;
  record.meta = {{"kind", "autotune"}};
  disk.remove(record.arch, record.key);
  std::string error;
  ASSERT_TRUE(disk.publish(record, &error)) << error;
}

TEST(Autotune, StoredRecordIsReadBackForItsConfigAndDeviceOnly) {
  DiskCache* disk = global_cache().disk();
  ASSERT_NE(disk, nullptr) << global_cache().warning();
  MoeConfig c = preset("qwen3-30b-a3b");
  const std::string text = "decode.gemm1=tc:16x32x64:s6:w1x4,decode.gemm2=tc:16x64x64:s4:w1x4";
  publish_record(*disk, c, "Test GPU A", text);

  auto tiles = load_tuning(disk, c, "sm_90a", "Test GPU A");
  ASSERT_TRUE(tiles.has_value());
  ASSERT_EQ(tiles->size(), 2u);
  EXPECT_EQ(to_string((*tiles)[0]) + "," + to_string((*tiles)[1]), text);
  EXPECT_FALSE(load_tuning(disk, c, "sm_90a", "Test GPU B").has_value()) << "another device";
  MoeConfig other = c;
  other.hidden = 1024;
  EXPECT_FALSE(load_tuning(disk, other, "sm_90a", "Test GPU A").has_value()) << "another config";
  MoeConfig rank = c;
  rank.ep_size = 2;
  rank.ep_rank = 1;
  MoeConfig rank0 = rank;
  rank0.ep_rank = 0;
  EXPECT_EQ(tuning_key(rank, "sm_90a", "x"), tuning_key(rank0, "sm_90a", "x")) << "ranks share one record";
  // The router GEMM and its bias change no GEMM tile: such layers share the plain layer's record.
  MoeConfig router = c;
  router.router_gemm = true;
  EXPECT_EQ(tuning_key(router, "sm_90a", "x"), tuning_key(c, "sm_90a", "x")) << "router_gemm";
  router.router_bias = true;
  EXPECT_EQ(tuning_key(router, "sm_90a", "x"), tuning_key(c, "sm_90a", "x")) << "router_bias";

  // Re-tuning replaces the record; a record this planner cannot use is ignored.
  publish_record(*disk, c, "Test GPU A", "decode.gemm1=tc:16x16x64:s8:w1x2,decode.gemm2=tc:16x32x64:s8:w1x2");
  ASSERT_TRUE(load_tuning(disk, c, "sm_90a", "Test GPU A").has_value());
  EXPECT_EQ(to_string(load_tuning(disk, c, "sm_90a", "Test GPU A")->at(0)), "decode.gemm1=tc:16x16x64:s8:w1x2");
  publish_record(*disk, c, "Test GPU A", "decode.gemm1=tc:16x16x64:s99:w1x2");
  EXPECT_FALSE(load_tuning(disk, c, "sm_90a", "Test GPU A").has_value());
  EXPECT_TRUE(disk->remove("sm_90a", tuning_key(c, "sm_90a", "Test GPU A")));
  EXPECT_FALSE(load_tuning(nullptr, c, "sm_90a", "Test GPU A").has_value()) << "no disk cache";

  // store_tuning writes what load_tuning reads.
  const std::vector<TileOverride> chosen = parse_tile_overrides(text);
  std::string why;
  ASSERT_TRUE(store_tuning(*disk, c, "sm_90a", "Test GPU C", chosen, nlohmann::json::array(), &why)) << why;
  ASSERT_TRUE(load_tuning(disk, c, "sm_90a", "Test GPU C").has_value());
  EXPECT_EQ(to_string(*load_tuning(disk, c, "sm_90a", "Test GPU C")), text);
  EXPECT_TRUE(disk->remove("sm_90a", tuning_key(c, "sm_90a", "Test GPU C")));
  EXPECT_FALSE(disk->remove("sm_90a", tuning_key(c, "sm_90a", "Test GPU A"))) << "already gone";
}

}  // namespace
}  // namespace moejit
