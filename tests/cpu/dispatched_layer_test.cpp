// Expert parallel's all_to_all decorator (runtime/dispatched_layer.h) on a machine without a GPU:
// against the stand-in NCCL (nccl_stub.cpp, named by MOEJIT_NCCL_LIBRARY), a stand-in layer and
// stand-in exchange kernels that record what they are given. What the checks refuse; the workspace
// layout; and what each call does, in order: route this rank's tokens, slots and pack, one NCCL group
// sending every rank its slab of rows, ids and weights and receiving every rank's, the local experts
// on all ep_size * C received rows, one group returning the sums, the combine; with no tokens and
// with too many (or a negative count) the call still serves the other ranks. The kernels' arithmetic
// and the real NCCL run in tests/gpu/test_nccl_all_to_all.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compiler/families/exchange.h"
#include "compiler/planner.h"
#include "nccl_stub.h"
#include "runtime/dispatched_layer.h"
#include "runtime/nccl.h"

#ifndef MOEJIT_NCCL_STUB
#error "tests/CMakeLists.txt defines MOEJIT_NCCL_STUB (the stand-in NCCL's path)"
#endif

namespace moejit {
namespace {

// What happened, in order, with the number of NCCL calls made before it.
struct Event {
  std::string what;
  size_t nccl_calls_before = 0;
};
std::vector<Event> events;

void note(const std::string& what) { events.push_back({what, stub_calls(false).size()}); }

// Records the calls the decorator makes; computes nothing. Has a real plan (launches() reads it).
class RecordingLayer final : public Layer {
 public:
  explicit RecordingLayer(MoeConfig config) : config_(std::move(config)), plan_(make_plan(config_, "sm_90a")) {}
  const MoeConfig& config() const override { return config_; }
  const Plan* plan() const override { return &plan_; }
  std::string describe() const override { return "{\"backend\": \"recording\"}"; }
  void forward(void*, int64_t, const LayerInputs&, void*, void*, size_t) const override { note("inner forward"); }
  void route(void* stream, int64_t tokens, const void* logits, const float*, float* weights, int* ids) const override {
    note("route");
    route_call = {stream, tokens, logits, weights, ids};
  }
  void experts(void* stream, int64_t tokens, const int* ids, const float* weights, const LayerInputs& in, void* output,
               void* workspace, size_t workspace_size) const override {
    note("experts");
    experts_call = {stream, tokens, ids, weights, in, output, workspace, workspace_size};
  }
  int launches(int64_t) const override { return 0; }

  struct RouteCall {
    void* stream;
    int64_t tokens;
    const void* logits;
    float* weights;
    int* ids;
  };
  struct ExpertsCall {
    void* stream;
    int64_t tokens;
    const int* ids;
    const float* weights;
    LayerInputs in;
    void* output;
    void* workspace;
    size_t workspace_size;
  };
  mutable RouteCall route_call{};
  mutable ExpertsCall experts_call{};

 private:
  MoeConfig config_;
  Plan plan_;
};

class RecordingKernels final : public ExchangeKernels {
 public:
  void quantize(CUstream stream, const QuantizeArgs& args, int64_t tokens) const override {
    note("quantize");
    quantize_args = args;
    quantize_tokens = tokens;
    stream_ = stream;
  }
  void slots(CUstream stream, const ExchangeSlotsArgs& args) const override {
    note("slots");
    slots_args = args;
    stream_ = stream;
  }
  void pack(CUstream stream, const ExchangePackArgs& args, int64_t capacity) const override {
    note("pack");
    pack_args = args;
    pack_capacity = capacity;
    stream_ = stream;
  }
  void combine(CUstream stream, const ExchangeCombineArgs& args) const override {
    note("combine");
    combine_args = args;
    stream_ = stream;
  }
  mutable QuantizeArgs quantize_args{};
  mutable int64_t quantize_tokens = -1;
  mutable ExchangeSlotsArgs slots_args{};
  mutable ExchangePackArgs pack_args{};
  mutable int64_t pack_capacity = 0;
  mutable ExchangeCombineArgs combine_args{};
  mutable CUstream stream_ = nullptr;
};

// An fp8_block layer (2 scale groups a row: H = 256).
MoeConfig fp8_config_of(int ep_size, int ep_rank);

MoeConfig config_of(int ep_size, int ep_rank) {
  MoeConfig c;
  c.experts = 8;
  c.topk = 3;
  c.hidden = 40;
  c.moe_intermediate = 16;
  c.dtype = c.router_dtype = DType::BF16;
  c.ep_size = ep_size;
  c.ep_rank = ep_rank;
  return c;
}

MoeConfig fp8_config_of(int ep_size, int ep_rank) {
  MoeConfig c = config_of(ep_size, ep_rank);
  c.hidden = 256;
  c.moe_intermediate = 128;
  c.quant = Quant::Fp8Block;
  return c;
}

// Addresses that are never dereferenced (every callee records), aligned as the checks want.
template <typename T = void>
T* fake_pointer(uintptr_t at) {
  return reinterpret_cast<T*>(at << 12);
}

void expect_refused(const std::function<void()>& call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << message << ": accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(DispatchedLayer, TheGroupMustBeTheExpertRanksInOrderOnTheLayersDevice) {
  EXPECT_NO_THROW(check_dispatch_group(config_of(4, 2), stub_comm(4, 2, 1), 1, 64));
  MoeConfig tp = config_of(4, 2);
  tp.tp_size = 2;
  MoeConfig router = config_of(4, 2);
  router.router_gemm = true;
  MoeConfig shared = config_of(4, 2);
  shared.n_shared_experts = 1;
  shared.fuse_shared_experts = true;
  // T * K pairs stay below 2^31 on the ep_size * C rows the local experts see.
  const int64_t most = ((int64_t{1} << 31) - 1) / 3 / 4;
  EXPECT_NO_THROW(check_dispatch_group(config_of(4, 2), stub_comm(4, 2, 1), 1, most));
  struct Case {
    MoeConfig config;
    void* comm;
    int ordinal;
    int64_t capacity;
    std::string message;
  };
  const Case cases[] = {
      {config_of(4, 2), stub_comm(4, 2, 1), 1, 0, "max_tokens_per_rank: 0 is outside 1.."},
      {config_of(4, 2), stub_comm(4, 2, 1), 1, -5, "max_tokens_per_rank: -5 is outside 1.."},
      {config_of(4, 2), stub_comm(4, 2, 1), 1, most + 1, fmt::format("is outside 1..{}", most)},
      {tp, stub_comm(4, 2, 1), 1, 64, "tp_size: 2; ep_mode all_to_all needs tp_size 1"},
      {router, stub_comm(4, 2, 1), 1, 64, "router_gemm: true; ep_mode all_to_all"},
      {shared, stub_comm(4, 2, 1), 1, 64, "fuse_shared_experts: true; ep_mode all_to_all"},
      {config_of(4, 2), stub_comm(8, 2, 1), 1, 64, "nccl_comm: the communicator has 8 ranks; ep_mode all_to_all "
                                                   "needs ep_size = 4"},
      {config_of(4, 2), stub_comm(4, 3, 1), 1, 64, "nccl_comm: this is rank 3 of the communicator but the config "
                                                   "has ep_rank 2"},
      {config_of(4, 2), stub_comm(4, 2, 0), 1, 64, "nccl_comm: the communicator is on device 0, the layer on device 1"},
  };
  for (const Case& c : cases)
    expect_refused([&] { check_dispatch_group(c.config, c.comm, c.ordinal, c.capacity); }, c.message);
}

TEST(DispatchedLayer, LayerCreateRefusesAModeWithoutItsOptions) {
  LayerOptions no_comm;
  no_comm.ep_mode = ExpertParallelMode::AllToAll;
  no_comm.max_tokens_per_rank = 8;
  expect_refused([&] { Layer::create(config_of(4, 2), no_comm); }, "nccl_comm: null; ep_mode all_to_all");
  LayerOptions capacity_without_mode;
  capacity_without_mode.max_tokens_per_rank = 8;
  expect_refused([&] { Layer::create(config_of(4, 2), capacity_without_mode); },
                 "max_tokens_per_rank: 8; only ep_mode all_to_all takes it");
}

TEST(DispatchedLayer, TheWorkspaceHoldsEveryBufferAlignedAndApart) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8_block" : "bf16");
    const MoeConfig c = fp8 ? fp8_config_of(4, 2) : config_of(4, 2);
    const int64_t C = 7, rows = 4 * C, H = c.hidden, row_bytes = H * 2, K = 3;
    const int64_t sent = fp8 ? H : row_bytes, G = fp8 ? 2 : 0;  // fp8: e4m3 rows, 2 scales each
    const DispatchWorkspace w = dispatch_workspace(c, C, 1001);
    struct Buffer {
      const char* name;
      int64_t offset, bytes;
    };
    std::vector<Buffer> buffers = {
        {"inner", w.inner, 1001},
        {"topk_weights", w.topk_weights, C * K * 4},
        {"topk_ids", w.topk_ids, C * K * 4},
        {"quantized", w.quantized, fp8 ? C * H : 0},
        {"quantized_scale", w.quantized_scale, C * G * 4},
        {"slot_of", w.slot_of, C * 4 * 4},
        {"source", w.source, rows * 4},
        {"send_rows", w.send_rows, rows * row_bytes},  // the returned sums (model dtype) land here
        {"send_ids", w.send_ids, rows * K * 4},
        {"send_weights", w.send_weights, rows * K * 4},
        {"send_scales", w.send_scales, rows * G * 4},
        {"recv_rows", w.recv_rows, rows * sent},
        {"recv_ids", w.recv_ids, rows * K * 4},
        {"recv_weights", w.recv_weights, rows * K * 4},
        {"recv_scales", w.recv_scales, rows * G * 4},
        {"partial", w.partial, rows * row_bytes},
    };
    EXPECT_EQ(w.inner, 0);
    EXPECT_EQ(w.inner_bytes, 1001);
    std::sort(buffers.begin(), buffers.end(), [](const Buffer& a, const Buffer& b) { return a.offset < b.offset; });
    for (size_t i = 0; i < buffers.size(); ++i) {
      SCOPED_TRACE(buffers[i].name);
      EXPECT_EQ(buffers[i].offset % 256, 0);
      const int64_t end = buffers[i].offset + buffers[i].bytes;
      EXPECT_LE(end, i + 1 < buffers.size() ? buffers[i + 1].offset : w.total_bytes);
    }
    EXPECT_EQ(w.total_bytes % 256, 0);
  }
}

// The NCCL calls of one exchange group: start, then per slab array and peer a send and a receive of
// C rows, then end.
struct SlabCheck {
  const char* send;
  const char* recv;
  size_t row_count;
  int64_t row_bytes;
  int type;
};

void expect_group(const std::vector<StubCall>& calls, size_t first, const std::vector<SlabCheck>& arrays, int ranks,
                  int64_t capacity, void* comm, void* stream) {
  ASSERT_GE(calls.size(), first + 2 + arrays.size() * ranks * 2);
  EXPECT_STREQ(calls[first].function, "ncclGroupStart");
  size_t i = first + 1;
  for (const SlabCheck& a : arrays)
    for (int peer = 0; peer < ranks; ++peer) {
      SCOPED_TRACE(fmt::format("peer {} call {}", peer, i));
      const int64_t offset = peer * capacity * a.row_bytes;
      for (const char* function : {"ncclSend", "ncclRecv"}) {
        const StubCall& call = calls[i++];
        EXPECT_STREQ(call.function, function);
        if (std::string(function) == "ncclSend")
          EXPECT_EQ(call.send, a.send + offset);
        else
          EXPECT_EQ(call.recv, a.recv + offset);
        EXPECT_EQ(call.count, static_cast<size_t>(capacity) * a.row_count);
        EXPECT_EQ(call.datatype, a.type);
        EXPECT_EQ(call.peer, peer);
        EXPECT_EQ(call.comm, comm);
        EXPECT_EQ(call.stream, stream);
      }
    }
  EXPECT_STREQ(calls[i].function, "ncclGroupEnd");
}

struct Fixture {
  static constexpr int kRanks = 4, kRank = 2;
  static constexpr int64_t kCapacity = 6;
  explicit Fixture(MoeConfig c = config_of(kRanks, kRank)) : config(std::move(c)) {
    auto inner_owned = std::make_unique<RecordingLayer>(config);
    auto kernels_owned = std::make_unique<RecordingKernels>();
    inner = inner_owned.get();
    kernels = kernels_owned.get();
    layer = dispatch_over_group(std::move(inner_owned), comm, kCapacity, std::move(kernels_owned));
    layout = dispatch_workspace(config, kCapacity, inner->workspace_bytes(kRanks * kCapacity));
    in.hidden = fake_pointer(1);
    in.router_logits = fake_pointer(2);
    in.w13 = fake_pointer(3);
    in.w2 = fake_pointer(4);
    in.residual = fake_pointer(5);
    if (is_fp8(config.quant)) {
      in.w13_scale = fake_pointer<float>(10);
      in.w2_scale = fake_pointer<float>(11);
    }
    events.clear();
    (void)stub_calls();
  }
  char* at(int64_t offset) const { return static_cast<char*>(workspace) + offset; }

  MoeConfig config;
  void* comm = stub_comm(kRanks, kRank, 0);
  void* stream = fake_pointer(6);
  void* output = fake_pointer(7);
  void* workspace = fake_pointer(0x100);
  RecordingLayer* inner = nullptr;
  RecordingKernels* kernels = nullptr;
  std::unique_ptr<Layer> layer;
  DispatchWorkspace layout;
  LayerInputs in;
};

// Every call's exchange, for `own` tokens of this rank routed into (ids, weights).
void expect_exchange(const Fixture& f, int64_t own, const int* ids, const float* weights, const LayerInputs& in) {
  const int64_t C = Fixture::kCapacity, rows = Fixture::kRanks * C;
  const auto& s = f.kernels->slots_args;
  EXPECT_EQ(s.topk_ids, ids);
  EXPECT_EQ(s.tokens, own);
  EXPECT_EQ(s.capacity, C);
  EXPECT_EQ(s.slot_of, reinterpret_cast<int*>(f.at(f.layout.slot_of)));
  EXPECT_EQ(s.source, reinterpret_cast<int*>(f.at(f.layout.source)));
  const bool fp8 = is_fp8(f.config.quant);
  const int64_t H = f.config.hidden, K = f.config.topk, G = exchange_scale_groups(f.config);  // 2 or 1 for fp8
  const auto& q = f.kernels->quantize_args;
  if (fp8) {  // the rows quantized first, by the layer's own stage-3 kernel
    EXPECT_EQ(f.kernels->quantize_tokens, own);
    EXPECT_EQ(q.src, in.hidden);
    EXPECT_EQ(q.q, reinterpret_cast<signed char*>(f.at(f.layout.quantized)));
    EXPECT_EQ(q.scale, reinterpret_cast<float*>(f.at(f.layout.quantized_scale)));
    EXPECT_EQ(q.sorted_pair, nullptr);
    EXPECT_EQ(q.smooth, nullptr);
  } else {
    EXPECT_EQ(f.kernels->quantize_tokens, -1) << "a 16-bit layer's rows travel as they are";
  }
  const auto& p = f.kernels->pack_args;
  EXPECT_EQ(p.hidden, fp8 ? f.at(f.layout.quantized) : in.hidden);
  EXPECT_EQ(p.scales, fp8 ? reinterpret_cast<float*>(f.at(f.layout.quantized_scale)) : nullptr);
  EXPECT_EQ(p.send_scales, fp8 ? reinterpret_cast<float*>(f.at(f.layout.send_scales)) : nullptr);
  EXPECT_EQ(p.topk_ids, ids);
  EXPECT_EQ(p.topk_weights, weights);
  EXPECT_EQ(p.source, s.source);
  EXPECT_EQ(p.send_rows, f.at(f.layout.send_rows));
  EXPECT_EQ(p.send_ids, reinterpret_cast<int*>(f.at(f.layout.send_ids)));
  EXPECT_EQ(p.send_weights, reinterpret_cast<float*>(f.at(f.layout.send_weights)));
  EXPECT_EQ(f.kernels->pack_capacity, C);
  EXPECT_EQ(f.kernels->stream_, f.stream);

  const std::vector<StubCall> calls = stub_calls();
  const size_t arrays = fp8 ? 4 : 3;
  const size_t dispatch_calls = 2 + arrays * Fixture::kRanks * 2, return_calls = 2 + Fixture::kRanks * 2;
  ASSERT_EQ(calls.size(), dispatch_calls + return_calls);
  std::vector<SlabCheck> dispatch = {
      fp8 ? SlabCheck{f.at(f.layout.send_rows), f.at(f.layout.recv_rows), static_cast<size_t>(H), H, nccl::kUint8}
          : SlabCheck{f.at(f.layout.send_rows), f.at(f.layout.recv_rows), static_cast<size_t>(H), 2 * H,
                      nccl::kBfloat16},
      {f.at(f.layout.send_ids), f.at(f.layout.recv_ids), static_cast<size_t>(K), 4 * K, nccl::kInt32},
      {f.at(f.layout.send_weights), f.at(f.layout.recv_weights), static_cast<size_t>(K), 4 * K, nccl::kFloat32}};
  if (fp8)
    dispatch.push_back(
        {f.at(f.layout.send_scales), f.at(f.layout.recv_scales), static_cast<size_t>(G), 4 * G, nccl::kFloat32});
  expect_group(calls, 0, dispatch, Fixture::kRanks, C, f.comm, f.stream);
  // The sums return in the model dtype into send_rows, free once the dispatch is done.
  expect_group(calls, dispatch_calls,
               {{f.at(f.layout.partial), f.at(f.layout.send_rows), static_cast<size_t>(H), 2 * H, nccl::kBfloat16}},
               Fixture::kRanks, C, f.comm, f.stream);

  const auto& e = f.inner->experts_call;
  EXPECT_EQ(e.stream, f.stream);
  EXPECT_EQ(e.tokens, rows);
  EXPECT_EQ(e.ids, reinterpret_cast<const int*>(f.at(f.layout.recv_ids)));
  EXPECT_EQ(e.weights, reinterpret_cast<const float*>(f.at(f.layout.recv_weights)));
  EXPECT_EQ(e.in.hidden, f.at(f.layout.recv_rows));
  EXPECT_EQ(e.in.hidden_scale, fp8 ? reinterpret_cast<const float*>(f.at(f.layout.recv_scales)) : nullptr);
  EXPECT_EQ(e.in.w13, in.w13);
  EXPECT_EQ(e.in.w2, in.w2);
  EXPECT_EQ(e.in.residual, nullptr) << "the residual is added once, by the token's own rank";
  EXPECT_EQ(e.output, f.at(f.layout.partial));
  EXPECT_EQ(e.workspace, f.at(f.layout.inner));
  EXPECT_EQ(e.workspace_size, static_cast<size_t>(f.layout.inner_bytes));

  const auto& c = f.kernels->combine_args;
  EXPECT_EQ(c.returned, f.at(f.layout.send_rows));
  EXPECT_EQ(c.slot_of, s.slot_of);
  EXPECT_EQ(c.residual, in.residual);
  EXPECT_EQ(c.out, f.output);
  EXPECT_EQ(c.tokens, own);
  EXPECT_EQ(c.capacity, C);
}

// The order: this rank's kernels before any NCCL call, the local experts between the two groups,
// the combine after both.
void expect_order(bool routed, bool fp8 = false) {
  const size_t dispatch_calls = 2 + (fp8 ? 4 : 3) * Fixture::kRanks * 2, all = dispatch_calls + 2 + Fixture::kRanks * 2;
  std::vector<std::pair<std::string, size_t>> want;
  if (routed) want.push_back({"route", 0});
  if (fp8) want.push_back({"quantize", 0});
  for (auto e : std::vector<std::pair<std::string, size_t>>{
           {"slots", 0}, {"pack", 0}, {"experts", dispatch_calls}, {"combine", all}})
    want.push_back(e);
  ASSERT_EQ(events.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(events[i].what, want[i].first);
    EXPECT_EQ(events[i].nccl_calls_before, want[i].second) << events[i].what;
  }
}

TEST(DispatchedLayer, AForwardRoutesDispatchesComputesReturnsAndCombines) {
  Fixture f;
  f.layer->forward(f.stream, 5, f.in, f.output, f.workspace, f.layout.total_bytes);
  expect_order(true);
  const auto& r = f.inner->route_call;
  EXPECT_EQ(r.stream, f.stream);
  EXPECT_EQ(r.tokens, 5);
  EXPECT_EQ(r.logits, f.in.router_logits);
  EXPECT_EQ(r.weights, reinterpret_cast<float*>(f.at(f.layout.topk_weights)));
  EXPECT_EQ(r.ids, reinterpret_cast<int*>(f.at(f.layout.topk_ids)));
  expect_exchange(f, 5, r.ids, r.weights, f.in);
}

TEST(DispatchedLayer, AnFp8LayerSendsItsRowsQuantizedWithTheirScales) {
  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    SCOPED_TRACE(to_string(quant));
    MoeConfig c = fp8_config_of(Fixture::kRanks, Fixture::kRank);
    c.quant = quant;
    Fixture f(c);
    f.layer->forward(f.stream, 5, f.in, f.output, f.workspace, f.layout.total_bytes);
    expect_order(true, true);
    const auto& r = f.inner->route_call;
    expect_exchange(f, 5, r.ids, r.weights, f.in);
    const nlohmann::json described = nlohmann::json::parse(f.layer->describe());
    EXPECT_EQ(described["all_to_all"]["rows_sent_as"], "e4m3") << described;
    // No tokens of its own, and too many: the rank still quantizes (nothing), packs and serves.
    for (int64_t tokens : {int64_t{0}, int64_t{9}}) {
      events.clear();
      if (tokens == 0)
        f.layer->forward(f.stream, 0, f.in, f.output, f.workspace, f.layout.total_bytes);
      else
        expect_refused([&] { f.layer->forward(f.stream, tokens, f.in, f.output, f.workspace, f.layout.total_bytes); },
                       "tokens: 9 is more than max_tokens_per_rank = 6");
      expect_order(false, true);
      expect_exchange(f, 0, reinterpret_cast<int*>(f.at(f.layout.topk_ids)),
                      reinterpret_cast<float*>(f.at(f.layout.topk_weights)), f.in);
    }
    // Quantized hidden rows of the caller's own are refused: the layer quantizes them itself.
    LayerInputs given = f.in;
    given.hidden_scale = fake_pointer<float>(12);
    expect_refused([&] { f.layer->experts(f.stream, 5, r.ids, r.weights, given, f.output, f.workspace,
                                          f.layout.total_bytes); },
                   "hidden_scale: an all_to_all layer takes hidden in the model dtype");
    expect_refused([&] { f.layer->forward(f.stream, 5, given, f.output, f.workspace, f.layout.total_bytes); },
                   "hidden_scale: forward() quantizes hidden itself");
  }
}

TEST(DispatchedLayer, ExpertsExchangesTheCallersRouting) {
  Fixture f;
  const int* ids = fake_pointer<int>(8);
  const float* weights = fake_pointer<float>(9);
  f.layer->experts(f.stream, Fixture::kCapacity, ids, weights, f.in, f.output, f.workspace, f.layout.total_bytes);
  expect_order(false);
  expect_exchange(f, Fixture::kCapacity, ids, weights, f.in);
}

TEST(DispatchedLayer, ARankWithNoTokensStillServesTheOthers) {
  Fixture f;
  LayerInputs empty = f.in;
  empty.hidden = empty.router_logits = empty.residual = nullptr;
  f.output = nullptr;
  f.layer->forward(f.stream, 0, empty, nullptr, f.workspace, f.layout.total_bytes);
  expect_order(false);  // nothing to route; the combine of no tokens launches nothing (exchange_kernels)
  expect_exchange(f, 0, reinterpret_cast<int*>(f.at(f.layout.topk_ids)),
                  reinterpret_cast<float*>(f.at(f.layout.topk_weights)), empty);
}

TEST(DispatchedLayer, ARankWithTooManyTokensServesTheOthersThenRefuses) {
  struct Case {
    int64_t tokens;
    std::string message;
  };
  // Past C, past what any layer takes (T * K >= 2^31), and negative: every one still served.
  const Case cases[] = {
      {7, "tokens: 7 is more than max_tokens_per_rank = 6, the slab every rank of the all_to_all group sends each "
          "other rank; this call computed nothing for this rank's tokens (it served the other ranks' rows, so "
          "their calls complete)"},
      {int64_t{1} << 40, "is more than max_tokens_per_rank = 6"},
      {-1, "tokens: -1 is negative; allowed 0..6; this call computed nothing for this rank's tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tokens);
    Fixture f;
    expect_refused([&] { f.layer->forward(f.stream, c.tokens, f.in, f.output, f.workspace, f.layout.total_bytes); },
                   c.message);
    expect_order(false);
    expect_exchange(f, 0, reinterpret_cast<int*>(f.at(f.layout.topk_ids)),
                    reinterpret_cast<float*>(f.at(f.layout.topk_weights)), f.in);
  }
}

TEST(DispatchedLayer, ARefusedCallLaunchesNothing) {
  Fixture f;
  const size_t need = static_cast<size_t>(f.layout.total_bytes);
  expect_refused([&] { f.layer->forward(f.stream, 5, f.in, f.output, f.workspace, need - 1); },
                 fmt::format("workspace_size: {} bytes is less than the {} bytes an all_to_all call needs", need - 1,
                             need));
  LayerInputs no_w2 = f.in;
  no_w2.w2 = nullptr;
  expect_refused([&] { f.layer->forward(f.stream, 5, no_w2, f.output, f.workspace, need); }, "w2");
  expect_refused([&] { f.layer->forward(f.stream, 5, f.in, nullptr, f.workspace, need); }, "output");
  expect_refused([&] { f.layer->experts(f.stream, 5, nullptr, nullptr, f.in, f.output, f.workspace, need); },
                 "topk_ids");
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(stub_calls().empty());
}

TEST(DispatchedLayer, TheWorkspaceAndLaunchesFollowTheCapacity) {
  Fixture f;
  EXPECT_EQ(f.layer->workspace_bytes(0), static_cast<size_t>(f.layout.total_bytes));
  EXPECT_EQ(f.layer->workspace_bytes(Fixture::kCapacity), static_cast<size_t>(f.layout.total_bytes));
  expect_refused([&] { f.layer->workspace_bytes(Fixture::kCapacity + 1); },
                 "max_tokens: 7 is more than max_tokens_per_rank = 6");
  const Plan& plan = *f.inner->plan();
  const int experts = plan_call(plan, Entry::Experts, Fixture::kRanks * Fixture::kCapacity).count;
  EXPECT_EQ(f.layer->launches(0), 2 + experts);
  EXPECT_EQ(f.layer->launches(5), plan_call(plan, Entry::Route, 5).count + 2 + experts + 1);
  EXPECT_EQ(f.layer->launches(7), 2 + experts) << "over C: the call serves the others only";
  const nlohmann::json described = nlohmann::json::parse(f.layer->describe());
  EXPECT_EQ(described.value("backend", ""), "recording") << described;
  EXPECT_EQ(described["all_to_all"],
            (nlohmann::json{{"nccl_ranks", 4}, {"nccl_rank", 2}, {"nccl_version", 22800},
                            {"max_tokens_per_rank", 6}, {"rows_per_call", 24}, {"rows_sent_as", "bf16"}}))
      << described;
}

TEST(DispatchedLayer, ABackendWithoutAPlanIsRefused) {
  class NoPlan final : public Layer {
   public:
    const MoeConfig& config() const override { return config_; }
    const Plan* plan() const override { return nullptr; }
    std::string describe() const override { return "{}"; }
    void forward(void*, int64_t, const LayerInputs&, void*, void*, size_t) const override {}
    void route(void*, int64_t, const void*, const float*, float*, int*) const override {}
    void experts(void*, int64_t, const int*, const float*, const LayerInputs&, void*, void*, size_t) const override {}
    int launches(int64_t) const override { return 0; }
    MoeConfig config_ = config_of(4, 2);
  };
  expect_refused([] { dispatch_over_group(std::make_unique<NoPlan>(), stub_comm(4, 2, 0), 6, nullptr); },
                 "ep_mode: all_to_all runs moejit's exchange kernels");
}

}  // namespace
}  // namespace moejit
