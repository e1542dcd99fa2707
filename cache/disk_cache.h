// The disk cache: <root>/v1/<arch>/<key[0:2]>/<key>/{kernel.cu, kernel.cubin, meta.json}.
//
// Crash and race safety: an entry is written in a private temp folder under <root>/v1/tmp (same
// filesystem) and published with one rename(2), so a reader sees a whole entry or none; a process
// killed mid-publish leaves only a temp folder, which later sweeps remove. Two processes racing on
// one key both succeed: the loser's rename fails with EEXIST/ENOTEMPTY and its copy is discarded.
// The per-key lock file only saves duplicate compiles; correctness never depends on it.
//
// Trust: the root is created 0700. Entries (and the root) that are not owned by this user or are
// writable by group/others are refused (a shared writable cache is a code-injection path).
// Loads verify the cubin's SHA-256 against meta.json; a bad entry is moved aside to
// <root>/v1/quarantine and reported as a miss, so the caller rebuilds it. The quarantine keeps the
// newest kQuarantineKeep entries for inspection; its bytes count against the size cap (evicted
// first) and prune() empties it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/cached_binary.h"

namespace moejit {

struct DiskEntryInfo {
  std::string arch;
  std::string key;
  std::string path;
  int64_t bytes = 0;
  int64_t last_used_unix = 0;               // seconds; loads refresh it (LRU)
  std::vector<std::string> kernel_names;
};

// An entry verify() did not pass, and why (worded for the user).
struct DiskVerifyFinding {
  std::string path, why;
};

struct DiskVerifyResult {
  int checked = 0;
  std::vector<DiskVerifyFinding> bad;       // failed its checks and was quarantined
  std::vector<DiskVerifyFinding> refused;   // not owned by this user or writable by others; left in place
};

// Held while compiling a key; releases on destruction. Advisory (flock), best effort.
class DiskLock {
 public:
  virtual ~DiskLock() = default;
};

class DiskCache {
 public:
  // Opens (creating, 0700) `root`. Never throws for an unusable root: usable() is then false
  // and reason() says why (read-only, not owned by this user, writable by others, ...).
  DiskCache(std::string root, int64_t max_bytes);

  bool usable() const { return usable_; }
  const std::string& reason() const { return reason_; }
  // A usable cache that cannot be written: load() reads its entries, publish() fails saying so
  // (read_only_reason), prune() and clear() throw Error.
  bool read_only() const { return read_only_; }
  const std::string& read_only_reason() const { return read_only_reason_; }
  const std::string& root() const { return root_; }

  // The entry for (arch, key), verified; nullopt on a miss, a refused or a corrupt entry. A refused
  // entry (left in place: not this user's to move) sets `*refused` to its path and why.
  std::optional<CachedBinary> load(const std::string& arch, const std::string& key,
                                   DiskVerifyFinding* refused = nullptr);

  // Publishes atomically; returns false (and leaves no partial entry) when the disk refuses,
  // saying why in `*error` when given. Returns true when another process published the key first.
  // Then evicts least-recently-used entries while the cache exceeds max_bytes.
  bool publish(const CachedBinary& binary, std::string* error = nullptr);

  // Cross-process lock for one key (saves duplicate compiles only). Null when unusable.
  std::unique_ptr<DiskLock> lock(const std::string& arch, const std::string& key);

  // Removes the entry (arch, key) so that a new publish replaces it (autotune records); false when
  // there is none or it is not this user's.
  bool remove(const std::string& arch, const std::string& key);

  std::vector<DiskEntryInfo> list() const;
  int64_t total_bytes() const;
  DiskVerifyResult verify();
  int clear();                               // removes every entry; returns how many
  // Empties the quarantine, then LRU-evicts entries down to max_bytes; returns how many entries.
  int prune(int64_t max_bytes);
  int64_t quarantine_bytes() const;          // what the quarantine holds

  static constexpr int kQuarantineKeep = 8;

 private:
  struct Scanned;
  std::string open_root();                  // creates the layout; returns why it is unusable, or ""
  void sweep_tmp();
  std::vector<Scanned> scan() const;
  std::string entry_dir(const std::string& arch, const std::string& key) const;
  void quarantine(const std::string& dir);
  struct Quarantined;
  std::vector<Quarantined> quarantined() const;  // oldest first
  void trim_quarantine(size_t keep);
  bool remove_entry(const std::string& dir, bool* gone) const;
  int evict_to(int64_t max_bytes, const std::string& keep);

  std::string root_;
  int64_t max_bytes_;
  bool usable_ = false;
  std::string reason_;
  bool read_only_ = false;
  std::string read_only_reason_;
};

}  // namespace moejit
