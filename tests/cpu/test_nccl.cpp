// NCCL's run-time loader (runtime/nccl.h) on a machine without a GPU: the installed library loads
// (ncclGetVersion needs no device), a missing file or a library that is not NCCL is a clear error,
// and the constants moejit declares instead of including nccl.h are nccl.h's. A communicator needs a
// GPU: the all_reduce mode itself is tested in tests/gpu/test_nccl_group.cpp.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "runtime/nccl.h"

#ifdef MOEJIT_NCCL_HEADER
#include MOEJIT_NCCL_HEADER
#endif

namespace moejit {
namespace {

// The library on the loader's path, else the one the build found (pip's nvidia-nccl-cu13, which torch
// installs: scripts/setup.sh installs torch, so CI has one). Where the build found none and the
// loader has none either, the machine has no NCCL: the test is skipped, saying so.
TEST(Nccl, TheInstalledLibraryLoadsWithoutAGpu) {
  NcclLibrary nccl;
  try {
    nccl = load_nccl_library("libnccl.so.2", false);
  } catch (const Error& e) {
#ifdef MOEJIT_NCCL_LIBRARY_FILE
    ASSERT_NO_THROW(nccl = load_nccl_library(MOEJIT_NCCL_LIBRARY_FILE, true)) << "and libnccl.so.2: " << e.what();
#else
    GTEST_SKIP() << "no NCCL on this machine (the build found none, and: " << e.what() << ")";
#endif
  }
  EXPECT_GE(nccl.version, 20000) << nccl.path;
  ASSERT_NE(nccl.get_error_string, nullptr);
  EXPECT_NE(std::string(nccl.get_error_string(nccl::kInProgress)), "");
  for (auto* f : {reinterpret_cast<void*>(nccl.comm_count), reinterpret_cast<void*>(nccl.comm_user_rank),
                  reinterpret_cast<void*>(nccl.comm_cu_device), reinterpret_cast<void*>(nccl.all_reduce),
                  reinterpret_cast<void*>(nccl.comm_init_all), reinterpret_cast<void*>(nccl.comm_destroy)})
    EXPECT_NE(f, nullptr);
  close_nccl_library(nccl);
  EXPECT_EQ(nccl.handle, nullptr);
}

TEST(Nccl, AMissingLibraryOrOneThatIsNotNcclIsAClearError) {
  struct Case {
    std::string path;
    bool knob_set;
    std::string message;
  };
  const Case cases[] = {
      {"/nonexistent/libnccl.so.2", true, "dlopen(/nonexistent/libnccl.so.2) failed"},
      {"/nonexistent/libnccl.so.2", true, "MOEJIT_NCCL_LIBRARY names it"},
      {"libnccl-that-does-not-exist.so.2", false, "Set MOEJIT_NCCL_LIBRARY to libnccl.so.2's path"},
      {"libc.so.6", true, "libc.so.6 has no symbol ncclGetVersion: is it NCCL?"},
  };
  for (const Case& c : cases) {
    try {
      load_nccl_library(c.path, c.knob_set);
      ADD_FAILURE() << c.path << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

// An NCCL before 2.7 (no point-to-point calls) still serves the all_reduce mode; all_to_all is refused
// naming the library and its version.
TEST(Nccl, AllToAllNeedsThePointToPointCalls) {
  NcclLibrary old;
  old.path = "/opt/nccl-2.6/libnccl.so.2";
  old.version = 2604;
  try {
    require_point_to_point(old);
    ADD_FAILURE() << "an NCCL without ncclSend accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/opt/nccl-2.6/libnccl.so.2 (NCCL 2604) has no ncclSend"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("needs NCCL 2.7 or later"), std::string::npos) << e.what();
  }
}

TEST(Nccl, TheDeclaredConstantsAreNcclHs) {
#ifdef MOEJIT_NCCL_HEADER
  static_assert(nccl::kSuccess == ncclSuccess && nccl::kInProgress == ncclInProgress);
  static_assert(nccl::kUint8 == ncclUint8 && nccl::kInt32 == ncclInt32);
  static_assert(nccl::kFloat16 == ncclFloat16 && nccl::kFloat32 == ncclFloat32 && nccl::kBfloat16 == ncclBfloat16);
  static_assert(nccl::kSum == ncclSum);
  static_assert(std::is_same_v<nccl::Comm, ncclComm_t>);
  static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
                sizeof(ncclRedOp_t) == sizeof(int));
#else
  GTEST_SKIP() << "no nccl.h was found when this was built (pip's nvidia-nccl-cu13 has one)";
#endif
}

}  // namespace
}  // namespace moejit
