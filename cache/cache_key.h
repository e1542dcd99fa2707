// The cache key: SHA-256 over labeled fields (DESIGN.md decision 5).
// Labels and lengths are hashed with the values, so no two different field lists collide by
// concatenation ("ab"+"c" vs "a"+"bc").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moejit {

// Lowercase hex SHA-256 of `data` (OpenSSL).
std::string sha256_hex(std::string_view data);

class CacheKeyBuilder {
 public:
  // Appends one labeled field. Order matters: callers add fields in a fixed order.
  CacheKeyBuilder& add(std::string_view label, std::string_view value);

  // 64 lowercase hex digits.
  std::string digest() const;

  // The fields as added, for `moejit dump-source --plan` and debugging a miss.
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace moejit
