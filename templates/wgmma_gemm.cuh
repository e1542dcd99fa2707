// Stages 4 and 5 on Hopper's warpgroup MMA (sm_90a only): the grouped GEMM of grouped_gemm.cuh,
// C[p, n] = sum_k A[p, k] * W[e, n, k], for bf16/fp16 operands in the nk layout, fp32 accumulate,
// and for the quantized layers' 8-bit operands (below).
// For row tiles of 64, 128 and 192 (the mid and prefill buckets; 192 in the "wide" one), where
// mma.sync's register-fed tensor cores top out near 45% of the H200's matmul rate.
//
// Warp-specialized: BM / 64 consumer warpgroups (128 threads each) own 64 rows of the block's
// BM-row tile each and issue wgmma.mma_async m64nNk16 with both operands read from shared memory
// through matrix descriptors, N = the tile's weight rows (the gate and up rows of BN columns for
// gated GEMM 1: BN <= 128; BN <= 256 otherwise; at most 192 with three consumers, whose 512
// threads leave 128 registers each). One producer warpgroup fills a ring of kStages
// shared-memory stages (128-byte swizzle layout): the weight tile by TMA (args.w_map, one box per
// half), the A rows with cp.async (GEMM 1 gathers them). Stage hand-offs are mbarriers: "full"
// completes when the producer's copies and the TMA bytes of a stage have landed, "empty" when every
// consumer warp has retired the wgmma group that read it. Consumers keep one wgmma group in flight,
// the producer runs up to kStages k-tiles ahead, and nobody waits at a block-wide barrier.
//
// It fuses what mma_gemm.cuh fuses: GEMM 1's gather is in its cp.async loads; act(gate) * up is
// applied to the accumulators (a thread holds the gate and the up value of the same column);
// GEMM 2 stores Y in sorted order for the fixed-order combine. Grid: as mma_gemm.cuh (1-D,
// grouped rasterization; blocks past *num_tiles exit).
//
// 8-bit operands (int8 for w8a8, e4m3 for fp8): a stage is the same 128 bytes deep, so 128
// elements (one fp8 scale block) instead of 64; the producer copies rows as pairs of bytes and the
// TMA maps the weights so (the pipeline is the 16-bit one, byte for byte); the wgmma is k32
// (e4m3 x e4m3 -> f32, s8 x s8 -> s32). int8 and fp8_tensor scale the sums once, in the epilogue:
// a_scale[row] times w_scale[e][column] (int8) or w_scale[e] (fp8_tensor). fp8_block scales every
// K block: each k-tile's wgmmas start a fresh partial sum (scale-d off), and once they are done its
// a_scale[row][kt] * w_scale[e][row block][kt] multiply it into a running fp32 sum in registers,
// as DeepGEMM does; meanwhile the other consumer warpgroup keeps the tensor cores busy. Past 128
// weight rows the partial sums run in two passes of half the rows per k-tile (PASSES), so that the
// running sum of 256 rows and one pass's partials (128 + 64 registers) fit: a 128 x 256 tile moves
// a quarter fewer bytes per multiply-add through L2 than 128 x 128 (bench/RESULTS.md, session 14). GEMM 1 of a quantized layer stores fp32 (the
// activation, times act_smooth for int8) for the re-quantization, except where it quantizes the
// activation itself (kQuantizeOut: fp8_block with whole 128-column scale groups per tile, e4m3 into
// out and the group scales into out_scale); GEMM 2 stores the model dtype.
//
// Spec:
//   using A, W (one type: __nv_bfloat16, __half, signed char or moejit::e4m3), Out (the model's
//   16-bit type, or float for a quantized GEMM 1)
//   kBM (64, 128 or 192: a consumer warpgroup per 64 rows), kWarpsM = kBM / 16 + 4 (the consumer
//   warps and the producer warpgroup; threads = 2 * kBM + 128), kWarpsN = 1,
//   kBN (output columns; (kGated ? 2 : 1) * kBN is 64, 128, 192 or 256, at most 192 when kBM is
//   192; kBM at most 128 with kBlockScaling), kBK = 64 (16-bit) or 128 (8-bit), kStages >= 2, kGroupRows
//   kN, kK (rows of 16-byte chunks), kGemm1, kGated, kAct, kSwigluLimit, kBias, kGather, kTopk, kWeightsBeforeWait (as
//   mma_gemm.cuh)
//   8-bit only: kScaling (common.cuh's ScalingKind), kScaleCols, kScaleRows (grouped_gemm.cuh),
//   kQuantizeOut (Out is then e4m3)
//   kSharedBytes: the dynamic shared memory the launch provides (the pipeline, the source row
//   table, two mbarriers per stage, the epilogue's vectors (EPILOGUE_FLOATS) and 1024 bytes to
//   align the tiles to the swizzle period)
#pragma once

#include "moejit/fp8.cuh"
#include "moejit/gemm_tiles.cuh"

#define MOEJIT_WGMMA_D64 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}"
#define MOEJIT_WGMMA_D96 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
    "}"
#define MOEJIT_WGMMA_D128 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}"
#define MOEJIT_WGMMA_D192 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
    "}"
#define MOEJIT_WGMMA_D256 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
    "}"
#define MOEJIT_WGMMA_F8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MOEJIT_WGMMA_F32(i) MOEJIT_WGMMA_F8(i), MOEJIT_WGMMA_F8(i + 8), MOEJIT_WGMMA_F8(i + 16), MOEJIT_WGMMA_F8(i + 24)
#define MOEJIT_WGMMA_F48(i) MOEJIT_WGMMA_F32(i), MOEJIT_WGMMA_F8(i + 32), MOEJIT_WGMMA_F8(i + 40)
#define MOEJIT_WGMMA_F64(i) MOEJIT_WGMMA_F32(i), MOEJIT_WGMMA_F32(i + 32)
#define MOEJIT_WGMMA_F96(i) MOEJIT_WGMMA_F64(i), MOEJIT_WGMMA_F32(i + 64)
#define MOEJIT_WGMMA_F128(i) MOEJIT_WGMMA_F64(i), MOEJIT_WGMMA_F64(i + 64)
// The same for int32 accumulators (s8 x s8).
#define MOEJIT_WGMMA_R8(i) \
  "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]), "+r"(d[i + 7])
#define MOEJIT_WGMMA_R32(i) MOEJIT_WGMMA_R8(i), MOEJIT_WGMMA_R8(i + 8), MOEJIT_WGMMA_R8(i + 16), MOEJIT_WGMMA_R8(i + 24)
#define MOEJIT_WGMMA_R64(i) MOEJIT_WGMMA_R32(i), MOEJIT_WGMMA_R32(i + 32)
#define MOEJIT_WGMMA_R96(i) MOEJIT_WGMMA_R64(i), MOEJIT_WGMMA_R32(i + 64)
#define MOEJIT_WGMMA_R128(i) MOEJIT_WGMMA_R64(i), MOEJIT_WGMMA_R64(i + 64)

namespace moejit {
namespace wgmma_detail {

// D[64 x N] += A[64 x 16] * B[N x 16]^T, both K-major in shared memory (descriptors a, b).
#define MOEJIT_WGMMA_OP(N, FLOATS, A_ARG, B_ARG, ONE_ARG, PTX_TYPE, C_TYPE)                                   \
  __device__ __forceinline__ void mma_async(float(&d)[FLOATS], unsigned long long a, unsigned long long b,      \
                                            const C_TYPE*) {                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ONE_ARG ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " " MOEJIT_WGMMA_D##N \
                 ", %" #A_ARG ", %" #B_ARG ", p, 1, 1, 0, 0;\n}\n"                                             \
                 : MOEJIT_WGMMA_F##FLOATS(0)                                                                   \
                 : "l"(a), "l"(b), "r"(1));                                                                    \
  }
MOEJIT_WGMMA_OP(64, 32, 32, 33, 34, "bf16", __nv_bfloat16)
MOEJIT_WGMMA_OP(128, 64, 64, 65, 66, "bf16", __nv_bfloat16)
MOEJIT_WGMMA_OP(192, 96, 96, 97, 98, "bf16", __nv_bfloat16)
MOEJIT_WGMMA_OP(256, 128, 128, 129, 130, "bf16", __nv_bfloat16)
MOEJIT_WGMMA_OP(64, 32, 32, 33, 34, "f16", __half)
MOEJIT_WGMMA_OP(128, 64, 64, 65, 66, "f16", __half)
MOEJIT_WGMMA_OP(192, 96, 96, 97, 98, "f16", __half)
MOEJIT_WGMMA_OP(256, 128, 128, 129, 130, "f16", __half)
#undef MOEJIT_WGMMA_OP

// 8-bit operands, K = 32: D[64 x N] (+)= A[64 x 32] * B[N x 32]^T; `accumulate` false overwrites D
// (scale-d): fp8_block starts each K block's partial sum so.
#define MOEJIT_WGMMA_OP8(N, FLOATS, A_ARG, B_ARG, ONE_ARG, PTX_TYPES, SCALES, C_TYPE, D_TYPE, D_REGS)             \
  __device__ __forceinline__ void mma_async(D_TYPE(&d)[FLOATS], unsigned long long a, unsigned long long b,      \
                                            const C_TYPE*, bool accumulate = true) {                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ONE_ARG ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32." PTX_TYPES " " MOEJIT_WGMMA_D##N ", %" #A_ARG      \
                 ", %" #B_ARG ", p" SCALES ";\n}\n"                                                             \
                 : D_REGS##FLOATS(0)                                                                            \
                 : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));                                         \
  }
MOEJIT_WGMMA_OP8(64, 32, 32, 33, 34, "f32.e4m3.e4m3", ", 1, 1", e4m3, float, MOEJIT_WGMMA_F)
// n96: half of fp8_block's 192-weight-row tile (below).
MOEJIT_WGMMA_OP8(96, 48, 48, 49, 50, "f32.e4m3.e4m3", ", 1, 1", e4m3, float, MOEJIT_WGMMA_F)
MOEJIT_WGMMA_OP8(128, 64, 64, 65, 66, "f32.e4m3.e4m3", ", 1, 1", e4m3, float, MOEJIT_WGMMA_F)
MOEJIT_WGMMA_OP8(192, 96, 96, 97, 98, "f32.e4m3.e4m3", ", 1, 1", e4m3, float, MOEJIT_WGMMA_F)
MOEJIT_WGMMA_OP8(256, 128, 128, 129, 130, "f32.e4m3.e4m3", ", 1, 1", e4m3, float, MOEJIT_WGMMA_F)
MOEJIT_WGMMA_OP8(64, 32, 32, 33, 34, "s32.s8.s8", "", signed char, int, MOEJIT_WGMMA_R)
MOEJIT_WGMMA_OP8(128, 64, 64, 65, 66, "s32.s8.s8", "", signed char, int, MOEJIT_WGMMA_R)
MOEJIT_WGMMA_OP8(192, 96, 96, 97, 98, "s32.s8.s8", "", signed char, int, MOEJIT_WGMMA_R)
MOEJIT_WGMMA_OP8(256, 128, 128, 129, 130, "s32.s8.s8", "", signed char, int, MOEJIT_WGMMA_R)
#undef MOEJIT_WGMMA_OP8

// Matrix descriptor (PTX ISA, "shared memory matrix layout") of a K-major tile of 64-element rows
// in the 128-byte swizzle layout: 8-row groups 1024 bytes apart (stride byte offset), the leading
// byte offset unused by this layout (1 by convention), swizzle mode 1 = 128 bytes.
__device__ __forceinline__ unsigned long long descriptor(const void* tile_start) {
  const unsigned long long address = tile::shared_address(tile_start);
  return ((address & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}

// cp.async writes through the generic proxy and wgmma reads through the async proxy: a consumer
// that has seen a stage's copies land makes them visible to its async proxy before its wgmma.
__device__ __forceinline__ void fence_shared_for_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void barrier_init(unsigned long long* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tile::shared_address(bar)), "r"(arrivals) : "memory");
}

// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void barrier_wait(unsigned long long* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nmoejit_wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra moejit_wait;\n}\n" ::"r"(tile::shared_address(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tile::shared_address(bar)) : "memory");
}

// Arrives on the barrier and adds `bytes` to the transaction count its phase waits for (the TMA
// copies that complete_tx on it).
__device__ __forceinline__ void barrier_arrive_expecting(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tile::shared_address(bar)), "r"(bytes)
               : "memory");
}

// Makes barrier initializations visible to the async proxy (the TMA unit completes transactions on
// them); the block barrier after it publishes them to the other threads.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// TMA: copies the box at (k0, row0, plane) of the 3-D tensor map (64 elements x the box's rows,
// 128-byte swizzle: the layout tile::swizzled describes) to shared memory at dst (1024-byte
// aligned); the bytes land through the async proxy and complete on `bar`. Rows and columns outside
// the tensor are zero-filled.
__device__ __forceinline__ void load_box(void* dst, const TensorMap* map, int k0, int row0, int plane,
                                         unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(tile::shared_address(dst)),
      "l"(map), "r"(k0), "r"(row0), "r"(plane), "r"(tile::shared_address(bar))
      : "memory");
}

// Arrives on the barrier once every cp.async this thread issued so far has landed (.noinc: the
// arrival counts against the count the barrier was initialized with).
__device__ __forceinline__ void barrier_arrive_when_copied(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(tile::shared_address(bar)) : "memory");
}

// Waits until `threads` threads (whole warps) have arrived at named barrier ID (1..15; 0 is
// __syncthreads'), so a subset of the block can synchronize. ID is a constant: with a run-time id
// ptxas reserves all 16 barriers.
template <int ID>
__device__ __forceinline__ void named_barrier_sync(int threads) {
  static_assert(ID > 0 && ID < 16, "named barriers 1..15");
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(threads) : "memory");
}

// Pins the accumulators in place: the compiler may not move their reads or writes across this
// point, so nothing touches them while a wgmma that owns them is in flight.
template <int FLOATS>
__device__ __forceinline__ void fence_accumulators(float (&d)[FLOATS]) {
#pragma unroll
  for (int i = 0; i < FLOATS; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int FLOATS>
__device__ __forceinline__ void fence_accumulators(int (&d)[FLOATS]) {
#pragma unroll
  for (int i = 0; i < FLOATS; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

}  // namespace wgmma_detail

// `args` must be the kernel's __grid_constant__ parameter: the TMA reads args.w_map where it lies.
template <typename Spec>
__device__ void grouped_gemm_wgmma(const GemmArgs& args) {
  using namespace wgmma_detail;
  using namespace tile;
  using Operand = typename Spec::A;                     // what the wgmma multiplies
  using T = typename PipelineUnit<Operand>::type;       // what the pipeline copies: 16 bits
  using Acc = typename Accumulator<Operand>::type;
  using Out = typename Spec::Out;
  constexpr bool EIGHT_BIT = sizeof(Operand) == 1;
  constexpr int SCALING = Scaling<Spec, EIGHT_BIT>::kind;
  constexpr bool BLOCK = SCALING == kBlockScaling;     // a running sum, scaled per K block
  constexpr int ELEMENTS_PER_UNIT = static_cast<int>(sizeof(T) / sizeof(Operand));
  // BK and K below count pipeline units: a k-tile of 64 units is 128 bytes of a row.
  constexpr int BM = Spec::kBM, BN = Spec::kBN, BK = Spec::kBK / ELEMENTS_PER_UNIT, STAGES = Spec::kStages;
  constexpr int CONSUMERS = BM / 64;            // consumer warpgroups; the producer comes after them
  constexpr int THREADS = 128 * (CONSUMERS + 1);
  constexpr int HALVES = Spec::kGated ? 2 : 1;  // gate rows, then up rows of the same columns
  constexpr int W_ROWS = HALVES * BN;           // the wgmma's N
  constexpr int FLOATS = W_ROWS / 2;            // accumulators per thread: 64 x W_ROWS over 128 threads
  // fp8_block past 128 weight rows: a k-tile's wgmmas run in two passes of half the rows each, so
  // that one pass's partial sums and the running sum of all rows fit a thread's registers.
  constexpr int PASSES = BLOCK && W_ROWS > 128 ? 2 : 1;
  constexpr int PASS_ROWS = W_ROWS / PASSES, PASS_FLOATS = FLOATS / PASSES;
  // fp8_block's weight scale segments: runs of consecutive weight rows (a half, or a pass where
  // passes outnumber halves) of at most 128 rows, so each meets at most one scale-block edge.
  constexpr int SEGMENTS = HALVES > PASSES ? HALVES : PASSES, SEG_ROWS = W_ROWS / SEGMENTS;
  constexpr long long N = Spec::kN, K = Spec::kK / ELEMENTS_PER_UNIT;
  static_assert(Spec::kK % ELEMENTS_PER_UNIT == 0, "8-bit rows of whole byte pairs");
  constexpr int A_STAGE = BM * BK, W_STAGE = W_ROWS * BK;  // units
  constexpr int K_TILES = static_cast<int>((K + BK - 1) / BK);
  constexpr int COL_TILES = static_cast<int>((N + BN - 1) / BN);
  static_assert(BM == 64 || BM == 128 || BM == 192, "one to three consumer warpgroups of 64 rows");
  static_assert(32 * Spec::kWarpsM * Spec::kWarpsN == THREADS, "the launch's threads");
  static_assert(W_ROWS == 64 || W_ROWS == 128 || W_ROWS == 192 || W_ROWS == 256, "wgmma N of 64, 128, 192 or 256");
  // Three consumer warpgroups make 512 threads, which leave 128 registers each: 96 accumulators fit.
  static_assert(CONSUMERS < 3 || W_ROWS <= 192, "BM 192 takes at most 192 weight rows");
  static_assert(BK == 64, "the 128-byte swizzle holds 64-unit rows");
  static_assert(STAGES >= 2, "a ring of at least two stages");
  static_assert(sizeof(T) == 2, "16-bit pipeline units");
  static_assert(!BLOCK || CONSUMERS <= 2, "fp8_block keeps a running sum beside the partial one");
  static_assert(!BLOCK || (SEG_ROWS <= 128 && PASS_ROWS % SEG_ROWS == 0), "a pass holds whole segments of at most 128 rows");
  // fp8_block's running sum of 192 or 256 weight rows beside a pass's partial sums outgrows the 168
  // registers a thread of 384 has; the producer warpgroup, which needs few, hands registers to the
  // consumers (setmaxnreg).
  constexpr bool SHIFT_REGISTERS = BLOCK && CONSUMERS == 2 && W_ROWS > 128;
  static_assert(!BLOCK || Spec::kBK == Scaling<Spec, EIGHT_BIT>::cols, "a k-tile is one scale block");
  // The epilogue's per-column vectors of the tile, a copy per consumer warpgroup in shared memory
  // (see the consumers): int8's channel scale per weight row and GEMM 1's act_smooth per output
  // column, the expert bias per weight row (zero past N or where the bias is null).
  constexpr bool CHANNEL = SCALING == kRowChannelScaling;
  constexpr int CHANNEL_AT = 0, BIAS_AT = CHANNEL ? W_ROWS : 0;
  constexpr int SMOOTH_AT = BIAS_AT + (Spec::kBias ? W_ROWS : 0);
  constexpr int EPILOGUE_FLOATS = SMOOTH_AT + (CHANNEL && Spec::kGemm1 ? BN : 0);
  static_assert(static_cast<long long>(STAGES) * (A_STAGE + W_STAGE) * 2 + BM * 8 + STAGES * 16 +
                        CONSUMERS * EPILOGUE_FLOATS * 4 + 1024 <=
                    Spec::kSharedBytes,
                "the launch's shared memory must hold the pipeline and the epilogue's vectors");

  // The swizzle pattern repeats every 1024 bytes and the descriptors address tiles from such a
  // boundary; every stage tile is a multiple of 1024 bytes.
  // (Declared as in mma_gemm.cuh, which may share the unit; the 1024-byte alignment is done here.)
  extern __shared__ __align__(128) unsigned char shared_raw[];
  unsigned char* shared_base = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  T* a_smem = reinterpret_cast<T*>(shared_base);
  T* w_smem = a_smem + STAGES * A_STAGE;
  long long* a_row = reinterpret_cast<long long*>(w_smem + STAGES * W_STAGE);
  unsigned long long* full = reinterpret_cast<unsigned long long*>(a_row + BM);
  unsigned long long* empty = full + STAGES;

  const Position at = grouped_position<Spec::kGroupRows>(COL_TILES);
  const ScheduledTile scheduled = scheduled_tile(args, at.tile);
  const int tiles = scheduled.tiles, expert = scheduled.expert;
  const long long row0 = scheduled.row0;
  if (at.tile >= tiles) return wait_in_body<Spec::kWeightsBeforeWait>();
  const long long n0 = static_cast<long long>(at.col_tile) * BN;
  const int warpgroup = threadIdx.x / 128;
  const bool tma_thread = threadIdx.x == 128 * CONSUMERS;  // the producer's first thread

  // The weight boxes of the first STAGES k-tiles depend on the expert and n0 alone: the TMA thread
  // initializes the "full" barriers and issues them before the tile's rows and source rows are
  // resolved (a chain of dependent reads), so a tile's first weights land that much earlier; the
  // block barrier in resolve_source_rows publishes the barriers before anyone else uses them.
  // Each such barrier then waits for these bytes, the arrival of the TMA thread that armed it and
  // the producer's A copies of that stage (below).
  auto issue_weights = [&](int slot, int kt) {
    barrier_arrive_expecting(full + slot, W_STAGE * sizeof(T));  // whole boxes, zero-filled parts too
#pragma unroll
    for (int h = 0; h < HALVES; ++h)
      load_box(w_smem + slot * W_STAGE + h * BN * BK, &args.w_map, kt * BK, static_cast<int>(n0), expert * HALVES + h,
               full + slot);
  };
  if (tma_thread) {
    for (int s = 0; s < STAGES; ++s) barrier_init(full + s, 128 + 1);  // the producer's A copies, the TMA
    fence_barrier_init();
    for (int s = 0; s < STAGES && s < K_TILES; ++s) issue_weights(s, s);
  }
  // GEMM 2's first weight boxes are on their way before GEMM 1, whose output is its A, has
  // finished (kWeightsBeforeWait); nothing below reads what the previous kernel writes before this.
  wait_in_body<Spec::kWeightsBeforeWait>();

  const int rows = static_cast<int>(min(static_cast<long long>(BM), args.expert_offsets[expert + 1] - row0));
  // An expert's last tile often has 64 rows or fewer: a consumer warpgroup whose rows all lie
  // past `rows` has no work, and leaving at once gives the others the tensor cores.
  const int consumers = min(CONSUMERS, (rows + 63) / 64);
  if (threadIdx.x < STAGES) barrier_init(empty + threadIdx.x, 4 * consumers);  // every working consumer warp
  resolve_source_rows<BM, THREADS, Spec::kGather, Spec::kTopk>(args, row0, rows, a_row);  // and a barrier

  // SHIFT_REGISTERS: setmaxnreg moves registers within the block, whose launch holds 384 x 168:
  // the producer frees 128 x (168 - 56), exactly the consumers' 256 x (224 - 168). (The frees must
  // cover the takes: with 48 / 232 the consumers were 1024 short and setmaxnreg.inc waited forever,
  // a hang on the H200; at 40 the producer's gather spilled 8 bytes.) Each role's first
  // instruction, so ptxas allocates each role's code for its count.
  if (warpgroup == CONSUMERS) {
    if constexpr (SHIFT_REGISTERS) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    // Producer: fills slot kt % STAGES once the consumers have emptied its previous use; its first
    // thread has the weight tile copied by TMA (a box per half; the first STAGES were issued above),
    // every thread copies A rows.
    // NOTES: prefetching the weight lines of k-tile kt + STAGES into L2 here (prefetch.global.L2,
    // one per row) was measured on the H200 and made every prefill point slower (Mixtral T=4096
    // 5.37 -> 6.73 ms, bench/RESULTS.md).
    const SourceRows<T, BM, 128, K> a_rows(static_cast<const T*>(args.a), a_row, threadIdx.x - 128 * CONSUMERS);
    int slot = 0, round = 0;  // kt % STAGES, kt / STAGES
    for (int kt = 0; kt < K_TILES; ++kt) {
      if (round > 0) {
        barrier_wait(empty + slot, (round - 1) & 1);
        if (tma_thread) issue_weights(slot, kt);
      }
      a_rows.load(a_smem + slot * A_STAGE, kt);
      barrier_arrive_when_copied(full + slot);
      if (++slot == STAGES) slot = 0, ++round;
    }
    // The producer may exit with copies in flight: they land in shared memory of a block that
    // lives on, since every consumer waits on their "full" barrier before it finishes.
    return;
  }

  // Consumers. (fence_shared_for_async below is for the A rows, which cp.async writes through the
  // generic proxy; the TMA's weights are in the async proxy already.)
  if constexpr (SHIFT_REGISTERS) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  if (warpgroup >= consumers) return;
  // The epilogue's vectors, copied by this warpgroup while the main loop runs and waited for after
  // it (sync_warpgroup below). (Read with __ldg per element in the epilogue, they were a chain of
  // L2 and HBM misses after the main loop: int8's GEMMs ran 1.3x to 2.7x fp8_tensor's time on the
  // same tiles, bench/RESULTS.md session 15.)
  float* epilogue_vectors = reinterpret_cast<float*>(empty + STAGES) + warpgroup * EPILOGUE_FLOATS;
  auto sync_warpgroup = [&] {  // this warpgroup's 128 threads (barrier ids are constants)
    switch (warpgroup) {
      case 0: named_barrier_sync<2>(128); break;
      case 1: named_barrier_sync<3>(128); break;
      default: named_barrier_sync<4>(128); break;
    }
  };
  if constexpr (EPILOGUE_FLOATS > 0) {
    for (int i = threadIdx.x % 128; i < EPILOGUE_FLOATS; i += 128) {
      const float* src = nullptr;
      long long column;
      if (i < SMOOTH_AT) {  // a weight row's channel scale or bias
        const int row = i < BIAS_AT ? i - CHANNEL_AT : i - BIAS_AT, half = row / BN;
        column = n0 + row % BN;
        const float* base = i < BIAS_AT ? args.w_scale : args.bias;
        if (base != nullptr && column < N) src = base + (expert * HALVES + half) * N + column;
      } else {  // an output column's act_smooth
        column = n0 + (i - SMOOTH_AT);
        if (column < N) src = args.act_smooth + expert * N + column;
      }
      copy_4_async(shared_address(epilogue_vectors + i), src != nullptr ? src : args.w, src != nullptr);
    }
    commit_async();
  }
  // Thread (warp w of its warpgroup, lane l) holds rows 16 w + l / 4 and 8 more, columns
  // 8 j + 2 (l % 4) and the next, of every 8-column group j: acc[4 j + 2 h + {0, 1}] for row half h.
  // Gated: group j < BN / 8 is the gate of output columns 8 j.., group j + BN / 8 their up rows.
  const int lane = threadIdx.x % 32;
  const int row_base = warpgroup * 64 + (threadIdx.x % 128) / 32 * 16 + lane / 4;
  // The source rows of this thread's two rows (-1: no row), for their activation scales (8-bit).
  const long long source_row[2] = {EIGHT_BIT ? a_row[row_base] : -1, EIGHT_BIT ? a_row[row_base + 8] : -1};
  // Scales per A row; weight scale blocks per expert (8-bit only).
  constexpr long long SCALE_COLS = Scaling<Spec, EIGHT_BIT>::cols, SCALE_ROWS = Scaling<Spec, EIGHT_BIT>::rows;
  constexpr long long A_GROUPS = (Spec::kK + SCALE_COLS - 1) / SCALE_COLS;
  constexpr long long W_ROW_BLOCKS = (HALVES * N + SCALE_ROWS - 1) / SCALE_ROWS;

  Acc acc[PASS_FLOATS];
  float total[BLOCK ? FLOATS : 1];  // fp8_block: the running sum
#pragma unroll
  for (int i = 0; i < PASS_FLOATS; ++i) acc[i] = Acc(0);
#pragma unroll
  for (int i = 0; i < (BLOCK ? FLOATS : 1); ++i) total[i] = 0.0f;
  // fp8_block: the weight rows of segment s (from s * N + n0 for a gate or up half, n0 + s * SEG_ROWS
  // for a pass) meet at most one block edge: columns below `edge` have row block first_block[s], the
  // others the next one.
  int first_block[SEGMENTS], edge[SEGMENTS];
#pragma unroll
  for (int s = 0; s < SEGMENTS; ++s) {
    const long long first_row = (Spec::kGated ? s * N : s * SEG_ROWS) + n0;
    first_block[s] = static_cast<int>(first_row / SCALE_ROWS);
    edge[s] = static_cast<int>((first_block[s] + 1) * SCALE_ROWS - first_row);
  }
  const float* w_block_scales = BLOCK ? args.w_scale + expert * W_ROW_BLOCKS * A_GROUPS : nullptr;
  // A segment never meets a block edge when its rows divide the block height and N is a multiple of
  // it (n0 is a multiple of BN, BN of SEG_ROWS): one weight scale per segment and k-tile, the select
  // per column group gone.
  constexpr bool ONE_BLOCK = BLOCK && SCALE_ROWS % SEG_ROWS == 0 && Spec::kN % SCALE_ROWS == 0;

  const bool arrives = threadIdx.x % 32 == 0;  // one arrival per warp on "empty"
  int slot = 0, round = 0, previous = STAGES - 1;  // kt % STAGES, kt / STAGES, (kt - 1) % STAGES
  for (int kt = 0; kt < K_TILES; ++kt) {
    barrier_wait(full + slot, round & 1);
    fence_shared_for_async();
    const T* as = a_smem + slot * A_STAGE + warpgroup * 64 * BK;
    const T* ws = w_smem + slot * W_STAGE;
    if constexpr (BLOCK) {
      // This k-tile's scales, read while its first wgmmas run: the rows' activation scales and, per
      // segment, the weight scales of its (at most two) row blocks.
      float row_scale[2], block_scale[SEGMENTS][2], one_scale[SEGMENTS][2];
#pragma unroll
      for (int pass = 0; pass < PASSES; ++pass) {
        fence_accumulators(acc);
        fence();
        // Each pass's wgmmas start a fresh partial sum of its PASS_ROWS weight rows.
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)  // 16 units = 32 bytes along the swizzled rows
          mma_async(acc, descriptor(as + kk * 16), descriptor(ws + pass * PASS_ROWS * BK + kk * 16),
                    static_cast<const Operand*>(nullptr), kk > 0);
        commit();
        if (pass == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            row_scale[h] = source_row[h] >= 0 ? __ldg(args.a_scale + source_row[h] * A_GROUPS + kt) : 0.0f;
#pragma unroll
          for (int g = 0; g < SEGMENTS; ++g) {
            block_scale[g][0] =
                first_block[g] < W_ROW_BLOCKS ? __ldg(w_block_scales + first_block[g] * A_GROUPS + kt) : 0.0f;
            block_scale[g][1] = !ONE_BLOCK && edge[g] < SEG_ROWS && first_block[g] + 1 < W_ROW_BLOCKS
                                    ? __ldg(w_block_scales + (first_block[g] + 1) * A_GROUPS + kt)
                                    : 0.0f;
            // ONE_BLOCK: row scale x the segment's weight scale
#pragma unroll
            for (int h = 0; h < 2; ++h) one_scale[g][h] = row_scale[h] * block_scale[g][0];
          }
        }
        wait<0>();  // the pass's partial sums are complete (and, after the last pass, its stage is read)
        fence_accumulators(acc);
        if (pass == PASSES - 1 && arrives) barrier_arrive(empty + slot);
#pragma unroll
        for (int j = 0; j < PASS_ROWS / 8; ++j) {
          const int group = pass * (PASS_ROWS / 8) + j;  // of the tile's W_ROWS / 8
          const int g = group / (SEG_ROWS / 8), column = (group % (SEG_ROWS / 8)) * 8 + (lane % 4) * 2;
          const float w_scale = column < edge[g] ? block_scale[g][0] : block_scale[g][1];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float scale = ONE_BLOCK ? one_scale[g][h] : row_scale[h] * w_scale;
            float* sum = total + pass * PASS_FLOATS + 4 * j + 2 * h;
            sum[0] = fmaf(acc[4 * j + 2 * h], scale, sum[0]);
            sum[1] = fmaf(acc[4 * j + 2 * h + 1], scale, sum[1]);
          }
        }
      }
    } else {
      fence_accumulators(acc);
      fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)  // 16 units = 32 bytes along the swizzled rows
        mma_async(acc, descriptor(as + kk * 16), descriptor(ws + kk * 16), static_cast<const Operand*>(nullptr));
      commit();
      wait<1>();  // the group of k-tile kt - 1 is done; kt's runs on
      fence_accumulators(acc);
      if (kt > 0 && arrives) barrier_arrive(empty + previous);
      previous = slot;
    }
    if (++slot == STAGES) slot = 0, ++round;
  }
  wait<0>();
  fence_accumulators(acc);
  if constexpr (EPILOGUE_FLOATS > 0) {
    wait_async<0>();  // this thread's vector copies have landed
    sync_warpgroup();  // and so have the warpgroup's
  }

  // Epilogue.
  Out* out = static_cast<Out*>(args.out);
  // int8 and fp8_tensor: the rows' activation scales and the expert's tensor scale.
  float row_scale[2] = {1.0f, 1.0f};
  if constexpr (SCALING == kRowChannelScaling || SCALING == kTensorScaling) {
#pragma unroll
    for (int h = 0; h < 2; ++h) row_scale[h] = source_row[h] >= 0 ? __ldg(args.a_scale + source_row[h]) : 0.0f;
  }
  float tensor_scale = 1.0f;
  if constexpr (SCALING == kTensorScaling) tensor_scale = __ldg(args.w_scale + expert);
  // The sum of accumulator 4 j + 2 h + e, scaled back for 8-bit operands (int8: by its weight
  // row's channel scale; the tile's weight row j * 8 + (lane % 4) * 2 + e is half * N + column).
  auto scaled = [&](int j, int h, int e) -> float {
    const int i = 4 * j + 2 * h + e;
    if constexpr (BLOCK) {
      return total[i];
    } else if constexpr (SCALING == kRowChannelScaling) {
      const float channel = epilogue_vectors[CHANNEL_AT + j * 8 + (lane % 4) * 2 + e];  // 0 past N
      return static_cast<float>(acc[i]) * row_scale[h] * channel;
    } else if constexpr (SCALING == kTensorScaling) {
      return acc[i] * row_scale[h] * tensor_scale;
    } else {
      return acc[i];
    }
  };
  // ... plus the expert's bias of that weight row (kBias).
  auto sum = [&](int j, int h, int e) -> float {
    float v = scaled(j, h, e);
    if constexpr (Spec::kBias) {
      const long long column = n0 + (j % (BN / 8)) * 8 + (lane % 4) * 2 + e;
      if (args.bias != nullptr && column < N) v += epilogue_vectors[BIAS_AT + j * 8 + (lane % 4) * 2 + e];
    }
    return v;
  };
  // The value of accumulator pair (j, h), activated (and gated) for GEMM 1 (int8: times act_smooth).
  auto output_pair = [&](int j, int h, float& x, float& y) {
    x = sum(j, h, 0);
    y = sum(j, h, 1);
    if constexpr (Spec::kGemm1) {
      if constexpr (Spec::kGated) {
        x = gated_activation<Spec::kAct>(x, sum(j + BN / 8, h, 0), Spec::kSwigluLimit);
        y = gated_activation<Spec::kAct>(y, sum(j + BN / 8, h, 1), Spec::kSwigluLimit);
      } else {
        x = activate<Spec::kAct>(x);
        y = activate<Spec::kAct>(y);
      }
      if constexpr (SCALING == kRowChannelScaling) {
        const long long column = n0 + j * 8 + (lane % 4) * 2;
        if (column < N) {
          x *= epilogue_vectors[SMOOTH_AT + j * 8 + (lane % 4) * 2];
          y *= epilogue_vectors[SMOOTH_AT + j * 8 + (lane % 4) * 2 + 1];
        }
      }
    }
  };
  // Through shared memory: a warp's direct stores would write 4 (16-bit) or 2 (e4m3) bytes a lane
  // into each of 8 rows, part sectors that L2 merges one by one; staged, each thread stores 16
  // bytes and a warp covers its rows' BN contiguous elements each (whole 128-byte lines where the
  // row bytes of N and n0 are multiples of 128; N a multiple of 16 bytes keeps every row's chunks
  // 16-byte aligned). The stage reuses the pipeline, whose last reads every working consumer has
  // retired at the first barrier; rows are PITCH elements apart, 16 bytes more than a row, so the
  // pair stores of a warp hit distinct banks. `stage_values(staged, pitch)` writes this thread's
  // pairs at staged + h * 8 * pitch + j * 8 (row half h, 8-column group j).
  auto store_staged = [&](auto&& stage_values) {
    constexpr int UNIT = 16 / static_cast<int>(sizeof(Out));  // elements per 16-byte chunk
    constexpr int PITCH = BN + UNIT, CHUNKS = BN / UNIT;
    static_assert(BN % UNIT == 0, "whole 16-byte chunks per tile row");
    static_assert(BM * PITCH * sizeof(Out) <= static_cast<size_t>(STAGES) * (A_STAGE + W_STAGE) * sizeof(T),
                  "the staged tile fits the pipeline's shared memory");
    Out* stage = reinterpret_cast<Out*>(a_smem);
    named_barrier_sync<1>(128 * consumers);  // every working consumer is done with the pipeline
    // The stage was last written by TMA (async proxy) and read by wgmma (async proxy, retired by
    // every consumer's wait above); the proxy fence orders those accesses before the generic-proxy
    // stores below (belt and braces: once per tile).
    fence_shared_for_async();
    stage_values(stage + row_base * PITCH + (lane % 4) * 2, PITCH);
    sync_warpgroup();  // this warpgroup's 64 rows are staged
    // The warpgroup's 64 x CHUNKS chunks in row order: consecutive threads, consecutive chunks.
#pragma unroll 4
    for (int i = threadIdx.x % 128; i < 64 * CHUNKS; i += 128) {
      const int r = warpgroup * 64 + i / CHUNKS, chunk = i % CHUNKS;
      const long long col = n0 + chunk * UNIT;
      if (r < rows && col < N)
        *reinterpret_cast<uint4*>(out + (row0 + r) * N + col) =
            *reinterpret_cast<const uint4*>(stage + r * PITCH + chunk * UNIT);
    }
  };
  if constexpr (Scaling<Spec, EIGHT_BIT>::quantize_out) {
    // fp8_block GEMM 1 quantizes its activations for GEMM 2 here, as quantize.cuh's
    // quantize_fp8_rows would from the fp32 rows (the same floats through the same operations, so
    // bit for bit), per row and 128-column group: s = max(amax, 1e-10) / 448, q = e4m3(x / s).
    // A row's columns of a group lie in the four lanes of its quad: 16 8-column groups, 2 a lane.
    static_assert(Spec::kGemm1 && BLOCK && BN % 128 == 0 && N % 128 == 0, "whole scale groups per tile");
    constexpr int GROUP_J = 128 / 8;
    constexpr long long SCALE_GROUPS = N / 128;
    store_staged([&](Out* staged, int pitch) {
#pragma unroll
      for (int g = 0; g < BN / 128; ++g) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[GROUP_J][2];
          float amax = 0.0f;  // fmaxf drops NaN: a NaN quantizes to NaN, its row's scale stays finite
#pragma unroll
          for (int j = 0; j < GROUP_J; ++j) {
            output_pair(g * GROUP_J + j, h, v[j][0], v[j][1]);
            amax = fmaxf(amax, fmaxf(fabsf(v[j][0]), fabsf(v[j][1])));
          }
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // every lane: rows differ per quad
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
          const float s = e4m3_scale(amax);
          const int r = row_base + h * 8;
          // (A non-gated tile of 256 columns may reach past N by a whole group: N % BN need not be 0.)
          if (r < rows && lane % 4 == 0 && n0 + g * 128 < N) args.out_scale[(row0 + r) * SCALE_GROUPS + n0 / 128 + g] = s;
#pragma unroll
          for (int j = 0; j < GROUP_J; ++j) {
            const unsigned pair = to_e4m3(v[j][0] / s).bits | to_e4m3(v[j][1] / s).bits << 8;
            *reinterpret_cast<unsigned short*>(staged + h * 8 * pitch + (g * GROUP_J + j) * 8) =
                static_cast<unsigned short>(pair);
          }
        }
      }
    });
  } else if constexpr (N % 8 == 0 && sizeof(Out) == 2) {
    store_staged([&](Out* staged, int pitch) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row_base + h * 8 >= rows) continue;  // never stored (and fewer live values at a time)
          float x, y;
          output_pair(j, h, x, y);
          store_pair(staged + h * 8 * pitch + j * 8, x, y);
        }
    });
  } else {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const long long col = n0 + j * 8 + (lane % 4) * 2;
      if (col >= N) continue;  // N is even, so col + 1 < N too
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_base + h * 8;
        if (r >= rows) continue;
        float x, y;
        output_pair(j, h, x, y);
        store_pair(out + (row0 + r) * N + col, x, y);
      }
    }
  }
}

}  // namespace moejit
