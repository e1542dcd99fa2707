#include "runtime/backend_registry.h"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "common/error.h"

namespace moejit {
namespace {

std::mutex registry_mutex;

std::map<BackendKind, LayerFactory>& registry() {
  static auto* factories = new std::map<BackendKind, LayerFactory>();  // never destroyed: used at exit
  return *factories;
}

}  // namespace

void register_layer_backend(BackendKind kind, LayerFactory factory) {
  std::lock_guard lock(registry_mutex);
  registry()[kind] = factory;
}

std::unique_ptr<Layer> create_registered_layer(const BackendChoice& choice, const MoeConfig& config,
                                               const LayerOptions& options, int ordinal) {
  if (!choice.usable) throw Error(fmt::format("moejit: backend {}: {}", to_string(choice.kind), choice.reason));
  LayerFactory factory = nullptr;
  {
    std::lock_guard lock(registry_mutex);
    auto it = registry().find(choice.kind);
    if (it != registry().end()) factory = it->second;
  }
  if (!factory)
    throw Error(fmt::format(
        "moejit: backend {} ({}) is not loaded in this process: it lives in the torch op library "
        "(libmoejit_torch.so, built with MOEJIT_WITH_IXFORMER=ON), which registers it when linked or loaded",
        to_string(choice.kind), choice.reason));
  return factory(config, options, ordinal);
}

}  // namespace moejit
