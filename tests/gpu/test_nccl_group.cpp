// Expert parallel's all_reduce mode in the C++ API and the C ABI (LayerOptions::nccl_comm,
// runtime/reduced_layer.h) on one GPU: with a communicator of one rank (ncclCommInitAll) the sum
// over the ranks is the rank's own output, so the layer built with it must give the plain layer's
// output bit for bit, from forward() and experts(), eagerly and as a captured CUDA graph (the
// all-reduce called inside the capture); a communicator whose size does not fit ep_size * tp_size is refused
// before anything compiles. Several ranks need a machine of several GPUs: not run here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "configs.h"
#include "harness.h"
#include "nccl_groups.h"
#include "runtime/moejit.h"
#include "runtime/nccl.h"

namespace moejit::test {
namespace {

TEST(NcclGroup, OneRankSumIsTheLayersOwnOutput) {
  const MoeConfig c = small_config(16, 4, 264, 136, DType::BF16);
  Communicators group(1);
  auto plain = Layer::create(c);
  LayerOptions options;
  options.nccl_comm = group.get();
  auto reduced = Layer::create(c, options);
  const nlohmann::json described = nlohmann::json::parse(reduced->describe());
  EXPECT_EQ(described["all_reduce"]["nccl_ranks"], 1) << described;
  EXPECT_EQ(described["all_reduce"]["nccl_rank"], 0) << described;
  EXPECT_EQ(described["arch"], nlohmann::json::parse(plain->describe())["arch"]) << described;
  EXPECT_EQ(reduced->launches(40), plain->launches(40));
  Seeds seeds;
  Stream stream;
  for (int64_t T : {1, 37, 300}) {
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
    DeviceInputs in = upload(p);
    const GpuRun a = run_forward(*plain, in, T, stream.get());
    const GpuRun b = run_forward(*reduced, in, T, stream.get());
    EXPECT_TRUE(check_run(p, b)) << "T = " << T;
    EXPECT_TRUE(a.out == b.out) << "T = " << T << ": forward with a one-rank communicator differs";
    const GpuRun ea = run_experts(*plain, in, T, a.topk_ids, a.topk_weights, stream.get());
    const GpuRun eb = run_experts(*reduced, in, T, a.topk_ids, a.topk_weights, stream.get());
    EXPECT_TRUE(ea.out == eb.out) << "T = " << T << ": experts with a one-rank communicator differs";
  }
}

TEST(NcclGroup, TheAllReduceIsCapturedWithTheLayer) {
  const MoeConfig c = small_config(16, 4, 264, 136, DType::FP16);
  Communicators group(1);
  LayerOptions options;
  options.nccl_comm = group.get();
  auto layer = Layer::create(c, options);
  constexpr int64_t T = 40;
  Seeds seeds;
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  DeviceBuffer out(T * c.hidden * dtype_bytes(c.dtype)), workspace(layer->workspace_bytes(T));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  try {
    layer->forward(stream.get(), T, in.inputs(), out.get(), workspace.get(), workspace.size());
  } catch (...) {
    (void)cudaStreamEndCapture(stream.get(), &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    throw;
  }
  // (An in-place all-reduce over one rank adds no node: NCCL has nothing to move. What this checks is
  // that ncclAllReduce is legal inside the capture and the replay is right; several ranks' nodes
  // need several GPUs.)
  CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    redraw_activations(p, seeds.next());
    upload_activations(p, in, stream.get());
    out.fill(kPoison, stream.get());
    CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    stream.sync();
    const std::vector<uint8_t> replayed = out.download_all();
    const GpuRun eager = run_forward(*layer, in, T, stream.get());
    EXPECT_TRUE(check_run(p, eager)) << "round " << round;
    EXPECT_TRUE(replayed == eager.out) << "round " << round << ": graph replay differs from the eager call";
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST(NcclGroup, ACommunicatorOfAnotherSizeIsRefused) {
  Communicators group(1);
  MoeConfig c = small_config(16, 4, 264, 136, DType::BF16);
  c.ep_size = 2;
  c.ep_rank = 1;
  LayerOptions options;
  options.nccl_comm = group.get();
  try {
    Layer::create(c, options);
    ADD_FAILURE() << "a one-rank communicator was accepted for ep_size 2";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_comm: the communicator has 1 ranks; the layer sums its output over "
                                         "ep_size * tp_size = 2 * 1 = 2 ranks"),
              std::string::npos)
        << e.what();
  }
  // The C ABI: the same refusal is status 2 with the message; a null communicator is a plain layer.
  moejit_layer* layer = nullptr;
  EXPECT_EQ(moejit_layer_create_in_group("{\"experts\": 16, \"topk\": 4, \"hidden\": 264, \"moe_intermediate\": 136}",
                                         "{\"ep_size\": 2, \"ep_rank\": 1}", group.get(), &layer),
            2);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("the communicator has 1 ranks"), std::string::npos)
      << moejit_last_error();
  ASSERT_EQ(moejit_layer_create_in_group("{\"experts\": 16, \"topk\": 4, \"hidden\": 264, \"moe_intermediate\": 136}",
                                         nullptr, group.get(), &layer),
            0)
      << moejit_last_error();
  moejit_layer_destroy(layer);
}

}  // namespace
}  // namespace moejit::test
