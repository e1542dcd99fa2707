/* Runs one DeepSeek-V3-shaped MoE layer through the C ABI (runtime/moejit.h).
 * Build: see examples/CMakeLists.txt (target moejit_c_api_example); run on a machine with a GPU:
 *   build/examples/moejit_c_api_example
 * The inputs are random bf16 data; the point is the call sequence an engine makes. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/moejit.h"

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    cudaError_t e = (call);                                                            \
    if (e != cudaSuccess) {                                                            \
      fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e));                \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

#define CHECK_MOEJIT(call)                                                             \
  do {                                                                                 \
    if ((call) != 0) {                                                                 \
      fprintf(stderr, "%s failed: %s\n", #call, moejit_last_error());                  \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

/* bf16 from a float by truncation is enough for example data. */
static unsigned short to_bf16(float f) {
  union { float f; unsigned u; } v = {f};
  return (unsigned short)(v.u >> 16);
}

static void* device_random_bf16(size_t n, float scale) {
  unsigned short* host = (unsigned short*)malloc(n * sizeof *host);
  for (size_t i = 0; i < n; ++i) host[i] = to_bf16(scale * ((float)rand() / RAND_MAX * 2.0f - 1.0f));
  void* device = NULL;
  if (cudaMalloc(&device, n * sizeof *host) == cudaSuccess)
    cudaMemcpy(device, host, n * sizeof *host, cudaMemcpyHostToDevice);
  free(host);
  return device;
}

int main(void) {
  /* Model load: compile (or load from the cache) every kernel of the layer. A smaller hidden size
   * keeps the example's memory small; any field of the preset can be overridden like this. */
  moejit_layer* layer = NULL;
  CHECK_MOEJIT(moejit_layer_create("deepseek-v3", "{\"hidden\": 1024, \"moe_intermediate\": 256}", &layer));
  printf("layer: %s\n", moejit_layer_config_json(layer));

  const int64_t tokens = 16, experts = 256, hidden = 1024, inter = 256;
  size_t workspace_bytes = 0;
  CHECK_MOEJIT(moejit_layer_workspace_bytes(layer, tokens, &workspace_bytes));

  moejit_inputs in = {0};
  in.hidden = device_random_bf16(tokens * hidden, 1.0f);
  in.router_logits = device_random_bf16(tokens * experts, 2.0f);
  in.w13 = device_random_bf16(experts * 2 * inter * hidden, 0.03f);
  in.w2 = device_random_bf16(experts * hidden * inter, 0.06f);
  float* bias = NULL;
  CHECK_CUDA(cudaMalloc((void**)&bias, experts * sizeof(float)));
  CHECK_CUDA(cudaMemset(bias, 0, experts * sizeof(float)));
  in.e_score_correction_bias = bias;
  void* out = NULL;
  void* workspace = NULL;
  CHECK_CUDA(cudaMalloc(&out, tokens * hidden * 2));
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));

  /* Per step: asynchronous on the caller's stream. */
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_MOEJIT(moejit_layer_forward(layer, stream, tokens, &in, out, workspace, workspace_bytes));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  unsigned short first[4];
  CHECK_CUDA(cudaMemcpy(first, out, sizeof first, cudaMemcpyDeviceToHost));
  printf("out[0][0:4] (bf16 bits) = %04x %04x %04x %04x; workspace %zu bytes\n", first[0], first[1], first[2],
         first[3], workspace_bytes);
  moejit_layer_destroy(layer);
  return 0;
}
