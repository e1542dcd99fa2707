// The device templates (templates/*.cuh), embedded at build time by cmake/embed_templates.cmake.
#pragma once

#include <string_view>
#include <vector>

namespace moejit {

struct EmbeddedFile {
  std::string_view name;      // include name, e.g. "moejit/routing.cuh"
  std::string_view contents;
};

const std::vector<EmbeddedFile>& embedded_templates();

}  // namespace moejit
