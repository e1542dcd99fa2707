#include "cli/config_options.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "compiler/hf_config.h"

namespace moejit::cli {

void ConfigOptions::add_to(CLI::App& command) {
  auto* inputs = command.add_option_group("input", "the layer to build (exactly one)");
  inputs->add_option("--preset", preset_, fmt::format("a model preset: {}", fmt::join(preset_names(), ", ")));
  inputs->add_option("--model", model_dir_, "a Hugging Face model folder holding config.json");
  inputs->add_option("--config", config_file_, "a config file: Hugging Face config.json or moejit JSON");
  auto* fields = command.add_option_group("overrides", "set one config field after reading the input");
  for (const std::string& field : field_names()) {
    std::string dashed = field;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    std::string names = "--" + dashed;
    if (dashed != field) names += ",--" + field;
    fields->add_option_function<std::string>(
        names, [this, field](const std::string& value) { overrides_[field] = value; },
        fmt::format("override config field {}", field));
  }
}

MoeConfig ConfigOptions::resolve() const {
  int given = !preset_.empty() + !model_dir_.empty() + !config_file_.empty();
  if (given != 1)
    throw InvalidInput(fmt::format("give exactly one of --preset, --model, --config ({} given)", given));
  MoeConfig config;
  if (!preset_.empty()) {
    config = preset(preset_);
    for (const auto& [field, value] : overrides_) set_field(config, field, value);
    // A preset's router logits follow its dtype unless router_dtype is set too.
    if (overrides_.count("dtype") && !overrides_.count("router_dtype")) config.router_dtype = config.dtype;
  } else {
    config = load_config_file(preset_.empty() && !model_dir_.empty() ? model_dir_ : config_file_, overrides_);
  }
  validate(config);
  return config;
}

}  // namespace moejit::cli
