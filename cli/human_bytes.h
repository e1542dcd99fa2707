// Byte counts as the CLI prints them ("1.5 GiB").
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace moejit::cli {

inline std::string human_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", bytes / double(int64_t{1} << 30));
  if (bytes >= (1 << 20)) return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
  if (bytes >= (1 << 10)) return fmt::format("{:.1f} KiB", bytes / double(1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace moejit::cli
