#include "cache/cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/format.h>

namespace moejit::cache_files {
namespace {

constexpr size_t kWriteChunk = size_t{1} << 20;

struct timespec now_realtime() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

}  // namespace

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() { return std::exchange(fd_, -1); }

RemoveOnExit::~RemoveOnExit() {
  if (path_.empty()) return;
  remove_tree(path_);  // best effort; a leftover is swept after an hour
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

bool trusted(const struct stat& st) {
  return st.st_uid == ::geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

std::string distrust(const std::string& path, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) return fmt::format("{} is not a directory", path);
  if (st.st_uid != ::geteuid())
    return fmt::format("{} is owned by uid {}, not by this user (uid {}); refusing it", path,
                       st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fmt::format(
        "{} is writable by group or others (mode {:o}); refusing it, since a shared writable "
        "cache lets others inject code (fix: chmod 700 {})",
        path, st.st_mode & 07777, path);
  return {};
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void stamp(int dirfd) {
  struct timespec times[2] = {{0, UTIME_OMIT}, now_realtime()};
  (void)::futimens(dirfd, times);
}

int mkdir_p(const std::string& path) {
  if (path.empty()) return ENOENT;
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (prefix.back() == '/') continue;  // "a//b"
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      if (::chmod(prefix.c_str(), 0700) != 0) return errno;
      continue;
    }
    int err = errno;
    if (err != EEXIST) return err;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  }
  return 0;
}

std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }
std::string base_of(const std::string& path) { return path.substr(path.rfind('/') + 1); }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (struct dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

int64_t bytes_in(const std::string& dir) {
  int64_t total = 0;
  for (const auto& name : names_in(dir)) {
    struct stat st {};
    std::string p = dir + "/" + name;
    if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += st.st_size;
  }
  return total;
}

int write_file(int dirfd, const char* name, std::string_view data) {
  Fd fd(::openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return errno;
  size_t done = 0;
  while (done < data.size()) {
    size_t n = std::min(kWriteChunk, data.size() - done);
    ssize_t w = ::write(fd.get(), data.data() + done, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd.get()) != 0) return errno;
  if (::close(fd.release()) != 0) return errno;
  return 0;
}

FileState read_file(int dirfd, const char* name, std::string* out, size_t max_bytes) {
  Fd fd(::openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) return errno == ENOENT ? FileState::Missing : FileState::Unreadable;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return FileState::Unreadable;
  if (!trusted(st)) return FileState::Refused;
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return FileState::TooLarge;
  out->clear();
  out->reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      return FileState::Unreadable;
    }
    if (r == 0) break;
    out->append(buf, static_cast<size_t>(r));
    if (out->size() > max_bytes) return FileState::TooLarge;  // it grew while read
  }
  return FileState::Ok;
}

std::string unique_name(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.{}.{}", prefix, ::getpid(), counter.fetch_add(1));
}

}  // namespace moejit::cache_files
