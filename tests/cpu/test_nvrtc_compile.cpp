// Real NVRTC (no GPU needed): every preset's every unit compiles to CUBIN for sm_80 and sm_90a,
// the CUBIN holds each planned entry point, and the ptxas report shows no local memory (no stack
// frame, no spills) and no wgmma pipeline advisory; so do the GEMMs of every tile autotune may pick.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include <fmt/format.h>

#include "compiler/codegen.h"
#include "common/knobs.h"
#include "compiler/families/exchange.h"
#include "compiler/layer_compiler.h"
#include "compiler/nvrtc_compiler.h"
#include "compiler/planner.h"
#include "compiler/tiles.h"
#include "compiler/workspace.h"

namespace moejit {
namespace {

struct Case {
  std::string preset;
  std::string arch;
  Quant quant = Quant::None;
  bool fuse_shared = false;  // the preset's shared experts computed in the layer
  bool router_gemm = false;  // the router GEMM computed in the layer
  bool router_bias = false;  // with its bias (gpt-oss)
};

// ptxas -v reports "N bytes stack frame, N bytes spill stores": no kernel may use local memory (a
// spilled or run-time-indexed register array), which costs far more than it looks. ptxas's C751x
// advisories say it serialized wgmma or injected waits because it could not keep the accumulators
// in place across the asynchronous MMAs: the pipeline would be gone.
void expect_lean_kernels(const CompiledUnit& compiled) {
  const std::regex local_memory(R"(([1-9][0-9]*) bytes (spill stores|stack frame))");
  EXPECT_FALSE(std::regex_search(compiled.log, local_memory)) << compiled.log;
  EXPECT_EQ(compiled.log.find("C751"), std::string::npos) << compiled.log;
  EXPECT_EQ(compiled.log.find("serialized"), std::string::npos) << compiled.log;
}

// The units of the grouped GEMMs (one for GEMM 1's kernels, one for GEMM 2's).
bool is_gemm_unit(const GeneratedUnit& unit) { return unit.name == "gemm1" || unit.name == "gemm2"; }

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name = info.param.preset + "_" + info.param.arch;
  if (info.param.quant != Quant::None) name += "_" + std::string(to_string(info.param.quant));
  if (info.param.fuse_shared) name += "_fused_shared";
  if (info.param.router_gemm) name += "_router_gemm";
  if (info.param.router_bias) name += "_bias";
  for (char& c : name)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& preset : preset_names())
    for (const char* arch : {"sm_80", "sm_90a"}) out.push_back({preset, arch});
  // The quantized layers change the expand, both GEMMs (wgmma on 8-bit operands on sm_90a, mma.sync
  // for int8 from sm_80 and fp8 from sm_89, SIMT for fp8 on sm_80) and add the re-quantization.
  for (Quant q : {Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    for (const char* preset : {"qwen3-30b-a3b", "deepseek-v3"}) out.push_back({preset, "sm_90a", q});
    out.push_back({"mixtral-8x7b", "sm_80", q});
    out.push_back({"glm-4.5-air", "sm_89", q});
  }
  // Fused shared experts change the index (K + S slots a token), the gathers, the combine and the
  // expert count of the GEMMs: one shared expert on both GEMM paths, two (DeepSeek-V2-Lite) with
  // int8's per-expert smoothing of the gathered rows.
  out.push_back({"deepseek-v3", "sm_90a", Quant::None, true});
  out.push_back({"deepseek-v2-lite", "sm_80", Quant::None, true});
  out.push_back({"deepseek-v2-lite", "sm_90a", Quant::W8A8Int8, true});
  out.push_back({"glm-4.5-air", "sm_90a", Quant::Fp8Block, true});
  // The router GEMM: bf16 in, fp32 logits (DeepSeek-V3), bf16 logits (Mixtral), fp16 with int8
  // experts (Qwen3's 128 experts: one expert a block).
  out.push_back({"deepseek-v3", "sm_90a", Quant::None, false, true});
  out.push_back({"mixtral-8x7b", "sm_80", Quant::None, false, true});
  out.push_back({"qwen3-30b-a3b", "sm_90a", Quant::W8A8Int8, false, true});
  // gpt-oss's router with its bias: the decode kernel and the tensor-core tiles on both archs.
  out.push_back({"gpt-oss-20b", "sm_90a", Quant::None, false, true, true});
  out.push_back({"gpt-oss-120b", "sm_80", Quant::None, false, true, true});
  return out;
}

class EveryPreset : public testing::TestWithParam<Case> {};

TEST_P(EveryPreset, EveryUnitCompilesToCubinWithItsEntryPoints) {
  MoeConfig config = preset(GetParam().preset);
  config.quant = GetParam().quant;
  config.fuse_shared_experts = GetParam().fuse_shared;
  config.router_gemm = GetParam().router_gemm;
  config.router_bias = GetParam().router_bias;
  Plan plan = make_plan(config, GetParam().arch);
  KernelSource source = generate(plan);
  CompileOptions options = compile_options_for(GetParam().arch);
  options.repro_dir.clear();

  std::vector<Stage> covered;
  for (const auto& unit : source.units) {
    SCOPED_TRACE(unit.name);
    CompiledUnit compiled;
    ASSERT_NO_THROW(compiled = compile_unit(unit, options));
    // A CUBIN is an ELF file; every extern "C" entry appears by name in its symbol table.
    ASSERT_GE(compiled.cubin.size(), 4u);
    EXPECT_EQ(compiled.cubin.substr(0, 4), "\x7f" "ELF");
    for (const auto& entry : unit.entries) EXPECT_NE(compiled.cubin.find(entry), std::string::npos) << entry;
    expect_lean_kernels(compiled);
    covered.insert(covered.end(), unit.stages.begin(), unit.stages.end());
  }
  for (Stage s : {Stage::Routing, Stage::Index, Stage::Gemm1, Stage::Gemm2, Stage::Combine})
    EXPECT_NE(std::find(covered.begin(), covered.end(), s), covered.end()) << to_string(s);
  if (GetParam().quant != Quant::None)
    EXPECT_NE(std::find(covered.begin(), covered.end(), Stage::Expand), covered.end());
}

INSTANTIATE_TEST_SUITE_P(Nvrtc, EveryPreset, testing::ValuesIn(cases()), case_name);

// A layer with more top-k slots than experts (a rank holding fewer experts than a token's pairs)
// serves experts-only calls: every unit still compiles lean for it (its routing kernels too, which
// the runtime never launches for it: check_routable refuses route and forward).
TEST(Nvrtc, TopkAboveExpertsCompiles) {
  MoeConfig c = preset("qwen3-30b-a3b");
  c.experts = 3;
  c.topk = 8;
  c.hidden = 520;
  c.moe_intermediate = 264;
  ASSERT_TRUE(validation_errors(c).empty());
  ASSERT_FALSE(routing_errors(c).empty());
  CompileOptions options = compile_options_for("sm_90a");
  options.repro_dir.clear();
  for (const auto& unit : generate(make_plan(c, "sm_90a")).units) {
    SCOPED_TRACE(unit.name);
    CompiledUnit compiled;
    ASSERT_NO_THROW(compiled = compile_unit(unit, options));
    expect_lean_kernels(compiled);
  }
}

// The all_to_all exchange's unit (compiler/families/exchange.h) compiles lean with its entry points:
// every dtype, 16-byte and element rows (H odd), one rank to a group wider than a block's threads (a
// rank per expert: DeepSeek-V3 at ep_size 256), fp8 layers' quantized rows (the unit then holds
// the layer's stage-3 kernel too), on both archs.
TEST(Nvrtc, ExchangeUnitCompilesLean) {
  struct Shape {
    const char* preset;
    DType dtype;
    int64_t hidden;
    int ep_size;
    Quant quant = Quant::None;
  };
  for (const Shape& s : {Shape{"deepseek-v3", DType::BF16, 7168, 8}, Shape{"qwen3-30b-a3b", DType::FP16, 2049, 1},
                         Shape{"mixtral-8x7b", DType::FP32, 4096, 2}, Shape{"deepseek-v3", DType::BF16, 7168, 256},
                         Shape{"deepseek-v3", DType::BF16, 7168, 8, Quant::Fp8Block},
                         Shape{"qwen3-30b-a3b", DType::BF16, 2048, 4, Quant::Fp8Tensor}})
    for (const char* arch : {"sm_80", "sm_90a"}) {
      SCOPED_TRACE(fmt::format("{} {} H={} ep_size={} {} {}", s.preset, to_string(s.dtype), s.hidden, s.ep_size,
                               to_string(s.quant), arch));
      MoeConfig c = preset(s.preset);
      c.dtype = s.dtype;
      c.router_dtype = DType::FP32;
      c.hidden = s.hidden;
      c.ep_size = s.ep_size;
      c.quant = s.quant;
      ASSERT_TRUE(validation_errors(c).empty()) << validation_errors(c)[0];
      const Plan plan = exchange_plan(c, arch);
      ASSERT_EQ(plan.kernels.size(), s.quant == Quant::None ? 3u : 4u);
      const KernelSource source = generate(plan);
      ASSERT_EQ(source.units.size(), 1u);
      EXPECT_EQ(source.units[0].name, "exchange");
      CompileOptions options = compile_options_for(arch);
      options.repro_dir.clear();
      CompiledUnit compiled;
      ASSERT_NO_THROW(compiled = compile_unit(source.units[0], options));
      for (const auto& entry : source.units[0].entries) EXPECT_NE(compiled.cubin.find(entry), std::string::npos) << entry;
      expect_lean_kernels(compiled);
    }
}

// The tiles autotune times besides the planner's (tile_candidates), on sm_90a where wgmma and
// mma.sync shapes both occur: a gated and a non-gated config, every bucket.
TEST(Nvrtc, EveryTileCandidateCompilesLean) {
  MoeConfig gelu = preset("qwen3-30b-a3b");
  gelu.gated = false;
  gelu.activation = Activation::Gelu;
  CompileOptions options = compile_options_for("sm_90a");
  options.repro_dir.clear();
  for (const MoeConfig& c : {preset("mixtral-8x7b"), gelu}) {
    for (const TokenBucket& b : plan_buckets(c, "sm_90a")) {
      const auto candidates = tile_candidates(c, b, "sm_90a");
      for (size_t i = 1; i < candidates.size(); ++i) {  // [0] is the planner's, compiled above
        const auto& [g1, g2] = candidates[i];
        SCOPED_TRACE(describe(c) + " " + std::string(b.name()) + " " + describe(g1) + " / " + describe(g2));
        const Plan plan = make_plan(c, "sm_90a", {{std::string(b.name()), true, g1}, {std::string(b.name()), false, g2}});
        int gemm_units = 0;
        for (const auto& unit : generate(plan).units) {
          if (!is_gemm_unit(unit)) continue;
          ++gemm_units;
          CompiledUnit compiled;
          ASSERT_NO_THROW(compiled = compile_unit(unit, options));
          expect_lean_kernels(compiled);
        }
        EXPECT_EQ(gemm_units, 2);
      }
    }
  }
}

// The 8-bit mma.sync GEMMs (mma_gemm.cuh), which no plan takes by default yet: forced tiles of 16,
// 64 and 128 rows compile lean where they would run (int8 on sm_80, e4m3 on sm_89), and compile on
// sm_90a, where the GPU tests run them (fp8_block's 64 + 64 accumulators spill a little there).
TEST(Nvrtc, EightBitMmaTilesCompile) {
  const std::vector<TileOverride> tiles = parse_tile_overrides(
      "decode.gemm1=tc:16x16x128:s8:w1x2,decode.gemm2=tc:16x32x128:s8:w1x2,mid.gemm1=tc:64x64x128:s4:w2x2,"
      "mid.gemm2=tc:64x128x128:s4:w2x2,prefill.gemm1=tc:128x64x128:s3:w2x4,prefill.gemm2=tc:128x128x128:s3:w2x4");
  for (Quant q : {Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    for (const char* name : {"deepseek-v3", "qwen3-30b-a3b"}) {
      MoeConfig c = preset(name);
      c.quant = q;
      for (const std::string arch : {q == Quant::W8A8Int8 ? "sm_80" : "sm_89", "sm_90a"}) {
        SCOPED_TRACE(describe(c) + " " + arch);
        const Plan plan = make_plan(c, arch, tiles);
        EXPECT_EQ(plan.bucket_for(4096).gemm2.kernel, GemmKernel::TensorCore);
        CompileOptions options = compile_options_for(arch);
        options.repro_dir.clear();
        int gemm_units = 0;
        for (const auto& unit : generate(plan).units) {
          if (!is_gemm_unit(unit)) continue;
          ++gemm_units;
          CompiledUnit compiled;
          ASSERT_NO_THROW(compiled = compile_unit(unit, options));
          for (const auto& entry : unit.entries) EXPECT_NE(compiled.cubin.find(entry), std::string::npos) << entry;
          if (arch != "sm_90a") expect_lean_kernels(compiled);
        }
        EXPECT_EQ(gemm_units, 2);
      }
    }
  }
}

// fp8_block past 128 weight rows (a K block's partial sums in two passes of half the rows beside
// the running sum of all of them; the producer hands registers to the consumers): 192 and 256 rows,
// gated and not, aligned to the scale blocks (DeepSeek-V3) and not (I = 2064, H = 7184: a pass meets
// a block edge, which 256 rows refuse), compile lean on sm_90a.
TEST(Nvrtc, Fp8BlockTwoPassTilesCompileLean) {
  for (const char* tiles : {"prefill.gemm1=wg:128x128x128:s4,prefill.gemm2=wg:128x256x128:s4",
                            "prefill.gemm1=wg:128x96x128:s4,prefill.gemm2=wg:128x192x128:s4"}) {
    for (int64_t intermediate : {2048, 2064}) {
      MoeConfig c = preset("deepseek-v3");
      c.quant = Quant::Fp8Block;
      c.moe_intermediate = intermediate;
      c.hidden = intermediate == 2048 ? 7168 : 7184;
      SCOPED_TRACE(std::string(tiles) + " I=" + std::to_string(intermediate));
      if (intermediate == 2064 && std::string(tiles).find("x256x") != std::string::npos) {
        // A pass meeting a scale-block edge needs two weight scales: refused, not spilled.
        EXPECT_THROW(make_plan(c, "sm_90a", parse_tile_overrides(tiles)), InvalidInput);
        continue;
      }
      const Plan plan = make_plan(c, "sm_90a", parse_tile_overrides(tiles));
      EXPECT_EQ(plan.bucket_for(16384).gemm2.bn, plan.bucket_for(16384).gemm1.bn * 2);
      CompileOptions options = compile_options_for("sm_90a");
      options.repro_dir.clear();
      int gemm_units = 0;
      for (const auto& unit : generate(plan).units) {
        if (!is_gemm_unit(unit)) continue;
        ++gemm_units;
        CompiledUnit compiled;
        ASSERT_NO_THROW(compiled = compile_unit(unit, options));
        expect_lean_kernels(compiled);
      }
      EXPECT_EQ(gemm_units, 2);
    }
  }
}

TEST(Nvrtc, CompileErrorCarriesLogSourceAndRepro) {
  GeneratedUnit unit;
  unit.name = "broken";
  unit.entries = {"moejit_broken"};
  unit.source = "#include \"moejit/common.cuh\"\nextern \"C\" __global__ void moejit_broken() { undefined_name(); }\n";
  CompileOptions options = compile_options_for("sm_90a");
  char dir[] = "/tmp/moejit-repro-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  options.repro_dir = dir;
  try {
    compile_unit(unit, options);
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("moejit_broken"), std::string::npos);
    EXPECT_NE(what.find("undefined_name"), std::string::npos);  // the NVRTC log
    EXPECT_NE(what.find("    2 | extern"), std::string::npos);   // numbered source
    EXPECT_NE(what.find("-arch=sm_90a"), std::string::npos);
    ASSERT_FALSE(e.repro_dir().empty());
    EXPECT_TRUE(std::filesystem::exists(e.repro_dir() + "/broken.cu"));
    EXPECT_TRUE(std::filesystem::exists(e.repro_dir() + "/repro.sh"));
    EXPECT_TRUE(std::filesystem::exists(e.repro_dir() + "/moejit/common.cuh"));
  }
  std::filesystem::remove_all(dir);
}

TEST(Nvrtc, UnsupportedArchIsRefusedWithTheList) {
  try {
    check_arch("sm_42");
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("sm_90a"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moejit
