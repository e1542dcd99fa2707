// Run-time backend selection (runtime/backend_select.h) and its knob MOEJIT_BACKEND: Iluvatar
// device names choose ixformer, NVIDIA names the JIT, the knob forces either. No device needed.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "common/knobs.h"
#include "runtime/backend_select.h"

namespace moejit {
namespace {

DeviceInfo device(const std::string& name) {
  DeviceInfo d;
  d.ordinal = 0;
  d.name = name;
  return d;
}

Knobs with_backend(const std::string& value) {
  Knobs k;
  k.backend = value;
  return k;
}

TEST(BackendSelect, IluvatarNames) {
  for (const char* name : {"Iluvatar BI-V150", "Iluvatar BI-V100", "Iluvatar BI-V150S", "Iluvatar MR-V100",
                           "Iluvatar TG-V300", "ILUVATAR BI-V150", "Iluvatar CoreX", "BI-V150", "MR-V50",
                           "  bi-v100", "CoreX BI-V150"})
    EXPECT_TRUE(is_iluvatar_device_name(name)) << name;
  for (const char* name : {"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090",
                           "Tesla V100-SXM2-16GB", "NVIDIA B200", "", "AMD Instinct MI300X", "NVIDIA RTX A6000"})
    EXPECT_FALSE(is_iluvatar_device_name(name)) << name;
}

TEST(BackendSelect, AutoFollowsTheDevice) {
  BackendChoice ilu = select_backend(device("Iluvatar BI-V150"), with_backend("auto"), /*ixformer_built=*/true);
  EXPECT_EQ(ilu.kind, BackendKind::Ixformer);
  EXPECT_TRUE(ilu.usable);
  EXPECT_NE(ilu.reason.find("Iluvatar BI-V150"), std::string::npos) << ilu.reason;

  BackendChoice nv = select_backend(device("NVIDIA H200"), with_backend("auto"), true);
  EXPECT_EQ(nv.kind, BackendKind::CudaJit);
  EXPECT_TRUE(nv.usable);
  EXPECT_NE(nv.reason.find("not an Iluvatar device"), std::string::npos) << nv.reason;

  BackendChoice none = select_backend(std::nullopt, with_backend("auto"), true, "no libcuda.so.1");
  EXPECT_EQ(none.kind, BackendKind::CudaJit);
  EXPECT_NE(none.reason.find("no libcuda.so.1"), std::string::npos) << none.reason;
}

TEST(BackendSelect, IluvatarWithoutIxformerBuildIsNotUsable) {
  BackendChoice c = select_backend(device("Iluvatar BI-V150"), with_backend("auto"), /*ixformer_built=*/false);
  EXPECT_EQ(c.kind, BackendKind::Ixformer);  // never falls back to a JIT that cannot run there
  EXPECT_FALSE(c.usable);
  EXPECT_NE(c.reason.find("MOEJIT_WITH_IXFORMER"), std::string::npos) << c.reason;
}

TEST(BackendSelect, KnobForcesEither) {
  BackendChoice jit = select_backend(device("Iluvatar BI-V150"), with_backend("jit"), true);
  EXPECT_EQ(jit.kind, BackendKind::CudaJit);
  EXPECT_NE(jit.reason.find("MOEJIT_BACKEND=jit"), std::string::npos) << jit.reason;
  EXPECT_NE(jit.reason.find("does not run"), std::string::npos) << jit.reason;  // warns

  BackendChoice ixf = select_backend(device("NVIDIA H200"), with_backend("ixformer"), true);
  EXPECT_EQ(ixf.kind, BackendKind::Ixformer);
  EXPECT_TRUE(ixf.usable);
  EXPECT_NE(ixf.reason.find("MOEJIT_BACKEND=ixformer"), std::string::npos) << ixf.reason;

  BackendChoice none = select_backend(std::nullopt, with_backend("ixformer"), false);
  EXPECT_EQ(none.kind, BackendKind::Ixformer);
  EXPECT_FALSE(none.usable);
}

TEST(BackendSelect, NamesOfKinds) {
  EXPECT_EQ(to_string(BackendKind::CudaJit), "jit");
  EXPECT_EQ(to_string(BackendKind::Ixformer), "ixformer");
}

TEST(BackendSelect, KnobIsReadAndValidated) {
  const char* saved = std::getenv("MOEJIT_BACKEND");
  std::string saved_value = saved ? saved : "";
  ::unsetenv("MOEJIT_BACKEND");
  EXPECT_EQ(Knobs::from_environment().backend, "auto");
  for (const char* v : {"auto", "jit", "ixformer"}) {
    ::setenv("MOEJIT_BACKEND", v, 1);
    EXPECT_EQ(Knobs::from_environment().backend, v);
  }
  ::setenv("MOEJIT_BACKEND", "cuda", 1);
  try {
    Knobs::from_environment();
    ADD_FAILURE() << "MOEJIT_BACKEND=cuda accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("auto, jit, ixformer"), std::string::npos) << e.what();
  }
  if (saved)
    ::setenv("MOEJIT_BACKEND", saved_value.c_str(), 1);
  else
    ::unsetenv("MOEJIT_BACKEND");
  bool listed = false;
  for (const auto& row : Knobs{}.table()) listed = listed || row[0] == "MOEJIT_BACKEND";
  EXPECT_TRUE(listed) << "MOEJIT_BACKEND must be in Knobs::table() (moejit info)";
}

}  // namespace
}  // namespace moejit
