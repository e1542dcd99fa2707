// JSON from outside moejit (config files, JSON texts given to the C ABI and the torch ops) parsed
// with bounds, so a hostile document is an InvalidInput naming it, never a crash: at most
// kMaxJsonDepth levels of nesting (deeper documents once overflowed the stack when an error message
// printed a nested value), kMaxJsonValues values and kMaxJsonBytes bytes (a 200 MB config took
// 4 GB), and numbers that fit a double.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moejit {

inline constexpr int kMaxJsonDepth = 64;
inline constexpr int64_t kMaxJsonValues = int64_t{1} << 20;
inline constexpr size_t kMaxJsonBytes = size_t{16} << 20;

// `what` names the document in messages ("config.json", "overrides_json").
nlohmann::json parse_bounded_json(std::string_view text, const std::string& what);

// Reads a whole file of at most kMaxJsonBytes and parses it so.
nlohmann::json read_bounded_json_file(const std::string& path);

}  // namespace moejit
