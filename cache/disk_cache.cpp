// The disk cache (DESIGN.md decision 5): layout, trust checks, atomic publish, verified loads,
// quarantine, LRU eviction and the per-key lock. What an entry holds (its files, meta.json and
// their checks) is disk_entry.cpp's; the POSIX file work (reads, fsynced writes, folder walking,
// removal) is cache_files.cpp's.
//
// Layout under <root>/v1:
//   <arch>/<key[0:2]>/<key>/{kernel.cu, kernel.cubin, meta.json}   published entries
//   tmp/<key>.XXXXXX                 a publish in progress (or one whose process died)
//   tmp/evict.<key>.<pid>.<n>        an entry being deleted (moved here first, then removed)
//   quarantine/<key>.<pid>.<n>       entries that failed verification, the newest
//                                    kQuarantineKeep kept for inspection
//   locks/<key>.lock                 flock(2) files; only clear() deletes them
// A process holds flock(2) on each tmp folder it works in until it is done, so a sweep tells a
// dead process's leftovers (no lock) from live work at once, not only after an hour.
//
// LRU stamp: the entry folder's mtime. Publish and every successful load set it to the current
// time (taken from the clock, with nanoseconds, not UTIME_NOW, whose coarse kernel clock can give
// two quick loads the same stamp). Nothing else changes the folder's mtime: its files are
// written before the publishing rename and never touched after it.
//
// Every filesystem failure is reported through return values (false, nullopt, an empty list, a
// reason); nothing here throws except std::bad_alloc.
#include "cache/disk_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include "cache/cache_files.h"
#include "cache/disk_entry.h"
#include "common/error.h"

namespace moejit {

using cache_files::base_of;
using cache_files::bytes_in;
using cache_files::distrust;
using cache_files::errno_text;
using cache_files::Fd;
using cache_files::mkdir_p;
using cache_files::mtime_ns;
using cache_files::names_in;
using cache_files::parent_of;
using cache_files::RemoveOnExit;
using cache_files::remove_tree;
using cache_files::stamp;
using cache_files::trusted;
using cache_files::unique_name;
using disk_entry::EntryRead;
using disk_entry::read_entry;
using disk_entry::valid_arch;
using disk_entry::valid_key;

namespace {

constexpr int64_t kStaleTmpSeconds = 3600;
// A tmp folder is locked right after it is made; one this old without a lock has no live owner.
constexpr int64_t kUnlockedTmpSeconds = 10;

// Takes the working lock of a tmp folder (see the layout); false if another process holds it.
bool lock_folder(int fd, bool wait) {
  while (::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0)
    if (errno != EINTR) return false;
  return true;
}

// The root-level failure, worded for the one warning the user sees.
std::string describe_failure(const std::string& root, const std::string& doing, int err) {
  switch (err) {
    case EROFS:
    case EACCES:
    case EPERM:
      return fmt::format("cache root {} is read-only ({}: {})", root, doing, errno_text(err));
    case ENOTDIR:
    case EEXIST:
      return fmt::format("cache root {} is not a directory ({}: {})", root, doing, errno_text(err));
    case ENOSPC:
    case EDQUOT:
      return fmt::format("cache root {} is on a full disk ({}: {})", root, doing, errno_text(err));
    default:
      return fmt::format("cache root {} is not usable ({}: {})", root, doing, errno_text(err));
  }
}

}  // namespace

struct DiskCache::Quarantined {
  std::string path;
  int64_t bytes = 0;
  int64_t ctime_ns = 0;  // when it was moved in (a rename sets the ctime)
};

struct DiskCache::Scanned {
  std::string arch, key, path;
  int64_t bytes = 0;
  int64_t mtime_ns = 0;
  bool trusted = false;
};

DiskCache::DiskCache(std::string root, int64_t max_bytes)
    : root_(std::move(root)), max_bytes_(max_bytes) {
  reason_ = open_root();
  usable_ = reason_.empty();
  if (usable_ && !read_only_) sweep_tmp();
}

std::string DiskCache::open_root() {
  if (root_.empty()) return "no cache root is set";
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  // The cache takes over its root's v1/ folder: the filesystem's root is nobody's cache.
  if (root_ == "/") return "the cache root is '/', the filesystem's root; give the cache a folder of its own";
  if (int err = mkdir_p(root_)) return describe_failure(root_, "creating it", err);
  struct stat st {};
  if (::stat(root_.c_str(), &st) != 0) return describe_failure(root_, "stat", errno);
  if (std::string why = distrust(root_, st); !why.empty()) return "cache root " + why;
  // The service folders are checked without following links: a link here was not made by us.
  // A populated cache that cannot be written (a read-only bind mount or image layer, mode 555: how
  // a fleet ships prebuilt binaries) is still read: read_only_, loads only.
  auto read_only_error = [](int err) { return err == EROFS || err == EACCES || err == EPERM; };
  int refused = 0;  // the errno of a service folder that could not be created
  for (const char* sub : {"/v1", "/v1/tmp", "/v1/quarantine", "/v1/locks"}) {
    std::string path = root_ + sub;
    if (::mkdir(path.c_str(), 0700) == 0) {
      (void)::chmod(path.c_str(), 0700);
    } else if (errno != EEXIST) {
      const int err = errno;
      if (!read_only_error(err)) return describe_failure(root_, "creating " + path, err);
      read_only_ = true;
      refused = err;
      // Without v1/ there is nothing to read; the service folders only matter for writing.
      if (::lstat(path.c_str(), &st) != 0) {
        if (std::string(sub) == "/v1") return describe_failure(root_, "creating " + path, err);
        continue;
      }
    }
    if (::lstat(path.c_str(), &st) != 0) return describe_failure(root_, "stat " + path, errno);
    if (std::string why = distrust(path, st); !why.empty()) return "cache folder " + why;
  }
  // The folders may exist from an earlier run on a now read-only disk: probe by writing.
  std::string probe = root_ + "/v1/tmp/probe.XXXXXX";
  const int fd = read_only_ ? -1 : ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = read_only_ ? refused : errno;
    if (!read_only_error(err)) return describe_failure(root_, "creating a file in " + root_ + "/v1/tmp", err);
    read_only_ = true;
    read_only_reason_ = describe_failure(root_, "creating a file in " + root_ + "/v1/tmp", err);
    return {};
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

// Removes what dead processes left in tmp: publishes and evictions cut short, probe files. A
// folder nobody holds the lock of (after the moment between its creation and its lock) is a dead
// process's; anything older than an hour too (a lock on a filesystem without flock, a stray
// file). A live publish takes seconds. Other users' leftovers are left alone.
void DiskCache::sweep_tmp() {
  std::string tmp = root_ + "/v1/tmp";
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  for (const auto& name : names_in(tmp)) {
    std::string path = tmp + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    const int64_t age = now - static_cast<int64_t>(st.st_mtim.tv_sec);
    bool dead = age > kStaleTmpSeconds;
    if (!dead && age > kUnlockedTmpSeconds) {
      if (S_ISDIR(st.st_mode)) {
        Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        dead = fd.get() >= 0 && lock_folder(fd.get(), false);  // released when fd closes
      } else {
        dead = true;  // only folders are worked in; a file here is a killed open_root()'s probe
      }
    }
    if (dead) remove_tree(path);
  }
}

std::string DiskCache::entry_dir(const std::string& arch, const std::string& key) const {
  return fmt::format("{}/v1/{}/{}/{}", root_, arch, key.substr(0, 2), key);
}

// Moves a bad entry aside so no one trusts it again and the next publish can take its path.
// If another process moved or evicted it first, the rename fails and there is nothing to do.
// The quarantine then keeps its newest kQuarantineKeep entries.
void DiskCache::quarantine(const std::string& dir) {
  std::string key = base_of(dir);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::string target = root_ + "/v1/quarantine/" + unique_name(key);
    if (::rename(dir.c_str(), target.c_str()) == 0) break;
    if (errno != EEXIST && errno != ENOTEMPTY) return;  // a name left by a dead pid: try the next
  }
  trim_quarantine(kQuarantineKeep);
}

std::vector<DiskCache::Quarantined> DiskCache::quarantined() const {
  std::vector<Quarantined> out;
  const std::string dir = root_ + "/v1/quarantine";
  for (const auto& name : names_in(dir)) {
    Quarantined q{dir + "/" + name};
    struct stat st {};
    if (::lstat(q.path.c_str(), &st) != 0) continue;
    q.bytes = S_ISDIR(st.st_mode) ? bytes_in(q.path) : static_cast<int64_t>(st.st_size);
    q.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    out.push_back(std::move(q));
  }
  std::sort(out.begin(), out.end(), [](const Quarantined& a, const Quarantined& b) {
    return a.ctime_ns != b.ctime_ns ? a.ctime_ns < b.ctime_ns : a.path < b.path;
  });
  return out;
}

void DiskCache::trim_quarantine(size_t keep) {
  std::vector<Quarantined> all = quarantined();
  for (size_t i = 0; i + keep < all.size(); ++i) remove_tree(all[i].path);
}

int64_t DiskCache::quarantine_bytes() const {
  int64_t total = 0;
  for (const auto& q : quarantined()) total += q.bytes;
  return total;
}

std::optional<CachedBinary> DiskCache::load(const std::string& arch, const std::string& key,
                                            DiskVerifyFinding* refused) {
  if (!usable_ || !valid_arch(arch) || !valid_key(key)) return std::nullopt;
  std::string dir = entry_dir(arch, key);
  // Open the folder once and read its files relative to it, so a concurrent eviction or
  // quarantine (a rename) cannot mix files of two entries. ENOENT is a plain miss; a link or a
  // file in the entry's place is refused.
  Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dirfd.get() < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(dirfd.get(), &st) != 0) return std::nullopt;
  if (!trusted(st)) {
    if (refused) *refused = {dir, distrust(dir, st)};
    return std::nullopt;
  }
  EntryRead read = read_entry(dirfd.get(), arch, key);
  if (read.status == EntryRead::Refused) {  // not ours: never moved, never deleted
    if (refused) *refused = {dir, read.why};
    return std::nullopt;
  }
  if (read.status == EntryRead::Corrupt) {
    // Quarantine only the folder we read: if it was replaced since (evicted and republished by
    // another process), the path now holds someone's fresh entry. The remaining window between
    // this check and the rename costs at most one rebuild, never a bad load.
    struct stat now {};
    if (::lstat(dir.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino)
      quarantine(dir);
    return std::nullopt;
  }
  stamp(dirfd.get());
  return std::move(read.binary);
}

bool DiskCache::publish(const CachedBinary& binary, std::string* error) {
  auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return false;
  };
  if (!usable_) return fail(reason_);
  if (read_only_) return fail(read_only_reason_);
  if (!valid_arch(binary.arch) || !valid_key(binary.key))
    return fail(fmt::format("arch '{}' or key '{}' cannot name a cache entry", binary.arch, binary.key));

  // Build the entry in a private folder on the same filesystem. A crash from here to the rename
  // leaves only this folder, which no reader looks at and sweep_tmp() removes after an hour.
  std::string tmp = root_ + "/v1/tmp/" + binary.key + ".XXXXXX";
  if (!::mkdtemp(tmp.data()))
    return fail(fmt::format("creating a temp folder in {}/v1/tmp: {}", root_, errno_text(errno)));
  RemoveOnExit cleanup(tmp);
  (void)::chmod(tmp.c_str(), 0700);  // mkdtemp's 0700 passes through the umask
  Fd tmpfd(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (tmpfd.get() < 0) return fail(fmt::format("opening {}: {}", tmp, errno_text(errno)));
  (void)lock_folder(tmpfd.get(), true);  // held until tmpfd closes: sweeps leave the folder alone

  if (std::string why = disk_entry::write_entry(tmpfd.get(), tmp, binary); !why.empty())
    return fail(std::move(why));
  if (::fsync(tmpfd.get()) != 0) return fail(fmt::format("fsync {}: {}", tmp, errno_text(errno)));

  std::string dir = entry_dir(binary.arch, binary.key);
  std::string parent = parent_of(dir);
  // Whatever stands where a folder of this path belongs (a file, a link, to another entry or
  // anywhere) is moved to the quarantine: left there it would fail every publish of the key.
  for (const std::string& path : {parent_of(parent), parent, dir}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) quarantine(path);
  }
  if (int err = mkdir_p(parent)) return fail(fmt::format("creating {}: {}", parent, errno_text(err)));
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    // EEXIST/ENOTEMPTY: another process published this key first. Its entry is equivalent (same
    // key, same inputs); ours is discarded by `cleanup`. If theirs is bad, the next load
    // quarantines it and the key is rebuilt.
    if (errno == EEXIST || errno == ENOTEMPTY) return true;
    return fail(fmt::format("renaming {} to {}: {}", tmp, dir, errno_text(errno)));
  }
  cleanup.release();
  // Make the rename durable; the entry is already visible and whole if this fails.
  if (Fd pfd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); pfd.get() >= 0)
    (void)::fsync(pfd.get());
  if (Fd efd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)); efd.get() >= 0)
    stamp(efd.get());
  if (max_bytes_ > 0) evict_to(max_bytes_, dir);
  return true;
}

namespace {

// flock(2) on a lock file: released when the descriptor closes, including when the process dies,
// so a crashed compiler never blocks others.
class FlockLock : public DiskLock {
 public:
  explicit FlockLock(int fd) : fd_(fd) {}
  ~FlockLock() override { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace

std::unique_ptr<DiskLock> DiskCache::lock(const std::string& arch, const std::string& key) {
  if (!usable_ || !valid_arch(arch) || !valid_key(key)) return nullptr;
  std::string path = root_ + "/v1/locks/" + key + ".lock";
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return nullptr;
  while (::flock(fd.get(), LOCK_EX) != 0)
    if (errno != EINTR) return nullptr;
  return std::make_unique<FlockLock>(fd.release());
}

std::vector<DiskCache::Scanned> DiskCache::scan() const {
  std::vector<Scanned> out;
  if (!usable_) return out;
  std::string v1 = root_ + "/v1";
  for (const auto& arch : names_in(v1)) {
    if (!valid_arch(arch)) continue;
    for (const auto& prefix : names_in(v1 + "/" + arch)) {
      if (prefix.size() != 2) continue;
      for (const auto& key : names_in(v1 + "/" + arch + "/" + prefix)) {
        if (!valid_key(key) || key.compare(0, 2, prefix) != 0) continue;
        Scanned s{arch, key, entry_dir(arch, key)};
        struct stat st {};
        if (::lstat(s.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        s.bytes = bytes_in(s.path);
        s.mtime_ns = mtime_ns(st);
        s.trusted = trusted(st);
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

std::vector<DiskEntryInfo> DiskCache::list() const {
  std::vector<DiskEntryInfo> out;
  for (auto& s : scan()) {
    DiskEntryInfo info;
    info.arch = s.arch;
    info.key = s.key;
    info.path = s.path;
    info.bytes = s.bytes;
    info.last_used_unix = s.mtime_ns / 1000000000;
    // Kernel names for display only; a bad meta.json shows none (verify() reports it).
    if (Fd fd(::open(s.path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)); fd.get() >= 0)
      info.kernel_names = disk_entry::kernel_names(fd.get());
    out.push_back(std::move(info));
  }
  return out;
}

int64_t DiskCache::total_bytes() const {
  int64_t total = 0;
  for (const auto& s : scan()) total += s.bytes;
  return total;
}

DiskVerifyResult DiskCache::verify() {
  DiskVerifyResult result;
  for (const auto& s : scan()) {
    ++result.checked;
    Fd fd(::open(s.path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) continue;  // evicted meanwhile
    if (!s.trusted) {
      struct stat st {};
      result.refused.push_back({s.path, ::fstat(fd.get(), &st) == 0 ? distrust(s.path, st) : "cannot stat it"});
      continue;
    }
    EntryRead read = read_entry(fd.get(), s.arch, s.key);  // no LRU stamp: verifying is not a use
    if (read.status == EntryRead::Refused) {
      result.refused.push_back({s.path, read.why});
    } else if (read.status == EntryRead::Corrupt) {
      quarantine(s.path);
      result.bad.push_back({s.path, read.why});
    }
  }
  return result;
}

// Deletes an entry by first renaming it into tmp (one atomic step: readers see the whole entry
// or none), then removing it; an interrupted removal is swept later. `*gone` says the entry had
// already disappeared (another process evicted it).
bool DiskCache::remove(const std::string& arch, const std::string& key) {
  if (!usable_ || !valid_arch(arch) || !valid_key(key)) return false;
  const std::string dir = entry_dir(arch, key);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || !trusted(st)) return false;
  bool gone = false;
  return remove_entry(dir, &gone);
}

bool DiskCache::remove_entry(const std::string& dir, bool* gone) const {
  *gone = false;
  // Locked before it moves into tmp, so a sweep never takes it for a dead process's.
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() >= 0) (void)lock_folder(fd.get(), true);
  std::string target = root_ + "/v1/tmp/" + unique_name("evict." + base_of(dir));
  if (::rename(dir.c_str(), target.c_str()) != 0) {
    *gone = errno == ENOENT;
    return false;
  }
  remove_tree(target);
  return true;
}

// Evicts the quarantine's entries, then least-recently-used entries (oldest mtime first; ties by
// path, for a fixed order) until the total is at most `max_bytes`. Skips `keep` (the entry just
// published) and entries that are not ours. Concurrent evictors may both remove an entry's worth:
// the cache then ends a little under the cap, never over it because of the race.
int DiskCache::evict_to(int64_t max_bytes, const std::string& keep) {
  std::vector<Scanned> entries = scan();
  int64_t total = 0;
  for (const auto& s : entries) total += s.bytes;
  // The quarantine's bytes count too, and go first (oldest first): they serve no load.
  const std::vector<Quarantined> held = quarantined();
  for (const auto& q : held) total += q.bytes;
  for (const auto& q : held) {
    if (total <= max_bytes) break;
    remove_tree(q.path);
    total -= q.bytes;
  }
  std::sort(entries.begin(), entries.end(), [](const Scanned& a, const Scanned& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
  });
  int removed = 0;
  for (const auto& s : entries) {
    if (total <= max_bytes) break;
    if (s.path == keep || !s.trusted) continue;
    bool gone = false;
    if (remove_entry(s.path, &gone)) {
      ++removed;
      total -= s.bytes;
    } else if (gone) {
      total -= s.bytes;
    }
  }
  return removed;
}

int DiskCache::prune(int64_t max_bytes) {
  if (!usable_) return 0;
  if (read_only_) throw Error(read_only_reason_ + "; nothing can be evicted");
  trim_quarantine(0);
  return evict_to(std::max<int64_t>(max_bytes, 0), std::string());
}

// Removes every entry (ours or not: the user asked for it, and the tree is ours), the
// quarantine, and the lock files. Removing a lock file another process holds only risks one
// duplicate compile, never a bad entry.
int DiskCache::clear() {
  if (!usable_) return 0;
  if (read_only_) throw Error(read_only_reason_ + "; nothing can be removed");
  int removed = 0;
  for (const auto& s : scan()) {
    bool gone = false;
    if (remove_entry(s.path, &gone)) ++removed;
  }
  for (const char* sub : {"/v1/quarantine", "/v1/locks"}) {
    std::string dir = root_ + sub;
    for (const auto& name : names_in(dir)) remove_tree(dir + "/" + name);
  }
  return removed;
}

}  // namespace moejit
