#include "cache/disk_entry.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/cache_files.h"
#include "cache/cache_key.h"
#include "common/error.h"

namespace moejit::disk_entry {
namespace {

using nlohmann::json;
using cache_files::FileState;

bool safe_component(std::string_view s, size_t min_len, size_t max_len) {
  if (s.size() < min_len || s.size() > max_len) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           c == '-';
  });
}

// A C identifier of at most 256 characters (what NVRTC entry names are).
bool identifier(std::string_view s) {
  if (s.empty() || s.size() > 256 || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  });
}

bool string_list(const json& j, std::vector<std::string>* out) {
  if (!j.is_array()) return false;
  out->clear();
  for (const auto& v : j) {
    if (!v.is_string()) return false;
    out->push_back(v.get<std::string>());
  }
  return true;
}

}  // namespace

bool valid_arch(std::string_view arch) {
  return safe_component(arch, 1, 64) && arch != "tmp" && arch != "quarantine" && arch != "locks";
}
bool valid_key(std::string_view key) { return safe_component(key, 2, 128); }

std::string write_entry(int dirfd, const std::string& dir, const CachedBinary& binary) {
  json meta = {
      {"arch", binary.arch},
      {"key", binary.key},
      {"cubin_sha256", sha256_hex(binary.cubin)},
      {"source_sha256", sha256_hex(binary.source)},
      {"kernel_names", binary.kernel_names},
      {"info", binary.meta},
  };
  // Invalid UTF-8 in free-form info (a compiler log) is replaced rather than thrown on.
  std::string meta_text = meta.dump(2, ' ', false, json::error_handler_t::replace);
  const std::pair<const char*, std::string_view> files[] = {
      {kSource, binary.source}, {kCubin, binary.cubin}, {kMeta, meta_text}};
  for (const auto& [name, data] : files)
    if (int err = cache_files::write_file(dirfd, name, data))
      return fmt::format("writing {}/{}: {}", dir, name, cache_files::errno_text(err));
  return {};
}

EntryRead read_entry(int dirfd, const std::string& arch, const std::string& key) {
  EntryRead r;
  std::string meta_text;
  CachedBinary& b = r.binary;
  const std::tuple<const char*, std::string*, size_t> files[] = {
      {kMeta, &meta_text, kMaxMetaBytes}, {kCubin, &b.cubin, kMaxBinaryBytes}, {kSource, &b.source, kMaxBinaryBytes}};
  for (const auto& [name, out, max_bytes] : files) {
    switch (cache_files::read_file(dirfd, name, out, max_bytes)) {
      case FileState::Ok: break;
      case FileState::Refused:
        r.status = EntryRead::Refused;
        r.why = fmt::format("{} is not owned by this user or is writable by others", name);
        return r;
      case FileState::Missing: r.why = fmt::format("{} is missing", name); return r;
      case FileState::Unreadable: r.why = fmt::format("{} cannot be read (or is not a regular file)", name); return r;
      case FileState::TooLarge: r.why = fmt::format("{} is larger than an entry's {} bytes", name, max_bytes); return r;
    }
  }
  json meta = json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) {
    r.why = "meta.json is not a JSON object";
    return r;
  }
  auto str = [&](const char* field) -> std::string {
    auto it = meta.find(field);
    return it != meta.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (str("arch") != arch || str("key") != key) {
    r.why = "meta.json names another arch or key";
    return r;
  }
  auto names = meta.find("kernel_names");
  // A cubin has entry points; only a record without one (an autotune record) lists none.
  if (names == meta.end() || !string_list(*names, &b.kernel_names) || (b.kernel_names.empty() && !b.cubin.empty())) {
    r.why = "meta.json has no kernel_names list";
    return r;
  }
  // Every name an entry point of the cubin (the SHA-256 vouches for the cubin, not for the names):
  // a renamed or bit-flipped name would fail only at launch.
  for (const std::string& name : b.kernel_names)
    if (!identifier(name) || b.cubin.find(name) == std::string::npos) {
      r.why = fmt::format("meta.json lists kernel '{}', which kernel.cubin does not hold", shown(name));
      return r;
    }
  if (str("cubin_sha256") != sha256_hex(b.cubin)) {
    r.why = "kernel.cubin does not match its SHA-256 in meta.json";
    return r;
  }
  if (str("source_sha256") != sha256_hex(b.source)) {
    r.why = "kernel.cu does not match its SHA-256 in meta.json";
    return r;
  }
  auto info = meta.find("info");
  b.meta = info != meta.end() ? *info : json::object();
  b.arch = arch;
  b.key = key;
  r.status = EntryRead::Ok;
  return r;
}

std::vector<std::string> kernel_names(int dirfd) {
  std::vector<std::string> names;
  std::string text;
  if (cache_files::read_file(dirfd, kMeta, &text, kMaxMetaBytes) == FileState::Ok) {
    json meta = json::parse(text, nullptr, false);
    if (meta.is_object() && meta.contains("kernel_names")) string_list(meta["kernel_names"], &names);
  }
  return names;
}

}  // namespace moejit::disk_entry
