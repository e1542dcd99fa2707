#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moejit::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
// DeepSeek-V3's index is 8.9 MB (91k tensors).
constexpr uintmax_t kMaxIndexBytes = 256u << 20;
constexpr int kMaxIndexDepth = 3;
// JSON values an index may hold (DeepSeek-V3's: about 180k): bounds the parsed document's memory.
constexpr int64_t kMaxIndexValues = 8'000'000;

[[noreturn]] void bad_checkpoint(const std::string& dir, std::string_view why) {
  throw InvalidInput(fmt::format("checkpoint '{}': {}", dir, why));
}

// A regular file, or a link to one (a Hugging Face cache snapshot links its files to blobs).
bool regular_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

nlohmann::json read_index(const std::string& dir, const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || !regular_file(path)) bad_checkpoint(dir, fmt::format("{} is not a readable regular file", kIndexName));
  if (size > kMaxIndexBytes)
    bad_checkpoint(dir, fmt::format("{} has {} bytes; at most {} are allowed", kIndexName, size, kMaxIndexBytes));
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  try {
    int64_t values = 0;
    const auto depth_limit = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxIndexDepth) bad_checkpoint(dir, fmt::format("{} nests deeper than {} levels", kIndexName, kMaxIndexDepth));
      if (++values > kMaxIndexValues)
        bad_checkpoint(dir, fmt::format("{} holds more than {} JSON values", kIndexName, kMaxIndexValues));
      return true;
    };
    return nlohmann::json::parse(text.str(), depth_limit);
  } catch (const nlohmann::json::exception& e) {
    bad_checkpoint(dir, fmt::format("{} is not valid JSON: {}", kIndexName, e.what()));
  }
}

// A file name the index may name: a plain name in the folder, no path.
void check_file_name(const std::string& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    bad_checkpoint(dir, fmt::format("{} names file '{}'; only plain file names in the folder are allowed", kIndexName, name));
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) bad_checkpoint(dir, "not a folder");
  Checkpoint c;
  c.dir_ = dir;
  std::map<std::string, size_t> file_index;  // file name -> files_ slot
  auto open_file = [&](const std::string& name) -> size_t {
    auto it = file_index.find(name);
    if (it != file_index.end()) return it->second;
    const fs::path path = fs::path(dir) / name;
    if (!regular_file(path)) bad_checkpoint(dir, fmt::format("file '{}' is missing or not a regular file", name));
    c.files_.push_back(SafetensorsFile::open(path.string()));
    file_index[name] = c.files_.size() - 1;
    return c.files_.size() - 1;
  };

  const fs::path index = fs::path(dir) / kIndexName;
  if (fs::exists(index, ec)) {
    const nlohmann::json j = read_index(dir, index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      bad_checkpoint(dir, fmt::format("{} has no \"weight_map\" object", kIndexName));
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) bad_checkpoint(dir, fmt::format("{} maps '{}' to a non-string", kIndexName, tensor));
      const std::string file_name = file.get<std::string>();
      check_file_name(dir, file_name);
      const SafetensorsFile& f = *c.files_[open_file(file_name)];
      const TensorInfo* info = f.find(tensor);
      if (!info)
        bad_checkpoint(dir, fmt::format("{} places tensor '{}' in '{}', which does not hold it", kIndexName, tensor, file_name));
      c.tensors_[tensor] = {&f, info};
    }
    return c;
  }

  std::vector<std::string> names;
  if (regular_file(fs::path(dir) / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors" && regular_file(entry.path()))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
  }
  if (names.empty())
    bad_checkpoint(dir, fmt::format("no checkpoint found (expected {}, model.safetensors or *.safetensors files)", kIndexName));
  for (const auto& name : names) {
    const SafetensorsFile& f = *c.files_[open_file(name)];
    for (const auto& info : f.tensors()) {
      auto [it, inserted] = c.tensors_.try_emplace(info.name, FoundTensor{&f, &info});
      if (!inserted)
        bad_checkpoint(dir, fmt::format("tensor '{}' is in both '{}' and '{}'", info.name, it->second.file->path(), f.path()));
    }
  }
  return c;
}

FoundTensor Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? FoundTensor{} : it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, found] : tensors_) out.push_back(name);
  return out;
}

}  // namespace moejit::checkpoint
