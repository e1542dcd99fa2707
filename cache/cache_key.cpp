// SHA-256 (OpenSSL EVP) and the labeled-field cache key of DESIGN.md decision 5.
#include "cache/cache_key.h"

#include <array>
#include <cstdint>
#include <memory>

#include <openssl/evp.h>

#include "common/error.h"

namespace moejit {
namespace {

// One incremental SHA-256; throws only when OpenSSL itself fails (out of memory).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw Error("moejit: OpenSSL could not start a SHA-256 digest");
  }

  void update(std::string_view data) {
    if (EVP_DigestUpdate(ctx_.get(), data.data(), data.size()) != 1)
      throw Error("moejit: OpenSSL SHA-256 update failed");
  }

  // A length as 8 little-endian bytes, so the framing does not depend on the host.
  void update_length(uint64_t n) {
    std::array<char, 8> bytes{};
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    update(std::string_view(bytes.data(), bytes.size()));
  }

  std::string hex() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md.data(), &len) != 1)
      throw Error("moejit: OpenSSL SHA-256 final failed");
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
      out.push_back(kHex[md[i] >> 4]);
      out.push_back(kHex[md[i] & 0xf]);
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

CacheKeyBuilder& CacheKeyBuilder::add(std::string_view label, std::string_view value) {
  fields_.emplace_back(std::string(label), std::string(value));
  return *this;
}

std::string CacheKeyBuilder::digest() const {
  // Each field is (length, label, length, value): lengths make the encoding prefix-free, so
  // ("ab", "c") and ("a", "bc") or a value moved between neighbouring fields cannot collide.
  Sha256 h;
  for (const auto& [label, value] : fields_) {
    h.update_length(label.size());
    h.update(label);
    h.update_length(value.size());
    h.update(value);
  }
  return h.hex();
}

}  // namespace moejit
