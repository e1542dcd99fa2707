// A model folder's safetensors files as one name -> tensor map: a sharded checkpoint through its
// `model.safetensors.index.json` (weight_map: tensor name -> file name), else `model.safetensors`,
// else every `*.safetensors` file in the folder. The index is untrusted too: its file names must be
// plain names of regular files in the folder, and every tensor it lists must be in its file.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/safetensors.h"

namespace moejit::checkpoint {

// A tensor and the file that holds it.
struct FoundTensor {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};

class Checkpoint {
 public:
  // Opens (memory-maps) every file of the folder's checkpoint. Throws InvalidInput naming the
  // folder, the file and the tensor at fault.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // The tensor of that name, or {nullptr, nullptr}.
  FoundTensor find(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, FoundTensor, std::less<>> tensors_;
};

}  // namespace moejit::checkpoint
