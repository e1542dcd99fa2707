#include "runtime/reduced_layer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/nccl.h"

namespace moejit {
namespace {

class ReducedLayer final : public Layer {
 public:
  ReducedLayer(std::unique_ptr<Layer> inner, nccl::Comm comm) : inner_(std::move(inner)), comm_(comm) {
    check_nccl(nccl_library().comm_user_rank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(nccl_library().comm_count(comm_, &ranks_), "ncclCommCount");
  }

  const MoeConfig& config() const override { return inner_->config(); }
  const Plan* plan() const override { return inner_->plan(); }
  size_t workspace_bytes(int64_t max_tokens) const override { return inner_->workspace_bytes(max_tokens); }
  // moejit's kernels only: the all-reduce's are NCCL's.
  int launches(int64_t tokens) const override { return inner_->launches(tokens); }

  // The inner layer's JSON object with the group added.
  std::string describe() const override {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(inner_->describe());
    j["all_reduce"] = {{"nccl_ranks", ranks_}, {"nccl_rank", rank_}, {"nccl_version", nccl_library().version}};
    return j.dump();
  }

  void forward(void* stream, int64_t tokens, const LayerInputs& inputs, void* output, void* workspace,
               size_t workspace_size) const override {
    inner_->forward(stream, tokens, rank_residual(inputs), output, workspace, workspace_size);
    sum_over_ranks(stream, tokens, output);
  }

  void route(void* stream, int64_t tokens, const void* router_logits, const float* e_score_correction_bias,
             float* topk_weights, int* topk_ids) const override {
    // Every rank routes the same tokens the same way: nothing to sum.
    inner_->route(stream, tokens, router_logits, e_score_correction_bias, topk_weights, topk_ids);
  }

  void experts(void* stream, int64_t tokens, const int* topk_ids, const float* topk_weights,
               const LayerInputs& inputs, void* output, void* workspace, size_t workspace_size) const override {
    inner_->experts(stream, tokens, topk_ids, topk_weights, rank_residual(inputs), output, workspace, workspace_size);
    sum_over_ranks(stream, tokens, output);
  }

 private:
  LayerInputs rank_residual(const LayerInputs& inputs) const {
    LayerInputs in = inputs;
    if (rank_ != 0) in.residual = nullptr;  // added once, by rank 0
    return in;
  }

  // Every rank has the same T (the same tokens), so every rank makes this call or none does.
  void sum_over_ranks(void* stream, int64_t tokens, void* output) const {
    if (tokens == 0) return;
    const size_t count = static_cast<size_t>(tokens) * static_cast<size_t>(config().hidden);
    check_nccl(nccl_library().all_reduce(output, output, count, nccl_type(config().dtype), nccl::kSum, comm_,
                                         static_cast<CUstream>(stream)),
               "ncclAllReduce (the layer's output over its expert- and tensor-parallel ranks)");
  }

  std::unique_ptr<Layer> inner_;
  nccl::Comm comm_;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace

void check_reduce_group(const MoeConfig& config, void* nccl_comm, int ordinal) {
  const NcclLibrary& nccl = nccl_library();
  const auto comm = static_cast<nccl::Comm>(nccl_comm);
  int ranks = 0, device = -1;
  check_nccl(nccl.comm_count(comm, &ranks), "ncclCommCount (nccl_comm)");
  check_nccl(nccl.comm_cu_device(comm, &device), "ncclCommCuDevice (nccl_comm)");
  const int64_t want = int64_t{config.ep_size} * config.tp_size;
  if (ranks != want)
    throw InvalidInput(fmt::format("nccl_comm: the communicator has {} ranks; the layer sums its output over "
                                   "ep_size * tp_size = {} * {} = {} ranks",
                                   ranks, config.ep_size, config.tp_size, want));
  if (device != ordinal)
    throw InvalidInput(fmt::format("nccl_comm: the communicator is on device {}, the layer on device {}", device,
                                   ordinal));
}

std::unique_ptr<Layer> reduce_over_group(std::unique_ptr<Layer> layer, void* nccl_comm) {
  return std::make_unique<ReducedLayer>(std::move(layer), static_cast<nccl::Comm>(nccl_comm));
}

}  // namespace moejit
