// Runs one preset's layer on the GPU with random inputs and prints its relative error against the
// float64 reference and its latency; on a machine with no GPU it says so and exits 0.
// The README's main command (scripts/run.sh) calls it.
//
//   layer_check [--preset NAME] [--tokens T] [--iters N] [--router-gemm true|false]
// (--router-gemm true: the layer computes its router logits from a random gate weight.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/device_buffer.h"
#include "common/error.h"
#include "runtime/layer.h"
#include "tests/reference/reference.h"

using namespace moejit;

namespace {

// Rounds `values` to `dtype` in place and returns the device bytes.
std::vector<char> to_device_bytes(std::vector<double>& values, DType dtype) {
  std::vector<char> bytes(values.size() * dtype_bytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::BF16) {
      __nv_bfloat16 b = __float2bfloat16_rn(f);
      values[i] = __bfloat162float(b);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    } else if (dtype == DType::FP16) {
      __half h = __float2half_rn(f);
      values[i] = __half2float(h);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      values[i] = f;
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    }
  }
  return bytes;
}

std::vector<double> uniform(size_t n, double scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

int run(const std::string& preset_name, int64_t tokens, int iters, bool router_gemm) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    fmt::print("no GPU here: the layer was compiled but not run\n");
    return 0;
  }
  MoeConfig c = preset(preset_name);
  if (c.quant != Quant::None) throw InvalidInput("layer_check runs unquantized presets");
  c.router_gemm = router_gemm;
  auto layer = Layer::create(c);
  const int64_t E = c.experts, H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  std::mt19937_64 rng(20261130);

  std::vector<double> hidden = uniform(tokens * H, 1.0, rng);
  std::vector<double> logits = uniform(tokens * E, 3.0, rng);
  // router_gemm: the layer computes the logits from a gate weight; the reference gets their exact
  // sums (routing near ties aside, what the layer routes on).
  std::vector<double> gate;
  if (c.router_gemm) {
    gate = uniform(E * H, 2.0 / std::sqrt(double(H)), rng);
    logits = reference::router_logits(c, tokens, hidden, gate);
  }
  std::vector<double> bias;
  if (c.topk_method == TopkMethod::NoauxTc) bias = uniform(E, 0.1, rng);
  reference::Weights w;
  w.w13 = uniform(c.gemm_experts() * N1 * H, 1.0 / std::sqrt(double(H)), rng);
  w.w2 = uniform(c.gemm_experts() * H * I, 1.0 / std::sqrt(double(I)), rng);
  if (c.expert_bias) {  // gpt-oss
    w.w13_bias = uniform(c.gemm_experts() * N1, 1.0, rng);
    w.w2_bias = uniform(c.gemm_experts() * H, 1.0, rng);
  }

  DeviceBuffer d_hidden(to_device_bytes(hidden, c.dtype));
  DeviceBuffer d_logits(to_device_bytes(logits, c.router_dtype));
  DeviceBuffer d_gate(c.router_gemm ? to_device_bytes(gate, c.dtype) : std::vector<char>{});
  DeviceBuffer d_w13(to_device_bytes(w.w13, c.dtype));
  DeviceBuffer d_w2(to_device_bytes(w.w2, c.dtype));
  std::vector<char> bias_bytes;
  if (!bias.empty()) bias_bytes = to_device_bytes(bias, DType::FP32);
  DeviceBuffer d_bias(bias_bytes);
  DeviceBuffer d_w13_bias(c.expert_bias ? to_device_bytes(w.w13_bias, DType::FP32) : std::vector<char>{});
  DeviceBuffer d_w2_bias(c.expert_bias ? to_device_bytes(w.w2_bias, DType::FP32) : std::vector<char>{});
  const size_t out_bytes = tokens * H * dtype_bytes(c.dtype);
  DeviceBuffer d_out(out_bytes);
  const size_t ws_bytes = layer->workspace_bytes(tokens);
  DeviceBuffer d_ws(ws_bytes);

  LayerInputs in;
  in.hidden = d_hidden.ptr;
  in.router_logits = c.router_gemm ? nullptr : d_logits.ptr;
  in.gate_weight = c.router_gemm ? d_gate.ptr : nullptr;
  in.w13 = d_w13.ptr;
  in.w2 = d_w2.ptr;
  if (!bias.empty()) in.e_score_correction_bias = static_cast<const float*>(d_bias.ptr);
  if (c.expert_bias) {
    in.w13_bias = static_cast<const float*>(d_w13_bias.ptr);
    in.w2_bias = static_cast<const float*>(d_w2_bias.ptr);
  }

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  CUDA_OK(cudaMemset(d_out.ptr, 0xff, out_bytes));  // poisoned: NaN until written
  layer->forward(stream, tokens, in, d_out.ptr, d_ws.ptr, ws_bytes);
  CUDA_OK(cudaStreamSynchronize(stream));

  std::vector<char> out_bytes_host(out_bytes);
  CUDA_OK(cudaMemcpy(out_bytes_host.data(), d_out.ptr, out_bytes, cudaMemcpyDeviceToHost));
  std::vector<double> got(tokens * H);
  for (size_t i = 0; i < got.size(); ++i) {
    if (c.dtype == DType::BF16) {
      __nv_bfloat16 b;
      std::memcpy(&b, out_bytes_host.data() + 2 * i, 2);
      got[i] = __bfloat162float(b);
    } else if (c.dtype == DType::FP16) {
      __half h;
      std::memcpy(&h, out_bytes_host.data() + 2 * i, 2);
      got[i] = __half2float(h);
    } else {
      float f;
      std::memcpy(&f, out_bytes_host.data() + 4 * i, 4);
      got[i] = f;
    }
  }
  reference::Layer ref = reference::layer(c, tokens, hidden, logits, bias, w, {});
  const double error = reference::relative_error(ref.experts.out, got);
  const double tolerance = c.dtype == DType::FP32 ? 1e-5 : 2e-2;

  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) layer->forward(stream, tokens, in, d_out.ptr, d_ws.ptr, ws_bytes);
  CUDA_OK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) layer->forward(stream, tokens, in, d_out.ptr, d_ws.ptr, ws_bytes);
  CUDA_OK(cudaEventRecord(stop, stream));
  CUDA_OK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_OK(cudaStreamDestroy(stream));

  fmt::print("{} T={}: relative error vs float64 reference {:.3e} (tolerance {:.0e}) {}; latency {:.1f} us "
             "per layer ({} launches; mean of {} eager calls, same inputs)\n",
             preset_name, tokens, error, tolerance, error <= tolerance ? "PASS" : "FAIL", 1000.0 * ms / iters,
             layer->launches(tokens), iters);
  return error <= tolerance ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "qwen3-30b-a3b";
  int64_t tokens = 64;
  int iters = 50;
  bool router_gemm = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--preset") name = argv[i + 1];
    else if (flag == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (flag == "--iters") iters = std::atoi(argv[i + 1]);
    else if (flag == "--router-gemm" && (std::strcmp(argv[i + 1], "true") == 0 || std::strcmp(argv[i + 1], "false") == 0))
      router_gemm = std::strcmp(argv[i + 1], "true") == 0;
    else if (flag == "--router-gemm") {
      fmt::print(stderr, "layer_check: --router-gemm {}: allowed values: true, false\n", argv[i + 1]);
      return 2;
    } else {
      fmt::print(stderr, "layer_check: unknown flag {}; flags: --preset, --tokens, --iters, --router-gemm\n", flag);
      return 2;
    }
  }
  try {
    return run(name, tokens, iters, router_gemm);
  } catch (const InvalidInput& e) {
    fmt::print(stderr, "layer_check: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "layer_check: {}\n", e.what());
    return 1;
  }
}
