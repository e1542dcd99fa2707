#include "common/bounded_json.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/error.h"

namespace moejit {

nlohmann::json parse_bounded_json(std::string_view text, const std::string& what) {
  if (text.size() > kMaxJsonBytes)
    throw InvalidInput(fmt::format("{}: {} bytes of JSON; at most {} are read", what, text.size(), kMaxJsonBytes));
  int64_t values = 0;
  std::string last_key;  // the key whose value is being read, to name it when a number overflows
  const auto bounds = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && parsed.is_string()) last_key = parsed.get<std::string>();
    if (depth > kMaxJsonDepth)
      throw InvalidInput(fmt::format("{}: the JSON nests deeper than {} levels", what, kMaxJsonDepth));
    if (++values > kMaxJsonValues)
      throw InvalidInput(fmt::format("{}: the JSON holds more than {} values", what, kMaxJsonValues));
    return true;
  };
  try {
    return nlohmann::json::parse(text, bounds);
  } catch (const nlohmann::json::out_of_range& e) {  // 406: a number beyond a double, e.g. 1e400
    std::string message = e.what();
    const size_t quote = message.find('\'');
    throw InvalidInput(fmt::format("{}: {}a number does not fit a double ({})", what,
                                   last_key.empty() ? "" : fmt::format("key '{}': ", shown(last_key)),
                                   shown(quote == std::string::npos ? message : message.substr(quote))));
  } catch (const nlohmann::json::exception& e) {
    std::string message = e.what();
    if (message.size() > 200) message = message.substr(0, 197) + "...";
    throw InvalidInput(fmt::format("{}: not valid JSON: {}", what, message));
  }
}

nlohmann::json read_bounded_json_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InvalidInput(fmt::format("{}: cannot open the config file: {}", path,
                                   std::filesystem::exists(path, ec) ? "not a regular file" : std::strerror(ENOENT)));
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxJsonBytes)
    throw InvalidInput(fmt::format("{}: {} bytes; a config file of at most {} bytes is read", path, size, kMaxJsonBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open the config file: {}", path, std::strerror(errno)));
  // Bounded as read too: a file that grew after the size check (or a FIFO) is still refused.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxJsonBytes)
      throw InvalidInput(fmt::format("{}: more than {} bytes; a config file of at most that is read", path, kMaxJsonBytes));
  }
  return parse_bounded_json(text, path);
}

}  // namespace moejit
