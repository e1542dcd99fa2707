// Expert parallel's all_reduce decorator (runtime/reduced_layer.h) on a machine without a GPU:
// against a stand-in NCCL (nccl_stub.cpp, which ctest names in MOEJIT_NCCL_LIBRARY) and a stand-in
// layer, what Layer::create's check refuses, and what each call hands the inner layer (the residual
// on rank 0 only) and ncclAllReduce (in place, T * H elements of the model dtype, a sum, on the
// call's stream). The real NCCL runs in tests/gpu/test_nccl_group.cpp.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "nccl_stub.h"
#include "runtime/nccl.h"
#include "runtime/reduced_layer.h"

#ifndef MOEJIT_NCCL_STUB
#error "tests/CMakeLists.txt defines MOEJIT_NCCL_STUB (the stand-in NCCL's path)"
#endif


namespace moejit {
namespace {

// Records what the decorator passes; computes nothing.
class FakeLayer final : public Layer {
 public:
  explicit FakeLayer(MoeConfig config) : config_(std::move(config)) {}
  const MoeConfig& config() const override { return config_; }
  const Plan* plan() const override { return nullptr; }
  std::string describe() const override { return "{\"backend\": \"fake\"}"; }
  void forward(void*, int64_t tokens, const LayerInputs& inputs, void*, void*, size_t) const override {
    seen_tokens = tokens;
    seen_residual = inputs.residual;
  }
  void route(void*, int64_t tokens, const void*, const float*, float*, int*) const override { seen_tokens = tokens; }
  void experts(void*, int64_t tokens, const int*, const float*, const LayerInputs& inputs, void*, void*,
               size_t) const override {
    seen_tokens = tokens;
    seen_residual = inputs.residual;
  }
  int launches(int64_t) const override { return 4; }

  mutable int64_t seen_tokens = -1;
  mutable const void* seen_residual = nullptr;

 private:
  MoeConfig config_;
};

MoeConfig config_of(DType dtype, int ep_size, int ep_rank) {
  MoeConfig c;
  c.experts = 8;
  c.topk = 2;
  c.hidden = 24;
  c.moe_intermediate = 16;
  c.dtype = c.router_dtype = dtype;
  c.ep_size = ep_size;
  c.ep_rank = ep_rank;
  return c;
}

TEST(ReducedLayer, LoadsTheNcclThatMoejitNcclLibraryNames) {
  ASSERT_EQ(nccl_library().path, MOEJIT_NCCL_STUB) << "run through ctest, which sets MOEJIT_NCCL_LIBRARY";
  EXPECT_EQ(nccl_library().version, 22800);
}

TEST(ReducedLayer, ACommunicatorMustHoldEveryRankOnTheLayersDevice) {
  EXPECT_NO_THROW(check_reduce_group(config_of(DType::BF16, 2, 1), stub_comm(2, 1, 3), 3));
  MoeConfig tp = config_of(DType::BF16, 2, 1);
  tp.tp_size = 2;
  EXPECT_NO_THROW(check_reduce_group(tp, stub_comm(4, 3, 0), 0));
  struct Case {
    MoeConfig config;
    void* comm;
    int ordinal;
    std::string message;
  };
  const Case cases[] = {
      {config_of(DType::BF16, 4, 1), stub_comm(2, 1, 0), 0,
       "nccl_comm: the communicator has 2 ranks; the layer sums its output over ep_size * tp_size = 4 * 1 = 4 ranks"},
      {tp, stub_comm(2, 1, 0), 0, "= 2 * 2 = 4 ranks"},
      {config_of(DType::BF16, 2, 1), stub_comm(2, 1, 1), 0, "nccl_comm: the communicator is on device 1, the layer on device 0"},
  };
  for (const Case& c : cases) {
    try {
      check_reduce_group(c.config, c.comm, c.ordinal);
      ADD_FAILURE() << c.message << ": accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

TEST(ReducedLayer, EachCallSumsTheOutputInPlaceAndRankZeroAloneAddsTheResidual) {
  struct Case {
    DType dtype;
    int nccl_type;
  };
  for (const Case& c : {Case{DType::BF16, nccl::kBfloat16}, Case{DType::FP16, nccl::kFloat16},
                        Case{DType::FP32, nccl::kFloat32}}) {
    for (int rank : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} rank {}", to_string(c.dtype), rank));
      auto fake = std::make_unique<FakeLayer>(config_of(c.dtype, 2, rank));
      const FakeLayer& inner = *fake;
      void* comm = stub_comm(2, rank, 0);
      auto layer = reduce_over_group(std::move(fake), comm);
      const nlohmann::json described = nlohmann::json::parse(layer->describe());
      EXPECT_EQ(described.value("backend", ""), "fake") << described;  // the inner layer's fields kept
      EXPECT_EQ(described["all_reduce"],
                (nlohmann::json{{"nccl_ranks", 2}, {"nccl_rank", rank}, {"nccl_version", 22800}}))
          << described;
      EXPECT_EQ(layer->launches(7), 4);
      (void)stub_calls();
      int residual = 0, output = 0;
      void* stream = reinterpret_cast<void*>(0x1234);
      LayerInputs in;
      in.residual = &residual;
      for (bool experts : {false, true}) {
        if (experts)
          layer->experts(stream, 7, nullptr, nullptr, in, &output, nullptr, 0);
        else
          layer->forward(stream, 7, in, &output, nullptr, 0);
        EXPECT_EQ(inner.seen_tokens, 7);
        EXPECT_EQ(inner.seen_residual, rank == 0 ? &residual : nullptr) << "experts: " << experts;
        const std::vector<StubCall> calls = stub_calls();
        ASSERT_EQ(calls.size(), 1u) << "experts: " << experts;
        EXPECT_STREQ(calls[0].function, "ncclAllReduce");
        EXPECT_EQ(calls[0].send, &output);
        EXPECT_EQ(calls[0].recv, &output);
        EXPECT_EQ(calls[0].count, 7u * 24u);
        EXPECT_EQ(calls[0].datatype, c.nccl_type);
        EXPECT_EQ(calls[0].op, nccl::kSum);
        EXPECT_EQ(calls[0].comm, comm);
        EXPECT_EQ(calls[0].stream, stream);
      }
      // No tokens: no collective (every rank of the group has the same T, so none makes one).
      layer->forward(stream, 0, in, nullptr, nullptr, 0);
      // Routing is the same on every rank: nothing to sum.
      layer->route(stream, 7, nullptr, nullptr, nullptr, nullptr);
      EXPECT_TRUE(stub_calls().empty());
    }
  }
}

TEST(ReducedLayer, ANonBlockingCommunicatorIsNamed) {
  try {
    check_nccl(nccl::kInProgress, "ncclAllReduce");
    ADD_FAILURE() << "ncclInProgress accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-blocking; moejit needs a blocking one"), std::string::npos) << e.what();
  }
  try {
    check_nccl(5, "ncclCommCount");
    ADD_FAILURE() << "an NCCL error accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "ncclCommCount: NCCL error 5 (stub NCCL error)");
  }
}

}  // namespace
}  // namespace moejit
