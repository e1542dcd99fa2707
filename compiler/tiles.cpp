#include "compiler/tiles.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/grouped_gemm.h"

namespace moejit {
namespace {

[[noreturn]] void bad_tile(std::string_view source, std::string_view entry, std::string_view why) {
  throw InvalidInput(fmt::format(
      "{}: '{}' {}; allowed form: <bucket>.<gemm1|gemm2>=tc:<BM>x<BN>x<BK>:s<stages>:w<M>x<N>, "
      "<bucket>.<gemm>=wg:<BM>x<BN>x<BK>:s<stages> (sm_90a), tensor-core BK 64 (128 for 8-bit weights), or "
      "<bucket>.<gemm>=simt:<BM>x<BN>x<BK>, comma-separated",
      source, shown(entry), why));
}

int parse_int(std::string_view text, std::string_view source, std::string_view entry) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) bad_tile(source, entry, "has a malformed number");
  return v;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

std::string to_string(const TileOverride& o) {
  const TileShape& t = o.tile;
  std::string out = fmt::format("{}.gemm{}=", o.bucket, o.gemm1 ? 1 : 2);
  if (t.kernel == GemmKernel::TensorCore)
    return out + fmt::format("tc:{}x{}x{}:s{}:w{}x{}", t.bm, t.bn, t.bk, t.stages, t.warps_m, t.warps_n);
  if (t.kernel == GemmKernel::Wgmma) return out + fmt::format("wg:{}x{}x{}:s{}", t.bm, t.bn, t.bk, t.stages);
  return out + fmt::format("simt:{}x{}x{}", t.bm, t.bn, t.bk);
}

std::string to_string(const std::vector<TileOverride>& tiles) {
  std::string out;
  for (const auto& t : tiles) out += (out.empty() ? "" : ",") + to_string(t);
  return out;
}

std::vector<std::pair<TileShape, TileShape>> tile_candidates(const LayerSpec& c, const TokenBucket& b,
                                                             const std::string& arch) {
  std::vector<std::pair<TileShape, TileShape>> out = {{b.gemm1, b.gemm2}};
  if (b.gemm1.kernel == GemmKernel::Simt) return out;
  auto add = [&](const TileShape& g1, const TileShape& g2) {
    const bool fits = tile_problem(c, true, g1, arch).empty() && tile_problem(c, false, g2, arch).empty();
    const bool known = std::any_of(out.begin(), out.end(), [&](const auto& p) {
      return describe(p.first) == describe(g1) && describe(p.second) == describe(g2);
    });
    if (fits && !known) out.push_back({g1, g2});
  };
  // (warps_m, warps_n, stages, weight rows) alternatives per row tile height: narrower or wider
  // weight tiles and shallower or deeper pipelines around the planner's choice.
  struct Shape {
    int warps_m, warps_n, stages, weight_rows;
  };
  std::vector<Shape> shapes;
  // A 192-row bucket's alternatives are those of the 128-row tile it replaced.
  const int bm = b.gemm1.bm == 192 ? 128 : b.gemm1.bm;
  switch (bm) {
    case 16: shapes = {{1, 2, 8, 32}, {1, 4, 6, 64}, {1, 4, 4, 64}, {1, 2, 6, 32}}; break;
    case 32: shapes = {{2, 2, 5, 64}, {2, 4, 4, 128}, {2, 2, 8, 64}}; break;
    case 64: shapes = {{2, 2, 4, 128}, {2, 4, 3, 256}, {2, 4, 4, 128}, {2, 2, 6, 64}}; break;
    default: shapes = {{2, 4, 3, 256}, {2, 4, 4, 128}, {2, 4, 3, 128}, {4, 2, 3, 256}}; break;
  }
  // The 8-bit mma.sync tiles have not run on a GPU yet (compiler/heuristics/buckets.cpp): no
  // candidates until they have.
  if (operand_bytes(c) == 1) shapes.clear();
  for (const Shape& s : shapes) {
    std::pair<TileShape, TileShape> pair;
    for (bool gemm1 : {true, false}) {
      TileShape& t = gemm1 ? pair.first : pair.second;
      t = {GemmKernel::TensorCore, bm, 0, 128 / operand_bytes(c), s.warps_m, s.warps_n, s.stages};
      t.bn = (gemm1 && c.gated) ? s.weight_rows / 2 : s.weight_rows;
    }
    add(pair.first, pair.second);
  }
  // wgmma for the row tiles it takes: 256 or 128 weight rows, deep or shallow pipelines. (The
  // shallow ones fit twice in shared memory, but registers keep the 128-row ones at one block per
  // SM and the 64-row ones at two: slower on the H200, kept as autotune candidates.)
  if (bm == 64 || bm == 128) {
    const int halves = c.gated ? 2 : 1;
    for (auto [weight_rows, stages] : {std::pair{256, 4}, {128, 6}, {128, 3}, {256, 3}})
      add(wgmma_tile(c, bm, weight_rows / halves, stages), wgmma_tile(c, bm, weight_rows, stages));
    // Three consumer warpgroups: a 192 x 192 tile moves 11% fewer bytes per multiply-add through L2
    // than 128 x 256, and an expert whose rows just pass a multiple of 128 needs no extra row tile
    // that streams its whole weight slice again for a few rows.
    if (bm == 128) add(wgmma_tile(c, 192, 192 / halves, 4), wgmma_tile(c, 192, 192, 4));
  }
  return out;
}

std::vector<TileOverride> parse_tile_overrides(std::string_view text, std::string_view source) {
  std::vector<TileOverride> out;
  for (std::string_view entry : split(text, ',')) {
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('='), dot = entry.find('.');
    if (eq == std::string_view::npos || dot == std::string_view::npos || dot > eq) bad_tile(source, entry, "is malformed");
    TileOverride o;
    o.bucket = std::string(entry.substr(0, dot));
    const std::string_view gemm = entry.substr(dot + 1, eq - dot - 1);
    if (gemm != "gemm1" && gemm != "gemm2") bad_tile(source, entry, "names no GEMM (gemm1 or gemm2)");
    o.gemm1 = gemm == "gemm1";
    const std::vector<std::string_view> fields = split(entry.substr(eq + 1), ':');
    const std::vector<std::string_view> dims = split(fields.size() > 1 ? fields[1] : "", 'x');
    if (dims.size() != 3) bad_tile(source, entry, "needs BMxBNxBK");
    o.tile.bm = parse_int(dims[0], source, entry);
    o.tile.bn = parse_int(dims[1], source, entry);
    o.tile.bk = parse_int(dims[2], source, entry);
    if (fields[0] == "simt" && fields.size() == 2) {
      o.tile.kernel = GemmKernel::Simt;
    } else if (fields[0] == "wg" && fields.size() == 3 && fields[2].starts_with("s")) {
      // A consumer warpgroup per 64 rows and the producer warpgroup (wgmma_tile); BK as given.
      o.tile = {GemmKernel::Wgmma, o.tile.bm, o.tile.bn, o.tile.bk, o.tile.bm / 16 + 4, 1,
                parse_int(fields[2].substr(1), source, entry)};
    } else if (fields[0] == "tc" && fields.size() == 4 && fields[2].starts_with("s") && fields[3].starts_with("w")) {
      o.tile.kernel = GemmKernel::TensorCore;
      o.tile.stages = parse_int(fields[2].substr(1), source, entry);
      const std::vector<std::string_view> warps = split(fields[3].substr(1), 'x');
      if (warps.size() != 2) bad_tile(source, entry, "needs w<M>x<N>");
      o.tile.warps_m = parse_int(warps[0], source, entry);
      o.tile.warps_n = parse_int(warps[1], source, entry);
    } else {
      bad_tile(source, entry, "names no kernel form");
    }
    out.push_back(o);
  }
  return out;
}

}  // namespace moejit
