// File-system pieces of the disk cache (disk_cache.cpp): descriptors, ownership and permission
// checks, whole-file reads and writes with fsync, folder creation and walking, removal, the LRU
// stamp. They know nothing of entries or keys. Each says what a crash or a concurrent process
// does to it. Failures come back as errno values or states; nothing here throws except
// std::bad_alloc.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moejit::cache_files {

// strerror for an errno value.
std::string errno_text(int err);

// Closes a descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_;
};

// Removes a folder on scope exit unless released (a failed or lost publish leaves nothing). A
// process killed before the destructor runs leaves the folder; callers keep such folders where a
// sweep finds them.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  ~RemoveOnExit();
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// Removes a file or folder tree, best effort: errors (a file another process removed first, a
// folder another user owns) are ignored, and what is left stays until someone removes it.
void remove_tree(const std::string& path);

// Trusted: owned by this user and not writable by group or others.
bool trusted(const struct stat& st);

// Why a folder may not be trusted (not a folder, another user's, writable by group or others),
// worded for the user with the fix; "" when it may.
std::string distrust(const std::string& path, const struct stat& st);

// The modification time in nanoseconds.
int64_t mtime_ns(const struct stat& st);

// Sets the folder's mtime to now (from the clock, with nanoseconds, not UTIME_NOW, whose coarse
// kernel clock can give two quick calls the same stamp), atime untouched. Best effort (a
// read-only disk keeps the old one).
void stamp(int dirfd);

// mkdir -p: every folder it creates gets mode 0700 (chmod after mkdir, so the umask cannot widen
// or narrow it). Returns 0 or an errno; ENOTDIR when a component exists but is not a folder. A
// folder another process creates meanwhile counts as created.
int mkdir_p(const std::string& path);

// "a/b/c" -> "a/b" and "c".
std::string parent_of(const std::string& path);
std::string base_of(const std::string& path);

// Names in a folder, sorted, without "." and ".."; empty when it cannot be read. Names added or
// removed by another process while it reads may or may not be listed.
std::vector<std::string> names_in(const std::string& dir);

// Sum of the regular files' sizes directly inside `dir` (links and subfolders are not counted).
int64_t bytes_in(const std::string& dir);

// Writes a new file (O_EXCL, mode 0600) in `dirfd` and fsyncs it. Returns 0 or an errno.
// Writes go out in pieces of at most 1 MiB; the cache tests' worker paces them to be killed
// mid-write, which leaves a partial file: callers write into a temp folder that only a rename
// publishes.
int write_file(int dirfd, const char* name, std::string_view data);

enum class FileState { Ok, Missing, Refused, Unreadable, TooLarge };

// Reads a whole file of `dirfd`, refusing one that is not a regular file owned by this user and
// closed to writes by group/others (Refused), a link or anything but a regular file (Unreadable:
// opened without blocking, so a FIFO cannot hang the reader), or one larger than max_bytes
// (TooLarge: a huge sparse file is never allocated). Reading relative to an opened folder means a
// concurrent rename of the folder cannot mix in another folder's files.
FileState read_file(int dirfd, const char* name, std::string* out, size_t max_bytes);

// "<prefix>.<pid>.<n>": unique within this process, and among live processes. A name left by a
// dead process with the same pid can exist: callers renaming onto it see EEXIST and retry.
std::string unique_name(const std::string& prefix);

}  // namespace moejit::cache_files
