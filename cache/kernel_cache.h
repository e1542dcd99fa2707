// Memory cache in front of the disk cache, with single flight: within one process, concurrent
// requests for one key run the build once and all receive its result.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "cache/cached_binary.h"
#include "cache/disk_cache.h"

namespace moejit {

// MemoryHit also covers a request that waited for another thread's build of the same key.
enum class CacheOutcome { MemoryHit, DiskHit, Built };
std::string_view to_string(CacheOutcome outcome);

struct CacheOptions {
  std::string root;          // disk root
  int64_t max_bytes = 0;     // disk cap (0: none)
  bool use_disk = true;      // false: memory only
};

class KernelCache {
 public:
  explicit KernelCache(const CacheOptions& options);

  // The binary for (arch, key): from memory, else disk (verified), else `build()` (published to
  // disk when the disk is usable). A build that throws publishes nothing, and the exception
  // reaches every waiter for that key.
  std::shared_ptr<const CachedBinary> get_or_build(const std::string& arch, const std::string& key,
                                                   const std::function<CachedBinary()>& build,
                                                   CacheOutcome* outcome = nullptr);

  // The disk side (null when memory-only); `warning()` says why the disk is not used (empty when
  // it is used).
  DiskCache* disk() { return disk_ && disk_->usable() ? disk_.get() : nullptr; }
  const std::string& warning() const { return warning_; }

  void clear_memory();

 private:
  struct InFlight;
  std::shared_ptr<const CachedBinary> resolve(const std::string& arch, const std::string& key,
                                              const std::function<CachedBinary()>& build,
                                              CacheOutcome* outcome);
  std::unique_ptr<DiskCache> disk_;
  std::atomic<bool> publish_failed_{false};  // after the first failed publish: load only, one warning
  std::atomic<bool> refused_warned_{false};  // the first refused entry was reported
  std::string warning_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const CachedBinary>> memory_;
  std::map<std::string, std::shared_ptr<InFlight>> in_flight_;
};

// The process-wide cache configured from knobs(); its disk warning is printed once to stderr
// (not when MOEJIT_DISK_CACHE=0: the user asked for memory only).
KernelCache& global_cache();

}  // namespace moejit
