// One safetensors file, read-only and memory-mapped. The format (huggingface/safetensors, "Format"):
// 8 bytes little-endian N, N bytes of a JSON header {name: {"dtype", "shape", "data_offsets":
// [begin, end]}, optional "__metadata__": {string: string}}, then the tensors' bytes, offsets
// counted from the end of the header.
//
// The file is untrusted input (DESIGN.md 14): only regular files are opened; the header's size is
// bounded and checked against the file's before it is read; its JSON is parsed with a depth limit;
// every tensor's dtype must be known, its shape's element count times the element size must equal
// its byte range (no overflow), and its range must lie inside the file without overlapping another.
// Every error names the file, and the tensor where there is one. A file truncated or rewritten by
// someone else after open() can still fault on access (the mapping is the file's pages), as with
// any memory-mapped reader.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moejit::checkpoint {

// Bytes per element of a safetensors dtype name ("BF16", "F8_E4M3", ...), or 0 for one moejit does
// not know (such a tensor opens, its byte range checked, but nothing moejit reads has its dtype).
int dtype_size(std::string_view dtype);

struct TensorInfo {
  std::string name;
  std::string dtype;  // as the header spells it
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section

  int64_t elements() const;
  uint64_t bytes() const { return end - begin; }
};

// "[2048, 7168] BF16"
std::string describe(const TensorInfo& tensor);

class SafetensorsFile {
 public:
  // Maps the file and checks its header. Throws InvalidInput naming the path and what is wrong.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor of that name, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes (tensor from this file's tensors()).
  const unsigned char* data(const TensorInfo& tensor) const { return data_ + tensor.begin; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  const unsigned char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
};

// A tensor to write: its bytes are `bytes` (elements of `dtype` in row-major `shape`).
struct TensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};

// Writes a safetensors file (header padded with spaces to 8 bytes, tensors in the given order), to
// a temporary file beside `path` that is then renamed over it: a crash leaves the old file or
// none, never half of one. Throws Error naming the path when writing fails, InvalidInput when a
// tensor's bytes do not match its dtype and shape.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace moejit::checkpoint
