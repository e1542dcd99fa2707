// The in-process cache: a memory map in front of the disk cache, with single flight per key.
#include "cache/kernel_cache.h"

#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "common/error.h"
#include "common/knobs.h"

namespace moejit {

std::string_view to_string(CacheOutcome outcome) {
  switch (outcome) {
    case CacheOutcome::MemoryHit: return "memory";
    case CacheOutcome::DiskHit: return "disk";
    case CacheOutcome::Built: return "built";
  }
  return "unknown";
}

// One build in progress. Waiters block on `cv` (with KernelCache::mutex_) until `done`, then take
// `result` or rethrow `error`; they hold a shared_ptr, so the flight outlives its map slot.
struct KernelCache::InFlight {
  std::condition_variable cv;
  bool done = false;
  std::shared_ptr<const CachedBinary> result;
  std::exception_ptr error;
};

KernelCache::KernelCache(const CacheOptions& options) {
  if (!options.use_disk) {
    warning_ = "moejit: the disk cache is off (MOEJIT_DISK_CACHE=0); keeping binaries in memory only";
    return;
  }
  disk_ = std::make_unique<DiskCache>(options.root, options.max_bytes);
  if (!disk_->usable()) {
    warning_ = fmt::format("moejit: {}; keeping binaries in memory only", disk_->reason());
  } else if (disk_->read_only()) {
    warning_ = fmt::format("moejit: {}; loading its entries, keeping new binaries in memory only",
                           disk_->read_only_reason());
    publish_failed_ = true;  // nothing to try: every publish would fail the same way
  }
}

std::shared_ptr<const CachedBinary> KernelCache::get_or_build(
    const std::string& arch, const std::string& key, const std::function<CachedBinary()>& build,
    CacheOutcome* outcome) {
  const std::string id = arch + "/" + key;
  std::shared_ptr<InFlight> flight;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (auto it = memory_.find(id); it != memory_.end()) {
      if (outcome) *outcome = CacheOutcome::MemoryHit;
      return it->second;
    }
    // Another thread is resolving this key: wait for its result (served from memory, so the
    // outcome is MemoryHit) or its exception.
    if (auto it = in_flight_.find(id); it != in_flight_.end()) {
      std::shared_ptr<InFlight> other = it->second;
      other->cv.wait(lock, [&] { return other->done; });
      if (other->error) std::rethrow_exception(other->error);
      if (outcome) *outcome = CacheOutcome::MemoryHit;
      return other->result;
    }
    flight = std::make_shared<InFlight>();
    in_flight_.emplace(id, flight);
  }

  // Resolve without the mutex, so other keys proceed in parallel.
  CacheOutcome how = CacheOutcome::Built;
  std::shared_ptr<const CachedBinary> result;
  std::exception_ptr error;
  try {
    result = resolve(arch, key, build, &how);
  } catch (...) {
    error = std::current_exception();
  }
  {
    // A failure is not remembered: the flight ends, and the next request tries again.
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.erase(id);
    if (result) memory_[id] = result;
    flight->done = true;
    flight->result = result;
    flight->error = error;
  }
  flight->cv.notify_all();
  if (error) std::rethrow_exception(error);
  if (outcome) *outcome = how;
  return result;
}

std::shared_ptr<const CachedBinary> KernelCache::resolve(const std::string& arch, const std::string& key,
                                                         const std::function<CachedBinary()>& build,
                                                         CacheOutcome* outcome) {
  DiskCache* d = disk();
  if (d) {
    DiskVerifyFinding refused;
    if (auto hit = d->load(arch, key, &refused)) {
      *outcome = CacheOutcome::DiskHit;
      return std::make_shared<const CachedBinary>(std::move(*hit));
    }
    // A refused entry stays in place (not ours to move) and its key is built on every run: say so
    // once, with what to fix.
    if (!refused.path.empty() && !refused_warned_.exchange(true))
      fmt::print(stderr,
                 "moejit: the cache entry {} is refused ({}); building its kernels in memory on every run until "
                 "it is fixed or removed (`moejit cache verify` lists refused entries)\n",
                 refused.path, refused.why);
  }
  // Hold the key's lock across build and publish, so a second process waits instead of compiling
  // the same key, then finds the entry on its re-check. Without the lock (null: it could not be
  // taken) both build and the publish race picks one entry; the result is the same.
  std::unique_ptr<DiskLock> held = d ? d->lock(arch, key) : nullptr;
  if (held) {
    if (auto hit = d->load(arch, key)) {
      *outcome = CacheOutcome::DiskHit;
      return std::make_shared<const CachedBinary>(std::move(*hit));
    }
  }

  CachedBinary built = build();  // may throw: nothing is published, the lock is released
  if (built.arch.empty()) built.arch = arch;
  if (built.key.empty()) built.key = key;
  if (built.arch != arch || built.key != key)
    throw Error(fmt::format("moejit: the build for {}/{} returned a binary for {}/{}", arch, key,
                            built.arch, built.key));
  if (d && !publish_failed_.load()) {
    std::string why;
    // A failed publish (full or read-only disk) leaves no entry. Warn once and stop publishing:
    // retrying each kernel would fail the same way; loads still work.
    if (!d->publish(built, &why) && !publish_failed_.exchange(true))
      fmt::print(stderr, "moejit: cannot publish to the cache under {} ({}); keeping new binaries in memory only\n",
                 d->root(), why);
  }
  *outcome = CacheOutcome::Built;
  return std::make_shared<const CachedBinary>(std::move(built));
}

void KernelCache::clear_memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.clear();
}

KernelCache& global_cache() {
  // Built on first use (thread-safe static init) and never destroyed: threads still compiling at
  // exit must not find it torn down.
  static KernelCache* cache = [] {
    const Knobs& k = knobs();
    auto* c = new KernelCache(CacheOptions{k.cache_dir, k.cache_max_bytes, k.disk_cache});
    // Warn when the disk was wanted but cannot be used; turning it off is no surprise.
    if (k.disk_cache && !c->warning().empty()) fmt::print(stderr, "{}\n", c->warning());
    return c;
  }();
  return *cache;
}

}  // namespace moejit
