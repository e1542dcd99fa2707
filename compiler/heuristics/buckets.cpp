#include "compiler/heuristics/heuristics.h"

#include <algorithm>
#include <limits>

#include "compiler/families/grouped_gemm.h"

namespace moejit {
namespace heuristics {

int row_tile_height(const LayerSpec& c, int64_t representative_tokens) {
  const double rows = static_cast<double>(representative_tokens) * c.topk / c.local_experts();
  int bm = 16;
  while (bm < 128 && bm < rows) bm *= 2;
  return bm;
}

}  // namespace heuristics

std::vector<TokenBucket> plan_buckets(const LayerSpec& c, const std::string& arch) {
  using namespace heuristics;
  constexpr int64_t kLast = std::numeric_limits<int64_t>::max();
  std::vector<BucketRange> ranges = {{BucketKind::Decode, 1, 32, kDecodeTokens, kDecodeTokens},
                                     {BucketKind::Mid, 33, 512, kMidTokens, kMidTokens},
                                     {BucketKind::Prefill, 513, kLast, kPrefillTokens, kPrefillTokens}};
  const bool eight_bit = operand_bytes(c) == 1;
  // 8-bit weights take tensor cores through wgmma on sm_90a and mma.sync elsewhere (mma_gemm.cuh:
  // int8 from sm_80, e4m3 from sm_89; fp8 before sm_89 stays on SIMT, which dequantizes as it
  // loads). The mma.sync tiles ran on the H200 through overrides (bench/RESULTS.md, 2026-12-03).
  const bool tensor_core =
      tensor_core_eligible(c) && (!eight_bit || wgmma_arch(arch) || !is_fp8(c.quant) || fp8_mma_arch(arch));
  const bool wgmma = tensor_core && wgmma_arch(arch);
  if (wgmma && !eight_bit) {
    const int64_t mid_end = sm90_mid_end(c, row_tile_height(c, kMidTokens));
    ranges[1].max = mid_end;
    ranges[1].tuned = std::min(ranges[1].tuned, mid_end);
    ranges[2].min = mid_end + 1;
    std::vector<BucketRange> prefill = sm90_prefill_ranges(c, mid_end + 1);
    if (!prefill.empty()) {
      ranges.pop_back();
      ranges.insert(ranges.end(), prefill.begin(), prefill.end());
    }
  }
  std::vector<TokenBucket> buckets;
  for (const auto& r : ranges) {
    const int bm = row_tile_height(c, r.representative);
    TokenBucket b;
    b.kind = r.kind;
    b.min_tokens = r.min;
    b.max_tokens = r.max;
    b.tuned_tokens = r.tuned;
    if (wgmma && eight_bit) {
      sm90_8bit_tiles(c, bm, b);
    } else if (wgmma && bm >= 64) {
      sm90_tiles(c, bm, r.wide, b);
    } else if (tensor_core) {
      const bool decode = r.kind == BucketKind::Decode;
      b.gemm1 = tensor_core_tile(c, bm, /*gemm1=*/true, decode);
      b.gemm2 = tensor_core_tile(c, bm, /*gemm1=*/false, decode);
    } else {
      simt_tiles(bm, b);
    }
    buckets.push_back(b);
  }
  return buckets;
}

}  // namespace moejit
