// Expert parallel across this host's GPUs through the C++ API (issue 23's benchmark): a rank per GPU
// (one thread each, communicators from ncclCommInitAll), a preset's layer with ep_size = R, in the
// all_to_all mode (each rank its own T tokens, C = T) and the all_reduce mode (every rank the same T
// tokens). Per point, the slowest rank's time per layer call, split into:
//   compute  the rank's layer work alone: all_to_all, experts() of a plain layer on the R * T rows a
//            rank receives (uniformly random routing: T * K local pairs on average, as received);
//            all_reduce, the plain forward of the rank's experts on T tokens
//   comm     the call's NCCL work alone, on buffers of the same sizes: all_to_all, the dispatch group
//            (rows, ids, weights: R slabs of C rows each way) and the return group; all_reduce, the
//            ncclAllReduce of the T x H output
//   total    the layer call itself; total - compute - comm is the routing and exchange kernels and
//            what overlap there is (none is attempted)
// and the communication floor: the bytes that cross to other GPUs per rank over the all-to-all rate
// measured in the same run (every rank sending 64 MiB to every other at once, NCCL send/recv), also
// printed with the one-pair rate.
//
// Weights and activations are random (uniform); the weights are a 64 MiB random block repeated, so
// a rank's setup takes seconds, not minutes. Runs only with two or more GPUs (it says so otherwise).
//
//   moejit_ep_bench [--presets deepseek-v3 qwen3-235b-a22b] [--ranks 2 4 8] [--decode 1 2 4 ... 128]
//                   [--prefill 4096] [--modes all_to_all all_reduce] [--iters 20] [--out table.md]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench/device_buffer.h"
#include "common/error.h"
#include "runtime/layer.h"
#include "runtime/nccl.h"

using namespace moejit;

namespace {

// `bytes` of a 64 MiB block of bf16 values uniform in [-scale, scale], repeated.
std::unique_ptr<DeviceBuffer> random_bf16(size_t bytes, float scale, uint64_t seed) {
  auto out = std::make_unique<DeviceBuffer>(bytes);
  const size_t block = std::min<size_t>(bytes, size_t{64} << 20) / 2 * 2;
  std::vector<__nv_bfloat16> host(block / 2);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto& v : host) v = __float2bfloat16_rn(u(rng));
  for (size_t at = 0; at < bytes; at += block)
    CUDA_OK(cudaMemcpy(out->at(at), host.data(), std::min(block, bytes - at), cudaMemcpyHostToDevice));
  return out;
}

std::unique_ptr<DeviceBuffer> upload(const void* data, size_t bytes) {
  auto out = std::make_unique<DeviceBuffer>(bytes);
  CUDA_OK(cudaMemcpy(out->ptr, data, bytes, cudaMemcpyHostToDevice));
  return out;
}

// Runs fn(rank) on a thread per rank, each with its device current; rethrows the first failure.
void on_every_rank(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaFree(nullptr));
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Mean microseconds of `iters` calls of `call` on every rank (after warm-up calls), started together;
// the slowest rank's.
double time_ranks(int ranks, int iters, const std::function<void(int, cudaStream_t)>& call) {
  std::vector<double> us(static_cast<size_t>(ranks));
  std::barrier sync(ranks);
  on_every_rank(ranks, [&](int r) {
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; ++i) call(r, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    sync.arrive_and_wait();
    CUDA_OK(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) call(r, stream);
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    us[static_cast<size_t>(r)] = 1000.0 * ms / iters;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
  });
  return *std::max_element(us.begin(), us.end());
}

// One group of sends and receives: each rank sends `bytes` to every rank (itself included when
// `self`) from send + peer * bytes and receives likewise.
void exchange(const NcclLibrary& nccl, nccl::Comm comm, int ranks, int rank, const DeviceBuffer& send, const DeviceBuffer& recv,
              size_t bytes, bool self, cudaStream_t stream) {
  check_nccl(nccl.group_start(), "ncclGroupStart");
  for (int peer = 0; peer < ranks; ++peer) {
    if (peer == rank && !self) continue;
    const size_t at = static_cast<size_t>(peer) * bytes;
    check_nccl(nccl.send(send.at(at), bytes, 1 /* ncclUint8 */, peer, comm, stream), "ncclSend");
    check_nccl(nccl.recv(recv.at(at), bytes, 1, peer, comm, stream), "ncclRecv");
  }
  check_nccl(nccl.group_end(), "ncclGroupEnd");
}

struct Rates {
  double all_to_all_gbs = 0;  // per rank, out of it, everyone sending at once
  double pair_gbs = 0;        // rank 0 to rank 1 alone
};

Rates measure_links(const std::vector<nccl::Comm>& comms, int iters) {
  const int ranks = static_cast<int>(comms.size());
  const size_t chunk = size_t{64} << 20;
  const NcclLibrary& nccl = nccl_library();
  std::vector<std::unique_ptr<DeviceBuffer>> send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks));
  on_every_rank(ranks, [&](int r) {
    send[static_cast<size_t>(r)] = std::make_unique<DeviceBuffer>(chunk * ranks);
    recv[static_cast<size_t>(r)] = std::make_unique<DeviceBuffer>(chunk * ranks);
  });
  Rates rates;
  const double a2a_us = time_ranks(ranks, iters, [&](int r, cudaStream_t s) {
    exchange(nccl, comms[static_cast<size_t>(r)], ranks, r, *send[static_cast<size_t>(r)],
             *recv[static_cast<size_t>(r)], chunk, false, s);
  });
  rates.all_to_all_gbs = static_cast<double>(chunk) * (ranks - 1) / a2a_us / 1e3;
  const double pair_us = time_ranks(ranks, iters, [&](int r, cudaStream_t s) {
    if (r > 1) return;
    check_nccl(nccl.group_start(), "ncclGroupStart");
    if (r == 0) check_nccl(nccl.send(send[0]->ptr, chunk, 1, 1, comms[0], s), "ncclSend");
    if (r == 1) check_nccl(nccl.recv(recv[1]->ptr, chunk, 1, 0, comms[1], s), "ncclRecv");
    check_nccl(nccl.group_end(), "ncclGroupEnd");
  });
  rates.pair_gbs = static_cast<double>(chunk) / pair_us / 1e3;
  on_every_rank(ranks, [&](int r) {
    send[static_cast<size_t>(r)].reset();
    recv[static_cast<size_t>(r)].reset();
  });
  return rates;
}

// A rank's weights and inputs for up to `rows` rows.
struct RankData {
  MoeConfig config;
  std::unique_ptr<DeviceBuffer> w13, w2, bias, hidden, logits, ids, weights, out;
  LayerInputs inputs() const {
    LayerInputs in;
    in.hidden = hidden->ptr;
    in.router_logits = logits->ptr;
    in.w13 = w13->ptr;
    in.w2 = w2->ptr;
    if (bias) in.e_score_correction_bias = static_cast<const float*>(bias->ptr);
    return in;
  }
};

std::unique_ptr<RankData> make_rank_data(const MoeConfig& config, int64_t rows) {
  auto d = std::make_unique<RankData>();
  d->config = config;
  const int64_t E = config.experts, K = config.topk, H = config.hidden, N1 = config.gemm1_rows();
  const int64_t I = config.local_intermediate(), El = config.local_experts();
  // The rank's own experts; the same tokens on every rank (the all_reduce mode's premise).
  const uint64_t seed = 1000 + static_cast<uint64_t>(config.ep_rank), tokens_seed = 999;
  d->w13 = random_bf16(static_cast<size_t>(El * N1 * H * 2), 1.0f / std::sqrt(float(H)), seed);
  d->w2 = random_bf16(static_cast<size_t>(El * H * I * 2), 1.0f / std::sqrt(float(I)), seed + 1);
  d->hidden = random_bf16(static_cast<size_t>(rows * H * 2), 1.0f, tokens_seed);
  std::mt19937_64 rng(tokens_seed + 1);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * E));  // fp32: run_preset's router_dtype
  for (auto& v : logits) v = u(rng);
  d->logits = upload(logits.data(), logits.size() * 4);
  if (config.topk_method == TopkMethod::NoauxTc) {
    std::vector<float> bias(static_cast<size_t>(E), 0.0f);
    d->bias = upload(bias.data(), bias.size() * 4);
  }
  // A uniformly random routing of `rows` rows over the global experts (distinct per row), weights 1/K.
  std::vector<int> ids(static_cast<size_t>(rows * K));
  std::vector<int> experts(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) experts[static_cast<size_t>(e)] = e;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < K; ++j) std::swap(experts[static_cast<size_t>(j)], experts[j + rng() % (E - j)]);
    std::copy(experts.begin(), experts.begin() + K, ids.begin() + t * K);
  }
  std::vector<float> weights(ids.size(), 1.0f / static_cast<float>(K));
  d->ids = upload(ids.data(), ids.size() * 4);
  d->weights = upload(weights.data(), weights.size() * 4);
  d->out = std::make_unique<DeviceBuffer>(static_cast<size_t>(rows * H * 2));
  return d;
}

struct Point {
  std::string preset, mode;
  int ranks = 0;
  int64_t tokens = 0;
  double total = 0, compute = 0, comm = 0, floor = 0;
  double crossing_mb = 0;
};

// Every point of one preset at `ranks` GPUs.
std::vector<Point> run_preset(const std::string& name, int ranks, const std::vector<int64_t>& token_counts,
                              const std::vector<std::string>& modes, int iters, const Rates& rates,
                              const std::vector<nccl::Comm>& comms) {
  MoeConfig base = preset(name);
  base.ep_size = ranks;
  base.router_dtype = DType::FP32;
  const int64_t max_t = *std::max_element(token_counts.begin(), token_counts.end());
  const int64_t H = base.hidden, K = base.topk, row = H * 2;
  std::vector<std::unique_ptr<RankData>> data(static_cast<size_t>(ranks));
  on_every_rank(ranks, [&](int r) {
    MoeConfig c = base;
    c.ep_rank = r;
    data[static_cast<size_t>(r)] = make_rank_data(c, ranks * max_t);
  });
  std::vector<Point> points;
  const NcclLibrary& nccl = nccl_library();
  for (const std::string& mode : modes)
    for (int64_t T : token_counts) {
      Point p{name, mode, ranks, T};
      const bool a2a = mode == "all_to_all";
      std::vector<std::unique_ptr<Layer>> layers(static_cast<size_t>(ranks)), plain(static_cast<size_t>(ranks));
      std::vector<std::unique_ptr<DeviceBuffer>> ws(static_cast<size_t>(ranks)), plain_ws(static_cast<size_t>(ranks));
      std::vector<std::unique_ptr<DeviceBuffer>> send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks));
      const int64_t compute_rows = a2a ? ranks * T : T;
      on_every_rank(ranks, [&](int r) {
        const size_t i = static_cast<size_t>(r);
        LayerOptions options;
        options.nccl_comm = comms[i];
        if (a2a) {
          options.ep_mode = ExpertParallelMode::AllToAll;
          options.max_tokens_per_rank = T;
        }
        layers[i] = Layer::create(data[i]->config, options);
        plain[i] = Layer::create(data[i]->config);
        ws[i] = std::make_unique<DeviceBuffer>(layers[i]->workspace_bytes(T));
        plain_ws[i] = std::make_unique<DeviceBuffer>(plain[i]->workspace_bytes(compute_rows));
        // all_to_all: the dispatch's three arrays and the return, each R slabs of T rows.
        const size_t slab = static_cast<size_t>(T * (a2a ? row + 8 * K : row));
        send[i] = std::make_unique<DeviceBuffer>(slab * ranks);
        recv[i] = std::make_unique<DeviceBuffer>(slab * ranks);
      });
      p.total = time_ranks(ranks, iters, [&](int r, cudaStream_t s) {
        const auto& d = *data[static_cast<size_t>(r)];
        layers[static_cast<size_t>(r)]->forward(s, T, d.inputs(), d.out->ptr, ws[static_cast<size_t>(r)]->ptr,
                                                ws[static_cast<size_t>(r)]->bytes);
      });
      p.compute = time_ranks(ranks, iters, [&](int r, cudaStream_t s) {
        const auto& d = *data[static_cast<size_t>(r)];
        const auto& w = *plain_ws[static_cast<size_t>(r)];
        if (a2a)
          plain[static_cast<size_t>(r)]->experts(s, compute_rows, static_cast<const int*>(d.ids->ptr),
                                                 static_cast<const float*>(d.weights->ptr), d.inputs(), d.out->ptr,
                                                 w.ptr, w.bytes);
        else
          plain[static_cast<size_t>(r)]->forward(s, T, d.inputs(), d.out->ptr, w.ptr, w.bytes);
      });
      p.comm = time_ranks(ranks, iters, [&](int r, cudaStream_t s) {
        const size_t i = static_cast<size_t>(r);
        if (a2a) {  // the dispatch (rows with ids and weights, one message each per peer here) and the return
          exchange(nccl, comms[i], ranks, r, *send[i], *recv[i], static_cast<size_t>(T * (row + 8 * K)), true, s);
          exchange(nccl, comms[i], ranks, r, *recv[i], *send[i], static_cast<size_t>(T * row), true, s);
        } else {
          check_nccl(nccl.all_reduce(send[i]->ptr, send[i]->ptr, static_cast<size_t>(T * H), nccl::kBfloat16,
                                     nccl::kSum, comms[i], s),
                     "ncclAllReduce");
        }
      });
      // Bytes leaving each rank for other GPUs: all_to_all, R - 1 slabs out and back; all_reduce, a
      // ring's 2 (R - 1) / R of the output.
      const double bytes = a2a ? double(ranks - 1) * T * (2 * row + 8 * K) : 2.0 * (ranks - 1) / ranks * T * row;
      p.crossing_mb = bytes / 1e6;
      p.floor = bytes / (rates.all_to_all_gbs * 1e3);
      points.push_back(p);
      on_every_rank(ranks, [&](int r) {
        const size_t i = static_cast<size_t>(r);
        layers[i].reset();
        plain[i].reset();
        ws[i].reset();
        plain_ws[i].reset();
        send[i].reset();
        recv[i].reset();
      });
      fmt::print(stderr, "  {} R={} {} T={}: {:.1f} us\n", name, ranks, mode, T, p.total);
    }
  on_every_rank(ranks, [&](int r) { data[static_cast<size_t>(r)].reset(); });
  return points;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moejit expert-parallel benchmark (a rank per GPU of this host, NCCL)"};
  std::vector<std::string> presets = {"deepseek-v3", "qwen3-235b-a22b"};
  std::vector<int> rank_counts = {2, 4, 8};
  std::vector<int64_t> decode = {1, 2, 4, 8, 16, 32, 64, 128};
  int64_t prefill = 4096;
  std::vector<std::string> modes = {"all_to_all", "all_reduce"};
  int iters = 20;
  std::string out_path;
  app.add_option("--presets", presets, "presets to run");
  app.add_option("--ranks", rank_counts, "GPU counts (each <= the GPUs present)");
  app.add_option("--decode", decode, "decode token counts per rank");
  app.add_option("--prefill", prefill, "the prefill token count per rank (0: none)");
  app.add_option("--modes", modes, "all_to_all, all_reduce")->check(CLI::IsMember({"all_to_all", "all_reduce"}));
  app.add_option("--iters", iters, "timed calls per point")->check(CLI::PositiveNumber);
  app.add_option("--out", out_path, "also write the table (markdown) here");
  CLI11_PARSE(app, argc, argv);
  try {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
      fmt::print("moejit_ep_bench: {} GPU(s) here; expert parallel across GPUs needs two or more: nothing run\n",
                 devices);
      return 0;
    }
    std::vector<int64_t> tokens = decode;
    if (prefill > 0) tokens.push_back(prefill);
    std::string table = fmt::format(
        "Expert parallel, C++ API, a rank per GPU ({} present), NCCL {}; times per layer call, the slowest rank's "
        "mean of {} calls. compute: the rank's layer work alone; comm: the call's NCCL work alone; floor: bytes "
        "crossing to other GPUs per rank / the measured all-to-all rate. Anchor (DeepEP low-latency, H800, EP8, "
        "H 7168, top-8, 128 tokens per rank): dispatch 77 us + combine 114 us.\n\n",
        devices, nccl_library().version, iters);
    for (int ranks : rank_counts) {
      if (ranks > devices) {
        table += fmt::format("R = {}: skipped ({} GPUs present)\n\n", ranks, devices);
        continue;
      }
      std::vector<nccl::Comm> comms(static_cast<size_t>(ranks));
      std::vector<int> ids(static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) ids[static_cast<size_t>(r)] = r;
      check_nccl(nccl_library().comm_init_all(comms.data(), ranks, ids.data()), "ncclCommInitAll");
      const Rates rates = measure_links(comms, iters);
      table += fmt::format("R = {}: all-to-all {:.0f} GB/s out of each rank (64 MiB to every peer at once), one pair "
                           "{:.0f} GB/s\n\n| preset | mode | T/rank | total us | compute us | comm us | other us | "
                           "MB crossing/rank | floor us | comm/floor |\n|---|---|---|---|---|---|---|---|---|---|\n",
                           ranks, rates.all_to_all_gbs, rates.pair_gbs);
      for (const std::string& name : presets)
        for (const Point& p : run_preset(name, ranks, tokens, modes, iters, rates, comms))
          table += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.2f} |\n",
                               p.preset, p.mode, p.tokens, p.total, p.compute, p.comm, p.total - p.compute - p.comm,
                               p.crossing_mb, p.floor, p.floor > 0 ? p.comm / p.floor : 0.0);
      table += "\n";
      for (nccl::Comm c : comms) nccl_library().comm_destroy(c);
    }
    fmt::print("{}", table);
    if (!out_path.empty()) {
      std::FILE* f = std::fopen(out_path.c_str(), "w");
      if (!f) throw Error(fmt::format("--out: cannot write {}", out_path));
      std::fputs(table.c_str(), f);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "moejit_ep_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
