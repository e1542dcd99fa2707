// Real NVRTC (no GPU needed): every preset's every unit compiles to CUBIN for sm_80 and sm_90a,
// the CUBIN holds each planned entry point, and the ptxas report shows no local memory (no stack
// frame, no spills).
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "compiler/codegen.h"
#include "compiler/knobs.h"
#include "compiler/layer_compiler.h"
#include "compiler/nvrtc_compiler.h"
#include "compiler/plan.h"

namespace moejit {
namespace {

struct Case {
  std::string preset;
  std::string arch;
  bool w8a8;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name = info.param.preset + "_" + info.param.arch + (info.param.w8a8 ? "_w8a8" : "");
  for (char& c : name)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& preset : preset_names())
    for (const char* arch : {"sm_80", "sm_90a"}) out.push_back({preset, arch, false});
  // w8a8 changes the expand, both GEMMs and adds the re-quantization.
  for (const char* preset : {"qwen3-30b-a3b", "deepseek-v3"}) out.push_back({preset, "sm_90a", true});
  return out;
}

class EveryPreset : public testing::TestWithParam<Case> {};

TEST_P(EveryPreset, EveryUnitCompilesToCubinWithItsEntryPoints) {
  MoeConfig config = preset(GetParam().preset);
  if (GetParam().w8a8) config.quant = Quant::W8A8Int8;
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
    // ptxas -v reports "N bytes stack frame, N bytes spill stores": no kernel may use local
    // memory (a spilled or run-time-indexed register array), which costs far more than it looks.
    std::regex local_memory(R"(([1-9][0-9]*) bytes (spill stores|stack frame))");
    EXPECT_FALSE(std::regex_search(compiled.log, local_memory)) << compiled.log;
    // ptxas serializes wgmma (waits after every one) when it cannot keep the accumulators in
    // place across the asynchronous MMAs, and says so in a warning; the pipeline would be gone.
    EXPECT_EQ(compiled.log.find("serialized"), std::string::npos) << compiled.log;
    covered.insert(covered.end(), unit.stages.begin(), unit.stages.end());
  }
  for (Stage s : {Stage::Routing, Stage::Index, Stage::Gemm1, Stage::Gemm2, Stage::Combine})
    EXPECT_NE(std::find(covered.begin(), covered.end(), s), covered.end()) << to_string(s);
  if (GetParam().w8a8) EXPECT_NE(std::find(covered.begin(), covered.end(), Stage::Expand), covered.end());
}

INSTANTIATE_TEST_SUITE_P(Nvrtc, EveryPreset, testing::ValuesIn(cases()), case_name);

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
