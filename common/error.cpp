#include "common/error.h"

#include <fmt/format.h>

namespace moejit {

std::string shown(std::string_view value) {
  constexpr size_t kShown = 40;
  std::string out;
  size_t taken = 0;
  for (; taken < value.size() && out.size() < kShown; ++taken) {
    const unsigned char c = static_cast<unsigned char>(value[taken]);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (taken < value.size()) out += fmt::format("...({} bytes)", value.size());
  return out;
}

std::string one_line_message(std::string_view message, size_t max_chars) {
  std::string out;
  for (const char c : message) out += c == '\n' || c == '\r' ? ' ' : c;
  if (out.size() > max_chars) out = out.substr(0, max_chars - 3) + "...";
  return out;
}

}  // namespace moejit
