// Expert parallel's all_reduce mode in the C++ API and the C ABI (LayerOptions::nccl_comm,
// runtime/reduced_layer.h) on one GPU: with a communicator of one rank (ncclCommInitAll) the sum
// over the ranks is the rank's own output, so the layer built with it must give the plain layer's
// output bit for bit, from forward() and experts(), eagerly and as a captured CUDA graph (the
// all-reduce called inside the capture); a communicator whose size does not fit ep_size * tp_size is refused
// before anything compiles. With several GPUs (skipped below two): a rank per GPU, each its experts
// of the same tokens, every rank's output the single-rank layer's (and the same bits on every
// rank), eagerly and replayed from a graph captured on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
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
  // (An in-place all-reduce over one rank adds no node: NCCL has nothing to move. What this checks is
  // that ncclAllReduce is legal inside the capture and the replay is right; several ranks' nodes
  // need several GPUs.)
  const CapturedGraph graph(stream.get(), [&] {
    layer->forward(stream.get(), T, in.inputs(), out.get(), workspace.get(), workspace.size());
  });
  for (int round = 0; round < 2; ++round) {
    redraw_activations(p, seeds.next());
    upload_activations(p, in, stream.get());
    out.fill(kPoison, stream.get());
    graph.launch(stream.get());
    stream.sync();
    const std::vector<uint8_t> replayed = out.download_all();
    const GpuRun eager = run_forward(*layer, in, T, stream.get());
    EXPECT_TRUE(check_run(p, eager)) << "round " << round;
    EXPECT_TRUE(replayed == eager.out) << "round " << round << ": graph replay differs from the eager call";
  }
}

TEST(NcclGroup, SeveralRanksSumToTheLayer) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  const int ranks = std::min(gpus, 8);
  if (ranks < 2) GTEST_SKIP() << "needs a machine of several GPUs (" << ranks << " here)";
  Communicators group(ranks);
  for (DType dtype : {DType::FP32, DType::BF16})
    for (int64_t T : {37, 300}) {
      SCOPED_TRACE(fmt::format("{} ranks, {}, T = {}", ranks, to_string(dtype), T));
      const MoeConfig c = small_config(4 * ranks, 4, 264, 136, dtype);
      Seeds seeds;
      const Problem whole = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
      GpuRun single;
      {
        CUDA_CHECK(cudaSetDevice(0));
        auto layer = Layer::create(c);
        DeviceInputs in = upload(whole);
        Stream stream;
        single = run_forward(*layer, in, T, stream.get());
        ASSERT_TRUE(check_run(whole, single));
      }
      std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(ranks)), replays(static_cast<size_t>(ranks));
      std::vector<std::string> failures(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
          const size_t i = static_cast<size_t>(r);
          try {
            CUDA_CHECK(cudaSetDevice(r));
            CUDA_CHECK(cudaFree(nullptr));  // the primary context current on this thread
            const Problem mine = whole.for_rank(ranks, r);
            LayerOptions options;
            options.nccl_comm = group.get(r);
            auto layer = Layer::create(mine.config, options);
            DeviceInputs in = upload(mine);  // every rank passes the residual; rank 0 alone adds it
            Stream stream;
            outs[i] = run_forward(*layer, in, T, stream.get()).out;
            DeviceBuffer out(outs[i].size()), workspace(layer->workspace_bytes(T));
            const CapturedGraph graph(stream.get(), [&] {
              layer->forward(stream.get(), T, in.inputs(), out.get(), workspace.get(), workspace.size());
            });
            out.fill(kPoison, stream.get());
            graph.launch(stream.get());
            stream.sync();
            replays[i] = out.download_all();
          } catch (const std::exception& e) {
            failures[i] = e.what();
          }
        });
      for (auto& t : threads) t.join();
      const Elem e = elem_of(c.dtype);
      for (int r = 0; r < ranks; ++r) {
        const size_t i = static_cast<size_t>(r);
        SCOPED_TRACE(fmt::format("rank {}", r));
        ASSERT_EQ(failures[i], "");
        EXPECT_TRUE(outs[i] == outs[0]) << "the ranks' sums differ";
        EXPECT_TRUE(replays[i] == outs[i]) << "graph replay differs from the eager call";
        std::vector<double> got(static_cast<size_t>(T * c.hidden)), want(got.size());
        for (size_t k = 0; k < got.size(); ++k) {
          got[k] = decode(e, outs[i].data() + k * elem_bytes(e));
          want[k] = decode(e, single.out.data() + k * elem_bytes(e));
        }
        EXPECT_LE(reference::relative_error(want, got), tolerances_for(c).out) << whole.describe();
      }
    }
  CUDA_CHECK(cudaSetDevice(0));
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
