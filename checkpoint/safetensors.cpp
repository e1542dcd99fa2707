#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moejit::checkpoint {
namespace {

// The safetensors library refuses headers past 100 MB; a DeepSeek-V3 shard's is about 60 KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The header is an object of objects holding arrays of numbers: nothing deeper is valid.
constexpr int kMaxJsonDepth = 4;
// JSON values a header may hold (DeepSeek-V3's largest shard: about 10k): bounds the parsed
// document's memory, which a crafted 100 MB header of tiny values could otherwise drive to gigabytes.
constexpr int64_t kMaxJsonValues = 4'000'000;

[[noreturn]] void bad_file(const std::string& path, std::string_view why) {
  throw InvalidInput(fmt::format("safetensors file '{}': {}", path, why));
}

[[noreturn]] void bad_tensor(const std::string& path, std::string_view name, std::string_view why) {
  throw InvalidInput(fmt::format("safetensors file '{}': tensor '{}': {}", path, name, why));
}

// A non-negative JSON integer that fits in int64, else an error naming `what`.
uint64_t non_negative(const nlohmann::json& v, const std::string& path, std::string_view name, std::string_view what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    bad_tensor(path, name, fmt::format("{} must hold non-negative integers, found {}", what, v.dump()));
  const uint64_t x = v.get<uint64_t>();
  if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad_tensor(path, name, fmt::format("{} value {} is too large", what, x));
  return x;
}

TensorInfo parse_tensor(const std::string& path, const std::string& name, const nlohmann::json& entry,
                        uint64_t data_bytes) {
  if (!entry.is_object()) bad_tensor(path, name, "its header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) bad_tensor(path, name, fmt::format("its header entry has no \"{}\"", key));
  TensorInfo t;
  t.name = name;
  if (!entry["dtype"].is_string()) bad_tensor(path, name, "\"dtype\" is not a string");
  t.dtype = entry["dtype"].get<std::string>();
  // A dtype moejit does not know (the format grows: F8_E8M0, F4, ...) is kept, its byte range still
  // checked against the file: only a tensor moejit reads must have a dtype it reads.
  const int element = dtype_size(t.dtype);
  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array() || shape.size() > 8) bad_tensor(path, name, "\"shape\" is not an array of at most 8 sizes");
  uint64_t elements = 1;
  bool overflow = false, empty = false;
  for (const auto& d : shape) {
    const uint64_t size = non_negative(d, path, name, "\"shape\"");
    t.shape.push_back(static_cast<int64_t>(size));
    empty |= size == 0;
    overflow |= __builtin_mul_overflow(elements, size, &elements);
  }
  if (empty) elements = 0, overflow = false;  // a zero anywhere: no elements, whatever the other sizes
  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) bad_tensor(path, name, "\"data_offsets\" is not [begin, end]");
  t.begin = non_negative(offsets[0], path, name, "\"data_offsets\"");
  t.end = non_negative(offsets[1], path, name, "\"data_offsets\"");
  if (t.begin > t.end) bad_tensor(path, name, fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
  if (t.end > data_bytes)
    bad_tensor(path, name,
               fmt::format("data_offsets [{}, {}] reach past the file's {} data bytes (truncated?)", t.begin, t.end,
                           data_bytes));
  if (element == 0) return t;  // an unknown dtype: its size per element is unknown
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(elements, static_cast<uint64_t>(element), &bytes);
  if (overflow || bytes != t.end - t.begin)
    bad_tensor(path, name,
               fmt::format("shape {} of {} takes {} bytes, but data_offsets [{}, {}] hold {}", shape.dump(), t.dtype,
                           overflow ? std::string("more than 2^64") : std::to_string(bytes), t.begin, t.end,
                           t.end - t.begin));
  return t;
}

}  // namespace

int dtype_size(std::string_view dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 8;
  return 0;
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked against the byte range at open
  return n;
}

std::string describe(const TensorInfo& tensor) {
  return fmt::format("[{}] {}", fmt::join(tensor.shape, ", "), tensor.dtype);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (fstat refuses it next).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) bad_file(path, fmt::format("cannot open it: {}", std::strerror(errno)));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) bad_file(path, fmt::format("cannot stat it: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) bad_file(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) bad_file(path, fmt::format("{} bytes: too short for the 8-byte header length", size));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) bad_file(path, fmt::format("cannot map it: {}", std::strerror(errno)));
  file->mapping_ = mapping;
  file->mapped_bytes_ = size;
  const auto* bytes = static_cast<const unsigned char*>(mapping);

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | bytes[i];  // little-endian
  if (header_bytes > kMaxHeaderBytes)
    bad_file(path, fmt::format("its header claims {} bytes; at most {} are allowed", header_bytes, kMaxHeaderBytes));
  if (header_bytes > size - 8)
    bad_file(path, fmt::format("its header claims {} bytes but the file has {} after the length (truncated?)",
                               header_bytes, size - 8));
  const uint64_t data_bytes = size - 8 - header_bytes;
  file->data_ = bytes + 8 + header_bytes;

  nlohmann::json header;
  try {
    int64_t values = 0;
    const auto depth_limit = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxJsonDepth) bad_file(path, fmt::format("its header nests deeper than {} levels", kMaxJsonDepth));
      if (++values > kMaxJsonValues) bad_file(path, fmt::format("its header holds more than {} JSON values", kMaxJsonValues));
      return true;
    };
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_bytes, depth_limit);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, fmt::format("its header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) bad_file(path, "its header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad_file(path, "\"__metadata__\" is not an object");
      for (const auto& [key, value] : entry.items())
        if (!value.is_string()) bad_file(path, fmt::format("\"__metadata__\" value of '{}' is not a string", key));
      continue;
    }
    file->tensors_.push_back(parse_tensor(path, name, entry, data_bytes));
  }
  // No two tensors may share bytes: a writer's bug, or a crafted file aliasing one tensor into another.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : file->tensors_)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      bad_tensor(path, by_offset[i]->name,
                 fmt::format("its bytes [{}, {}] overlap those of '{}' [{}, {}]", by_offset[i]->begin,
                             by_offset[i]->end, by_offset[i - 1]->name, by_offset[i - 1]->begin, by_offset[i - 1]->end));
  std::sort(file->tensors_.begin(), file->tensors_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapped_bytes_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t elements = 1;
    bool bad = dtype_size(t.dtype) == 0;
    for (int64_t d : t.shape) bad |= d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements);
    uint64_t bytes = 0;
    bad |= __builtin_mul_overflow(elements, static_cast<uint64_t>(dtype_size(t.dtype)), &bytes);
    if (bad || bytes != t.bytes)
      throw InvalidInput(fmt::format("write_safetensors '{}': tensor '{}' has {} bytes, which is not [{}] of {}", path,
                                     t.name, t.bytes, fmt::join(t.shape, ", "), t.dtype));
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  // A fresh temporary file beside the target (mkstemp: exclusive, never a planted link; mode 0600),
  // renamed over it once complete.
  std::string temporary = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) throw Error(fmt::format("write_safetensors: cannot create a file beside '{}': {}", path, std::strerror(errno)));
  FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int error = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    throw Error(fmt::format("write_safetensors: cannot write '{}': {}", temporary, std::strerror(error)));
  }
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  bool ok = std::fwrite(length, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& t : tensors) ok = ok && std::fwrite(t.data, 1, t.bytes, f) == t.bytes;
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  const int write_error = errno;
  ok = std::fclose(f) == 0 && ok;
  std::error_code ec;
  if (ok) std::filesystem::rename(temporary, path, ec);
  if (!ok || ec) {
    const std::string why = ok ? ec.message() : std::strerror(write_error);
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(fmt::format("write_safetensors: writing '{}' failed: {}", path, why));
  }
}

}  // namespace moejit::checkpoint
