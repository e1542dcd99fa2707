// The CLI's layer inputs, shared by `dump-source` and `compile`: exactly one of --preset,
// --model, --config, plus per-field overrides (--experts 64, --num-expert-group 8, ...).
#pragma once

#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "compiler/moe_config.h"

namespace moejit::cli {

class ConfigOptions {
 public:
  // Adds the input and override options to `command`.
  void add_to(CLI::App& command);

  // Builds and validates the config. Throws InvalidInput when no input or more than one is
  // given, or when the result is invalid.
  MoeConfig resolve() const;

  // The --model folder, or empty.
  const std::string& model_dir() const { return model_dir_; }

 private:
  std::string preset_;
  std::string model_dir_;
  std::string config_file_;
  std::map<std::string, std::string> overrides_;  // by MoeConfig field name
};

}  // namespace moejit::cli
