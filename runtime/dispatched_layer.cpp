#include "runtime/dispatched_layer.h"

#include <algorithm>
#include <array>
#include <span>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compiler/families/exchange.h"
#include "compiler/workspace.h"
#include "runtime/layer_checks.h"
#include "runtime/nccl.h"

namespace moejit {
namespace {

constexpr int64_t kAlign = 256;

int64_t align_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

class DispatchedLayer final : public Layer {
 public:
  DispatchedLayer(std::unique_ptr<Layer> inner, nccl::Comm comm, int64_t capacity,
                  std::unique_ptr<ExchangeKernels> kernels)
      : inner_(std::move(inner)),
        kernels_(std::move(kernels)),
        comm_(comm),
        capacity_(capacity),
        fp8_(is_fp8(inner_->config().quant)),
        groups_(exchange_scale_groups(inner_->config())) {
    require_point_to_point(nccl_library());
    check_nccl(nccl_library().comm_user_rank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(nccl_library().comm_count(comm_, &ranks_), "ncclCommCount");
    rows_ = int64_t{ranks_} * capacity_;
    layout_ = dispatch_workspace(config(), capacity_, inner_->workspace_bytes(rows_));
  }

  const MoeConfig& config() const override { return inner_->config(); }
  const Plan* plan() const override { return inner_->plan(); }

  // Fixed by C: every call moves and computes C rows per rank whatever its T.
  size_t workspace_bytes(int64_t max_tokens) const override {
    check_token_count(config(), max_tokens, "max_tokens");
    if (max_tokens > capacity_) throw InvalidInput(over_capacity("max_tokens", max_tokens));
    return static_cast<size_t>(layout_.total_bytes);
  }

  // moejit's kernels of a forward: the routing of this rank's tokens (fp8: and their quantization),
  // slots and pack, the local experts on ep_size * C rows, the combine (the exchanges' kernels are
  // NCCL's). With T == 0 the call still serves the other ranks.
  int launches(int64_t tokens) const override {
    tokens = own_tokens(tokens);  // outside [0, C]: the call serves the others only
    const Plan& plan = *inner_->plan();
    const int own = tokens > 0 ? plan_call(plan, Entry::Route, tokens).count + (fp8_ ? 1 : 0) + 1 : 0;
    return own + 2 + plan_call(plan, Entry::Experts, rows_, fp8_).count;
  }

  // The inner layer's JSON object with the group and the exchange added.
  std::string describe() const override {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(inner_->describe());
    j["all_to_all"] = {{"nccl_ranks", ranks_},
                       {"nccl_rank", rank_},
                       {"nccl_version", nccl_library().version},
                       {"max_tokens_per_rank", capacity_},
                       {"rows_per_call", rows_},
                       {"rows_sent_as", fp8_ ? "e4m3" : std::string(to_string(config().dtype))}};
    return j.dump();
  }

  void forward(void* stream, int64_t tokens, const LayerInputs& in, void* output, void* workspace,
               size_t workspace_size) const override {
    const int64_t own = own_tokens(tokens);
    check_forward_routing_arguments(config(), own, in);
    if (config().router_gemm) throw Error("moejit internal error: an all_to_all layer with router_gemm");
    char* ws = check_call(own, in, output, workspace, workspace_size);
    auto* weights = reinterpret_cast<float*>(ws + layout_.topk_weights);
    auto* ids = reinterpret_cast<int*>(ws + layout_.topk_ids);
    if (own > 0) inner_->route(stream, own, in.router_logits, in.e_score_correction_bias, weights, ids);
    exchange(static_cast<CUstream>(stream), own, ids, weights, in, output, ws);
    if (own != tokens) throw InvalidInput(over_capacity("tokens", tokens));
  }

  void route(void* stream, int64_t tokens, const void* router_logits, const float* e_score_correction_bias,
             float* topk_weights, int* topk_ids) const override {
    // A rank's own tokens, routed where they are: nothing crosses the group.
    inner_->route(stream, tokens, router_logits, e_score_correction_bias, topk_weights, topk_ids);
  }

  void experts(void* stream, int64_t tokens, const int* topk_ids, const float* topk_weights, const LayerInputs& in,
               void* output, void* workspace, size_t workspace_size) const override {
    const int64_t own = own_tokens(tokens);
    if (own > 0) {
      check_pointer(topk_ids, "topk_ids", 4);
      check_pointer(topk_weights, "topk_weights", 4);
    }
    if (in.hidden_scale)
      throw InvalidInput("hidden_scale: an all_to_all layer takes hidden in the model dtype (an fp8 layer quantizes "
                         "the rows itself before the dispatch)");
    char* ws = check_call(own, in, output, workspace, workspace_size);
    exchange(static_cast<CUstream>(stream), own, topk_ids, topk_weights, in, output, ws);
    if (own != tokens) throw InvalidInput(over_capacity("tokens", tokens));
  }

 private:
  std::string over_capacity(const char* field, int64_t tokens) const {
    const char* served = std::string(field) == "tokens"
                             ? "; this call computed nothing for this rank's tokens (it served the other ranks' "
                               "rows, so their calls complete)"
                             : "";
    if (tokens < 0) return fmt::format("{}: {} is negative; allowed 0..{}{}", field, tokens, capacity_, served);
    return fmt::format("{}: {} is more than max_tokens_per_rank = {}, the slab every rank of the all_to_all group "
                       "sends each other rank{}",
                       field, tokens, capacity_, served);
  }

  // The tokens this rank sends: T, or none when T is outside [0, C] (the call still serves the other
  // ranks, then throws: a rank that left the exchange would leave them waiting until NCCL's timeout).
  int64_t own_tokens(int64_t tokens) const { return tokens < 0 || tokens > capacity_ ? 0 : tokens; }

  // Every check before the first launch, so that a refused call launches nothing (the other ranks
  // then wait in the exchange: a refusal is the caller's bug, and NCCL's timeout ends them). The
  // local experts' arguments are checked here too, on the buffers they will get. (What the inner
  // layer can still refuse after the dispatch, a tensor map it cannot encode or a module load during
  // capture in a context it has not run in, throws from its experts() call and leaves the others to
  // NCCL's timeout: an error on every rank rather than sums they cannot tell are wrong.)
  char* check_call(int64_t own, const LayerInputs& in, void* output, void* workspace, size_t workspace_size) const {
    if (own > 0) {
      check_pointer(in.hidden, "hidden", 16);
      check_pointer(output, "output", 16);
      if (in.residual) check_pointer(in.residual, "residual", 16);
    }
    check_pointer(workspace, "workspace", static_cast<size_t>(kAlign));
    if (workspace_size < static_cast<size_t>(layout_.total_bytes))
      throw InvalidInput(fmt::format("workspace_size: {} bytes is less than the {} bytes an all_to_all call needs "
                                     "(workspace_bytes(); fixed by max_tokens_per_rank = {})",
                                     workspace_size, layout_.total_bytes, capacity_));
    char* ws = static_cast<char*>(workspace);
    check_expert_arguments(config(), rows_, local_inputs(in, ws), ws + layout_.partial, ws + layout_.inner,
                           static_cast<size_t>(layout_.inner_bytes));
    return ws;
  }

  // The local experts' inputs: the received rows (fp8: quantized, with their scales), this rank's
  // weights, no residual (added once, by the token's own rank, in the combine).
  LayerInputs local_inputs(const LayerInputs& in, char* ws) const {
    LayerInputs local = in;
    local.hidden = ws + layout_.recv_rows;
    local.hidden_scale = fp8_ ? reinterpret_cast<const float*>(ws + layout_.recv_scales) : nullptr;
    local.router_logits = nullptr;
    local.residual = nullptr;
    return local;
  }

  void exchange(CUstream stream, int64_t own, const int* ids, const float* weights, const LayerInputs& in,
                void* output, char* ws) const {
    const auto at = [ws](int64_t offset) { return ws + offset; };
    auto* quantized_scale = reinterpret_cast<float*>(at(layout_.quantized_scale));
    if (fp8_)
      kernels_->quantize(stream,
                         QuantizeArgs{in.hidden, nullptr, nullptr, nullptr, 0, nullptr,
                                      reinterpret_cast<signed char*>(at(layout_.quantized)), quantized_scale},
                         own);
    kernels_->slots(stream, ExchangeSlotsArgs{ids, own, capacity_, reinterpret_cast<int*>(at(layout_.slot_of)),
                                              reinterpret_cast<int*>(at(layout_.source))});
    kernels_->pack(stream,
                   ExchangePackArgs{fp8_ ? at(layout_.quantized) : in.hidden, fp8_ ? quantized_scale : nullptr, ids,
                                    weights, reinterpret_cast<const int*>(at(layout_.source)), at(layout_.send_rows),
                                    fp8_ ? reinterpret_cast<float*>(at(layout_.send_scales)) : nullptr,
                                    reinterpret_cast<int*>(at(layout_.send_ids)),
                                    reinterpret_cast<float*>(at(layout_.send_weights))},
                   capacity_);
    const int64_t H = config().hidden, K = config().topk;
    const int64_t row_bytes = H * static_cast<int64_t>(dtype_bytes(config().dtype));
    const int row_type = nccl_type(config().dtype);
    // On the stack: a call allocates nothing (the fp8 scales are the fourth array).
    const std::array<Slabs, 4> dispatch = {
        fp8_ ? Slabs{at(layout_.send_rows), at(layout_.recv_rows), H, H, nccl::kUint8}
             : Slabs{at(layout_.send_rows), at(layout_.recv_rows), row_bytes, H, row_type},
        Slabs{at(layout_.send_ids), at(layout_.recv_ids), K * 4, K, nccl::kInt32},
        Slabs{at(layout_.send_weights), at(layout_.recv_weights), K * 4, K, nccl::kFloat32},
        Slabs{at(layout_.send_scales), at(layout_.recv_scales), groups_ * 4, groups_, nccl::kFloat32}};
    send_and_receive(stream, std::span(dispatch).first(fp8_ ? 4 : 3),
                     fp8_ ? "the dispatch of the tokens' fp8 rows, top-k ids, weights and row scales"
                          : "the dispatch of the tokens' rows, top-k ids and weights");
    inner_->experts(stream, rows_, reinterpret_cast<const int*>(at(layout_.recv_ids)),
                    reinterpret_cast<const float*>(at(layout_.recv_weights)), local_inputs(in, ws), at(layout_.partial),
                    at(layout_.inner), static_cast<size_t>(layout_.inner_bytes));
    // The sums go back into send_rows, which the dispatch no longer needs.
    const Slabs returned{at(layout_.partial), at(layout_.send_rows), row_bytes, H, row_type};
    send_and_receive(stream, std::span(&returned, 1), "the combine's return of the experts' sums");
    kernels_->combine(stream, ExchangeCombineArgs{at(layout_.send_rows),
                                                  reinterpret_cast<const int*>(at(layout_.slot_of)), in.residual,
                                                  output, own, capacity_});
  }

  // One slab array: rank r's slab is C rows of row_bytes from r * C rows on.
  struct Slabs {
    const char* send;
    char* recv;
    int64_t row_bytes;
    int64_t row_count;  // elements of `type` in a row
    int type;
  };

  // Every slab to its rank and every rank's slab in, as one NCCL group (one launch). The group is
  // always closed, even when a call in it fails, so that the communicator stays usable. Messages are
  // formatted only on failure: a call allocates nothing.
  void send_and_receive(CUstream stream, std::span<const Slabs> arrays, const char* what) const {
    const NcclLibrary& nccl = nccl_library();
    const int started = nccl.group_start();
    if (started != nccl::kSuccess) check_nccl(started, fmt::format("ncclGroupStart ({})", what).c_str());
    int failed = nccl::kSuccess;
    const char* failed_call = "";
    for (const Slabs& a : arrays)
      for (int peer = 0; peer < ranks_ && failed == nccl::kSuccess; ++peer) {
        const int64_t offset = int64_t{peer} * capacity_ * a.row_bytes;
        const size_t count = static_cast<size_t>(capacity_ * a.row_count);
        failed = nccl.send(a.send + offset, count, a.type, peer, comm_, stream);
        failed_call = "ncclSend";
        if (failed == nccl::kSuccess) {
          failed = nccl.recv(a.recv + offset, count, a.type, peer, comm_, stream);
          failed_call = "ncclRecv";
        }
      }
    const int ended = nccl.group_end();
    if (failed != nccl::kSuccess)
      check_nccl(failed, fmt::format("{} ({}, all_to_all over {} ranks)", failed_call, what, ranks_).c_str());
    if (ended != nccl::kSuccess)
      check_nccl(ended, fmt::format("ncclGroupEnd ({}, all_to_all over {} ranks)", what, ranks_).c_str());
  }

  std::unique_ptr<Layer> inner_;
  std::unique_ptr<ExchangeKernels> kernels_;  // destroyed before inner_ (which may hold the context)
  nccl::Comm comm_;
  int64_t capacity_;
  bool fp8_;  // rows travel quantized, with groups_ scales each
  int64_t groups_;
  int rank_ = 0, ranks_ = 1;
  int64_t rows_ = 0;
  DispatchWorkspace layout_;
};

}  // namespace

void check_dispatch_group(const MoeConfig& config, void* nccl_comm, int ordinal, int64_t capacity) {
  const int64_t most = max_layer_tokens(config) / config.ep_size;
  if (capacity < 1 || capacity > most)
    throw InvalidInput(fmt::format("max_tokens_per_rank: {} is outside 1..{}: ep_mode all_to_all needs the most "
                                   "tokens a call may take on a rank, and runs the local experts on ep_size * "
                                   "max_tokens_per_rank rows ({} x {} pairs must stay below 2^31)",
                                   capacity, most, config.ep_size, config.topk));
  if (config.tp_size != 1)
    throw InvalidInput(fmt::format("tp_size: {}; ep_mode all_to_all needs tp_size 1 (a token's row goes to the "
                                   "one rank that holds each of its experts whole); use all_reduce",
                                   config.tp_size));
  if (config.router_gemm)
    throw InvalidInput("router_gemm: true; ep_mode all_to_all routes from router_logits before the dispatch, and "
                       "does not run the router GEMM yet (compute the logits beside the layer, or use all_reduce)");
  if (config.fuse_shared_experts)
    throw InvalidInput("fuse_shared_experts: true; ep_mode all_to_all does not run fused shared experts yet (pass "
                       "them through residual, or use all_reduce)");
  const NcclLibrary& nccl = nccl_library();
  require_point_to_point(nccl);
  const auto comm = static_cast<nccl::Comm>(nccl_comm);
  int ranks = 0, rank = -1, device = -1;
  check_nccl(nccl.comm_count(comm, &ranks), "ncclCommCount (nccl_comm)");
  check_nccl(nccl.comm_user_rank(comm, &rank), "ncclCommUserRank (nccl_comm)");
  check_nccl(nccl.comm_cu_device(comm, &device), "ncclCommCuDevice (nccl_comm)");
  if (ranks != config.ep_size)
    throw InvalidInput(fmt::format("nccl_comm: the communicator has {} ranks; ep_mode all_to_all needs ep_size = {} "
                                   "(a rank per expert slice)",
                                   ranks, config.ep_size));
  if (rank != config.ep_rank)
    throw InvalidInput(fmt::format("nccl_comm: this is rank {} of the communicator but the config has ep_rank {}; "
                                   "ep_mode all_to_all sends expert e's rows to rank e / E_loc, so the two must be "
                                   "equal",
                                   rank, config.ep_rank));
  if (device != ordinal)
    throw InvalidInput(fmt::format("nccl_comm: the communicator is on device {}, the layer on device {}", device,
                                   ordinal));
}

DispatchWorkspace dispatch_workspace(const MoeConfig& config, int64_t capacity, size_t inner_bytes) {
  const int64_t ranks = config.ep_size, rows = ranks * capacity, K = config.topk, G = exchange_scale_groups(config);
  const int64_t row_bytes = config.hidden * static_cast<int64_t>(dtype_bytes(config.dtype));
  // What a dispatched row is: fp8 layers send e4m3 bytes.
  const int64_t sent_bytes = is_fp8(config.quant) ? config.hidden : row_bytes;
  DispatchWorkspace w;
  int64_t end = 0;
  const auto take = [&end](int64_t bytes) {
    const int64_t offset = end;
    end = align_up(offset + bytes);
    return offset;
  };
  w.inner_bytes = static_cast<int64_t>(inner_bytes);
  w.inner = take(w.inner_bytes);
  w.topk_weights = take(capacity * K * 4);
  w.topk_ids = take(capacity * K * 4);
  w.quantized = take(G > 0 ? capacity * config.hidden : 0);
  w.quantized_scale = take(capacity * G * 4);
  w.slot_of = take(capacity * ranks * 4);
  w.source = take(rows * 4);
  w.send_rows = take(rows * std::max(sent_bytes, row_bytes));  // the returned sums land here too
  w.send_ids = take(rows * K * 4);
  w.send_weights = take(rows * K * 4);
  w.send_scales = take(rows * G * 4);
  w.recv_rows = take(rows * sent_bytes);
  w.recv_ids = take(rows * K * 4);
  w.recv_weights = take(rows * K * 4);
  w.recv_scales = take(rows * G * 4);
  w.partial = take(rows * row_bytes);
  w.total_bytes = end;
  return w;
}

std::unique_ptr<Layer> dispatch_over_group(std::unique_ptr<Layer> layer, void* nccl_comm, int64_t capacity,
                                           std::unique_ptr<ExchangeKernels> kernels) {
  if (!layer->plan())
    throw InvalidInput("ep_mode: all_to_all runs moejit's exchange kernels and experts() on the received rows; "
                       "this device's backend plans no kernels (use all_reduce)");
  return std::make_unique<DispatchedLayer>(std::move(layer), static_cast<nccl::Comm>(nccl_comm), capacity,
                                           std::move(kernels));
}

}  // namespace moejit
