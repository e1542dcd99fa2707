// The cache of DESIGN.md decision 5: key, disk layout, verification, trust, races and crashes.
// Every test works in a fresh mkdtemp folder that it removes afterwards. Tests that need a second
// process run tests/cpu/cache_worker.cpp (MOEJIT_CACHE_WORKER).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/cache_key.h"
#include "cache/disk_cache.h"
#include "common/error.h"
#include "cache/kernel_cache.h"

namespace moejit {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A fresh private folder; the cache root is <dir>/cache, so DiskCache creates it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/moejit-cache-test.XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    // Tests chmod and chown things; make everything removable again before removing it.
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::end(it);
         it.increment(ec))
      ::chmod(it->path().c_str(), 0700);
    ::chmod(path_.c_str(), 0700);
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string root() const { return path_ + "/cache"; }

 private:
  std::string path_;
};

std::string key_of(const std::string& name) { return sha256_hex(name); }

CachedBinary make_binary(const std::string& arch, const std::string& key, size_t cubin_bytes = 1000,
                         char fill = 'c') {
  CachedBinary b;
  b.arch = arch;
  b.key = key;
  b.source = "extern \"C\" __global__ void moejit_test_" + key.substr(0, 8) + "() {}\n";
  b.kernel_names = {"moejit_test_" + key.substr(0, 8), "moejit_other"};
  // A cubin holds its entry points' names (an entry's load checks that): written over its start.
  b.cubin = std::string(cubin_bytes, fill);
  const std::string names = b.kernel_names[0] + '\0' + b.kernel_names[1] + '\0';
  b.cubin.replace(0, std::min(names.size(), cubin_bytes), names, 0, std::min(names.size(), cubin_bytes));
  b.meta = {{"nvrtc_ms", 12.5}, {"options", {"-arch=sm_90a", "-default-device"}}};
  return b;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

int mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec))
    names.push_back(it->path().filename().string());
  return names;
}

// ---- key ----------------------------------------------------------------------------------

TEST(CacheKey, Sha256MatchesKnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

CacheKeyBuilder base_key(int changed_field = -1, const std::string& changed_value = "") {
  const std::pair<const char*, const char*> fields[] = {
      {"schema", "1"},         {"generator", "0.1.0"},       {"source", "extern \"C\" ..."},
      {"headers", "d41d8cd9"}, {"nvrtc", "12.4"},            {"options", "-default-device"},
      {"arch", "sm_90a"},      {"MOEJIT_LINEINFO", "0"}};
  CacheKeyBuilder b;
  for (int i = 0; i < static_cast<int>(std::size(fields)); ++i)
    b.add(fields[i].first, i == changed_field ? changed_value : fields[i].second);
  return b;
}

TEST(CacheKey, StableAndLowercaseHex) {
  std::string a = base_key().digest();
  EXPECT_EQ(a, base_key().digest());
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(base_key().fields().size(), 8u);
  EXPECT_EQ(base_key().fields()[6], (std::pair<std::string, std::string>{"arch", "sm_90a"}));
}

TEST(CacheKey, EveryFieldChangesTheKey) {
  std::string base = base_key().digest();
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NE(base_key(i, "changed").digest(), base);
    EXPECT_NE(base_key(i, "").digest(), base);
  }
  // Labels and order count too.
  EXPECT_NE(CacheKeyBuilder().add("a", "1").digest(), CacheKeyBuilder().add("b", "1").digest());
  EXPECT_NE(CacheKeyBuilder().add("a", "1").add("b", "2").digest(),
            CacheKeyBuilder().add("b", "2").add("a", "1").digest());
  EXPECT_NE(CacheKeyBuilder().digest(), CacheKeyBuilder().add("", "").digest());
}

TEST(CacheKey, FramingIsUnambiguous) {
  // Label/value boundary.
  EXPECT_NE(CacheKeyBuilder().add("ab", "c").digest(), CacheKeyBuilder().add("a", "bc").digest());
  // Value moved between neighbouring fields.
  EXPECT_NE(CacheKeyBuilder().add("x", "ab").add("y", "c").digest(),
            CacheKeyBuilder().add("x", "a").add("y", "bc").digest());
  // One field vs two fields with the same concatenation.
  EXPECT_NE(CacheKeyBuilder().add("a", "b").digest(), CacheKeyBuilder().add("a", "").add("", "b").digest());
  // The digest is not the hash of the plain concatenation.
  EXPECT_NE(CacheKeyBuilder().add("a", "b").digest(), sha256_hex("ab"));
}

// ---- disk: layout, round trip --------------------------------------------------------------

TEST(DiskCache, PublishAndLoadRoundTrip) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  ASSERT_TRUE(disk.usable()) << disk.reason();
  std::string key = key_of("round-trip");
  CachedBinary b = make_binary("sm_90a", key);
  b.cubin[100] = '\0';  // binary-safe (past the entry names at its start)
  std::string error;
  ASSERT_TRUE(disk.publish(b, &error)) << error;

  std::string dir = tmp.root() + "/v1/sm_90a/" + key.substr(0, 2) + "/" + key;
  EXPECT_EQ(read_text(dir + "/kernel.cu"), b.source);
  EXPECT_EQ(read_text(dir + "/kernel.cubin"), b.cubin);
  nlohmann::json meta = nlohmann::json::parse(read_text(dir + "/meta.json"));
  EXPECT_EQ(meta["cubin_sha256"], sha256_hex(b.cubin));
  EXPECT_EQ(meta["kernel_names"], b.kernel_names);
  EXPECT_EQ(meta["arch"], "sm_90a");
  EXPECT_EQ(meta["key"], key);
  EXPECT_EQ(meta["info"], b.meta);
  EXPECT_EQ(mode_of(dir), 0700);
  EXPECT_EQ(mode_of(dir + "/kernel.cubin"), 0600);
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());

  auto loaded = disk.load("sm_90a", key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->key, key);
  EXPECT_EQ(loaded->arch, "sm_90a");
  EXPECT_EQ(loaded->source, b.source);
  EXPECT_EQ(loaded->cubin, b.cubin);
  EXPECT_EQ(loaded->kernel_names, b.kernel_names);
  EXPECT_EQ(loaded->meta, b.meta);

  EXPECT_FALSE(disk.load("sm_80", key).has_value());             // arch is part of the path
  EXPECT_FALSE(disk.load("sm_90a", key_of("other")).has_value());  // plain miss

  auto entries = disk.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, key);
  EXPECT_EQ(entries[0].arch, "sm_90a");
  EXPECT_EQ(entries[0].path, dir);
  EXPECT_EQ(entries[0].kernel_names, b.kernel_names);
  EXPECT_GT(entries[0].last_used_unix, 0);
  EXPECT_EQ(entries[0].bytes, static_cast<int64_t>(b.source.size() + b.cubin.size() +
                                                   read_text(dir + "/meta.json").size()));
  EXPECT_EQ(disk.total_bytes(), entries[0].bytes);
}

TEST(DiskCache, RefusesNamesThatAreNotPathComponents) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  ASSERT_TRUE(disk.usable()) << disk.reason();
  for (auto [arch, key] : {std::pair<std::string, std::string>{"../x", key_of("a")},
                           {"sm_90a", "../../etc"},
                           {"tmp", key_of("a")},
                           {"", key_of("a")},
                           {"sm_90a", ""}}) {
    SCOPED_TRACE(arch + " " + key);
    std::string error;
    EXPECT_FALSE(disk.publish(make_binary(arch, key), &error));
    EXPECT_FALSE(error.empty());
    EXPECT_FALSE(disk.load(arch, key).has_value());
    EXPECT_EQ(disk.lock(arch, key), nullptr);
  }
  EXPECT_TRUE(disk.list().empty());
  EXPECT_FALSE(fs::exists(tmp.path() + "/x"));
}

TEST(DiskCache, RootAndCreatedFoldersAre0700) {
  TempDir tmp;
  std::string root = tmp.path() + "/a/b/cache";
  // A umask that takes the owner's write bit would leave 0500 folders without the explicit chmod.
  mode_t old_umask = ::umask(0277);
  DiskCache disk(root, 0);
  ::umask(old_umask);
  ASSERT_TRUE(disk.usable()) << disk.reason();
  for (const std::string& p : {tmp.path() + "/a", tmp.path() + "/a/b", root, root + "/v1",
                               root + "/v1/tmp", root + "/v1/quarantine", root + "/v1/locks"}) {
    SCOPED_TRACE(p);
    EXPECT_EQ(mode_of(p), 0700);
  }
  std::string key = key_of("modes");
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
  EXPECT_EQ(mode_of(root + "/v1/sm_90a"), 0700);
  EXPECT_EQ(mode_of(root + "/v1/sm_90a/" + key.substr(0, 2)), 0700);

  // An existing root keeps its mode when it is safe (not writable by group/others).
  std::string existing = tmp.path() + "/existing";
  ASSERT_EQ(::mkdir(existing.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(existing.c_str(), 0755), 0);
  DiskCache reuse(existing, 0);
  EXPECT_TRUE(reuse.usable()) << reuse.reason();
  EXPECT_EQ(mode_of(existing), 0755);
}

// ---- memory cache and single flight ---------------------------------------------------------

TEST(KernelCache, MemoryHitThenDiskHitAfterClearingMemory) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  ASSERT_NE(cache.disk(), nullptr) << cache.warning();
  EXPECT_TRUE(cache.warning().empty());
  std::string key = key_of("memory-disk");
  int builds = 0;
  auto build = [&] {
    ++builds;
    return make_binary("sm_90a", key);
  };
  CacheOutcome outcome{};
  auto first = cache.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  auto second = cache.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::MemoryHit);
  EXPECT_EQ(first, second);  // the same object
  EXPECT_EQ(builds, 1);

  cache.clear_memory();
  auto third = cache.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::DiskHit);
  EXPECT_EQ(third->cubin, first->cubin);
  EXPECT_EQ(third->kernel_names, first->kernel_names);
  EXPECT_EQ(builds, 1);

  // A new cache (a new process, in effect) finds it on disk.
  KernelCache other(CacheOptions{tmp.root(), 0, true});
  other.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::DiskHit);
  EXPECT_EQ(builds, 1);

  EXPECT_EQ(to_string(CacheOutcome::MemoryHit), "memory");
  EXPECT_EQ(to_string(CacheOutcome::DiskHit), "disk");
  EXPECT_EQ(to_string(CacheOutcome::Built), "built");
}

TEST(KernelCache, MemoryOnlyWhenDiskIsOff) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, false});
  EXPECT_EQ(cache.disk(), nullptr);
  EXPECT_NE(cache.warning().find("keeping binaries in memory only"), std::string::npos) << cache.warning();
  std::string key = key_of("memory-only");
  CacheOutcome outcome{};
  cache.get_or_build("sm_90a", key, [&] { return make_binary("sm_90a", key); }, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  cache.get_or_build("sm_90a", key, [&] { return make_binary("sm_90a", key); }, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::MemoryHit);
  EXPECT_FALSE(fs::exists(tmp.root()));
}

// Runs `threads` concurrent get_or_build calls for one key. The build waits until every thread
// has announced itself and then a little more, so the others are inside get_or_build, waiting.
struct Stampede {
  std::atomic<int> builds{0};
  std::atomic<int> arrived{0};
  std::vector<std::shared_ptr<const CachedBinary>> results;
  std::vector<std::string> errors;
  std::vector<CacheOutcome> outcomes;

  void run(KernelCache& cache, const std::string& key, int threads, bool fail) {
    results.assign(threads, nullptr);
    errors.assign(threads, "");
    outcomes.assign(threads, CacheOutcome::MemoryHit);
    auto build = [&] {
      builds.fetch_add(1);
      while (arrived.load() < threads) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(200ms);
      if (fail) throw std::runtime_error("nvrtc says no");
      return make_binary("sm_90a", key);
    };
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&, i] {
        arrived.fetch_add(1);
        try {
          results[i] = cache.get_or_build("sm_90a", key, build, &outcomes[i]);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    }
    for (auto& t : pool) t.join();
  }
};

TEST(KernelCache, SingleFlightBuildsOnce) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  std::string key = key_of("single-flight");
  Stampede s;
  s.run(cache, key, 8, /*fail=*/false);
  EXPECT_EQ(s.builds.load(), 1);
  int built = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(s.errors[i], "");
    ASSERT_NE(s.results[i], nullptr);
    EXPECT_EQ(s.results[i], s.results[0]);  // everyone shares the one binary
    built += s.outcomes[i] == CacheOutcome::Built;
  }
  EXPECT_EQ(built, 1);
  EXPECT_EQ(cache.disk()->list().size(), 1u);
}

TEST(KernelCache, FailedBuildPublishesNothingAndEveryWaiterSeesIt) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  std::string key = key_of("failing-build");
  Stampede s;
  s.run(cache, key, 8, /*fail=*/true);
  EXPECT_EQ(s.builds.load(), 1);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(s.errors[i], "nvrtc says no");
    EXPECT_EQ(s.results[i], nullptr);
  }
  EXPECT_TRUE(cache.disk()->list().empty());
  EXPECT_FALSE(cache.disk()->load("sm_90a", key).has_value());
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());

  // The failure is not remembered: the next call builds.
  CacheOutcome outcome{};
  auto b = cache.get_or_build("sm_90a", key, [&] { return make_binary("sm_90a", key); }, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(cache.disk()->load("sm_90a", key).has_value());
}

TEST(KernelCache, BuildForAnotherKeyIsAnError) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  std::string key = key_of("asked");
  EXPECT_THROW(cache.get_or_build("sm_90a", key, [&] { return make_binary("sm_90a", key_of("other")); }),
               std::exception);
  EXPECT_TRUE(cache.disk()->list().empty());
}

// A disk that starts failing after open (full, remounted read-only) is simulated by replacing
// v1/tmp with a regular file, which fails for root too.
TEST(KernelCache, PublishFailureWarnsOnceAndKeepsBinariesInMemory) {
  TempDir tmp;
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  ASSERT_NE(cache.disk(), nullptr) << cache.warning();
  std::string old_key = key_of("published before");
  cache.get_or_build("sm_90a", old_key, [&] { return make_binary("sm_90a", old_key); });
  cache.clear_memory();
  fs::remove_all(tmp.root() + "/v1/tmp");
  write_text(tmp.root() + "/v1/tmp", "in the way");

  std::string error;
  EXPECT_FALSE(cache.disk()->publish(make_binary("sm_90a", key_of("direct")), &error));
  EXPECT_NE(error.find("v1/tmp"), std::string::npos) << error;

  testing::internal::CaptureStderr();
  CacheOutcome first{}, second{}, old{};
  auto a = cache.get_or_build("sm_90a", key_of("a"), [&] { return make_binary("sm_90a", key_of("a")); }, &first);
  auto b = cache.get_or_build("sm_90a", key_of("b"), [&] { return make_binary("sm_90a", key_of("b")); }, &second);
  cache.get_or_build("sm_90a", old_key, [&] { return make_binary("sm_90a", old_key); }, &old);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, CacheOutcome::Built);
  EXPECT_EQ(second, CacheOutcome::Built);
  EXPECT_EQ(old, CacheOutcome::DiskHit);  // loads still work
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  size_t at = err.find("cannot publish");
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find("cannot publish", at + 1), std::string::npos) << err;  // once
  EXPECT_EQ(cache.disk()->list().size(), 1u);
  CacheOutcome again{};
  cache.get_or_build("sm_90a", key_of("a"), [&] { return make_binary("sm_90a", key_of("a")); }, &again);
  EXPECT_EQ(again, CacheOutcome::MemoryHit);
}

// ---- other processes ------------------------------------------------------------------------

// A started worker: its pid and the read end of its stdout.
struct Worker {
  pid_t pid = -1;
  int out = -1;
};

Worker start_worker(const std::vector<std::string>& args) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> argv;
  std::string exe = MOEJIT_CACHE_WORKER;
  argv.push_back(exe.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  return Worker{pid, pipefd[0]};
}

// Reads the worker's "waiting" line: it is started and polls for its go-file.
void wait_until_waiting(const Worker& w) {
  std::string line;
  char c;
  while (::read(w.out, &c, 1) == 1 && c != '\n') line.push_back(c);
  EXPECT_EQ(line, "waiting");
}

// Waits for the worker; returns the rest of its stdout, and its wait status in `*status`.
std::string finish_worker(Worker w, int* status) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(w.out, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(w.out);
  ::waitpid(w.pid, status, 0);
  return out;
}

TEST(DiskCacheProcesses, TwoPublishersRaceOnOneKey) {
  TempDir tmp;
  std::string key = key_of("race-publish");
  std::string go = tmp.path() + "/go";
  // Both write slowly (about 400 ms) after the same start signal, so both temp folders exist
  // together and both reach the rename; one of them loses it.
  std::vector<Worker> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(start_worker({"publish", tmp.root(), "sm_90a", key, std::to_string(4 << 20),
                                    "--slow-ms", "100", "--go-file", go}));
  for (const auto& w : workers) wait_until_waiting(w);
  write_text(go, "go");
  // Make sure the race happened: both temp folders existed at one time.
  bool both_writing = false;
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       !both_writing && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(1ms)) {
    auto names = names_in(tmp.root() + "/v1/tmp");
    both_writing = std::count_if(names.begin(), names.end(),
                                 [&](const std::string& n) { return n.rfind(key + ".", 0) == 0; }) == 2;
  }
  EXPECT_TRUE(both_writing);
  for (auto& w : workers) {
    int status = 0;
    std::string out = finish_worker(w, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    EXPECT_EQ(out, "published\n");
  }
  DiskCache disk(tmp.root(), 0);
  auto entries = disk.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, key);
  DiskVerifyResult v = disk.verify();
  EXPECT_EQ(v.checked, 1);
  EXPECT_TRUE(v.bad.empty());
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());  // the loser removed its copy
  auto loaded = disk.load("sm_90a", key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->cubin.size(), size_t{4} << 20);
}

TEST(DiskCacheProcesses, TwoProcessesGetOrBuildOneKeyBuildOnce) {
  TempDir tmp;
  std::string key = key_of("race-get-or-build");
  std::string go = tmp.path() + "/go";
  std::vector<Worker> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(start_worker({"get_or_build", tmp.root(), "sm_90a", key, "100000",
                                    "--build-ms", "300", "--go-file", go}));
  for (const auto& w : workers) wait_until_waiting(w);
  write_text(go, "go");
  std::vector<std::string> outs;
  for (auto& w : workers) {
    int status = 0;
    outs.push_back(finish_worker(w, &status));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << outs.back();
  }
  // The lock makes the second process wait and then find the first one's entry on disk.
  int built = 0, disk_hits = 0;
  for (const auto& out : outs) {
    built += out.find("outcome=built\n") != std::string::npos;
    disk_hits += out.find("outcome=disk\n") != std::string::npos;
  }
  EXPECT_EQ(built, 1) << outs[0] << outs[1];
  EXPECT_EQ(disk_hits, 1) << outs[0] << outs[1];
  DiskCache disk(tmp.root(), 0);
  EXPECT_EQ(disk.list().size(), 1u);
  DiskVerifyResult v = disk.verify();
  EXPECT_EQ(v.checked, 1);
  EXPECT_TRUE(v.bad.empty());
}

TEST(DiskCacheProcesses, PublisherKilledMidWriteLeavesNoEntry) {
  TempDir tmp;
  std::string key = key_of("killed");
  const size_t payload = size_t{16} << 20;  // 16 pieces of 1 MiB, 100 ms each
  Worker w = start_worker({"publish", tmp.root(), "sm_90a", key, std::to_string(payload),
                           "--slow-ms", "100"});
  // Wait until kernel.cubin exists in a temp folder and is partly written, then kill -9.
  std::string tmp_dir = tmp.root() + "/v1/tmp", half_written;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (half_written.empty() && std::chrono::steady_clock::now() < deadline) {
    for (const auto& name : names_in(tmp_dir)) {
      std::error_code ec;
      auto size = fs::file_size(tmp_dir + "/" + name + "/kernel.cubin", ec);
      if (!ec && size > 0 && size < payload) half_written = tmp_dir + "/" + name;
    }
    std::this_thread::sleep_for(1ms);
  }
  ::kill(w.pid, SIGKILL);
  int status = 0;
  finish_worker(w, &status);
  ASSERT_FALSE(half_written.empty()) << "never saw a half-written kernel.cubin";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(fs::exists(half_written));  // killed before its rename: the leftover is in tmp

  DiskCache disk(tmp.root(), 0);  // a fresh open does not sweep a temp folder this young
  ASSERT_TRUE(disk.usable()) << disk.reason();
  EXPECT_FALSE(disk.load("sm_90a", key).has_value());
  EXPECT_TRUE(disk.list().empty());
  EXPECT_EQ(disk.total_bytes(), 0);
  EXPECT_FALSE(fs::exists(tmp.root() + "/v1/sm_90a/" + key.substr(0, 2) + "/" + key));

  ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
  auto loaded = disk.load("sm_90a", key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->cubin, make_binary("sm_90a", key).cubin);
}

TEST(DiskCache, StaleTempFoldersAreSweptOnOpen) {
  TempDir tmp;
  { DiskCache create(tmp.root(), 0); }
  std::string old_dir = tmp.root() + "/v1/tmp/" + key_of("old") + ".AbCdEf";
  std::string young_dir = tmp.root() + "/v1/tmp/" + key_of("young") + ".AbCdEf";
  for (const auto& d : {old_dir, young_dir}) {
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    write_text(d + "/kernel.cubin", "half");
  }
  struct timespec two_hours_ago[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old_dir.c_str(), two_hours_ago, 0), 0);
  DiskCache disk(tmp.root(), 0);
  ASSERT_TRUE(disk.usable()) << disk.reason();
  EXPECT_FALSE(fs::exists(old_dir));
  EXPECT_TRUE(fs::exists(young_dir));  // may be a live publish of another process
}

// A publish or eviction holds flock on its tmp folder: a folder seconds old that nobody holds is
// a killed process's and goes at once; one held is live work, whatever its age under an hour.
TEST(DiskCache, TempFoldersOfDeadProcessesAreSweptWithoutWaitingAnHour) {
  TempDir tmp;
  { DiskCache create(tmp.root(), 0); }
  const std::string dead = tmp.root() + "/v1/tmp/" + key_of("dead") + ".AbCdEf";
  const std::string live = tmp.root() + "/v1/tmp/" + key_of("live") + ".AbCdEf";
  const std::string probe = tmp.root() + "/v1/tmp/probe.AbCdEf";
  for (const auto& d : {dead, live}) {
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    write_text(d + "/kernel.cubin", "half");
  }
  write_text(probe, "");
  const int held = ::open(live.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  struct timespec a_minute_ago[2] = {{::time(nullptr) - 60, 0}, {::time(nullptr) - 60, 0}};
  for (const auto& d : {dead, live, probe}) ASSERT_EQ(::utimensat(AT_FDCWD, d.c_str(), a_minute_ago, 0), 0);
  { DiskCache disk(tmp.root(), 0); }
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(probe));
  EXPECT_TRUE(fs::exists(live + "/kernel.cubin"));
  ::close(held);  // its owner "died"
  { DiskCache disk(tmp.root(), 0); }
  EXPECT_FALSE(fs::exists(live));
}

// ---- corruption and quarantine -------------------------------------------------------------

std::string entry_path(const std::string& root, const std::string& key) {
  return root + "/v1/sm_90a/" + key.substr(0, 2) + "/" + key;
}

// The paths of verify()'s findings, sorted; every finding says why.
std::vector<std::string> paths_of(const std::vector<DiskVerifyFinding>& findings) {
  std::vector<std::string> out;
  for (const auto& f : findings) {
    EXPECT_FALSE(f.why.empty()) << f.path;
    out.push_back(f.path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DiskCache, CorruptCubinIsQuarantinedAndRebuilt) {
  TempDir tmp;
  std::string key = key_of("flip");
  {
    DiskCache disk(tmp.root(), 0);
    ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
  }
  std::string dir = entry_path(tmp.root(), key);
  std::string cubin = read_text(dir + "/kernel.cubin");
  cubin[500] ^= 0x01;
  write_text(dir + "/kernel.cubin", cubin);

  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  ASSERT_NE(cache.disk(), nullptr);
  EXPECT_FALSE(cache.disk()->load("sm_90a", key).has_value());
  EXPECT_FALSE(fs::exists(dir));
  auto quarantined = names_in(tmp.root() + "/v1/quarantine");
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(quarantined[0].rfind(key + "." + std::to_string(::getpid()) + ".", 0), 0u) << quarantined[0];
  EXPECT_EQ(read_text(tmp.root() + "/v1/quarantine/" + quarantined[0] + "/kernel.cubin"), cubin);

  int builds = 0;
  CacheOutcome outcome{};
  auto b = cache.get_or_build("sm_90a", key, [&] {
    ++builds;
    return make_binary("sm_90a", key);
  }, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(b->cubin, make_binary("sm_90a", key).cubin);
  EXPECT_TRUE(cache.disk()->load("sm_90a", key).has_value());  // republished, good again
}

TEST(DiskCache, BadMetaOrMissingFilesAreQuarantined) {
  struct Damage {
    const char* what;
    void (*apply)(const std::string& dir);
  };
  const Damage damages[] = {
      {"truncated meta.json",
       [](const std::string& d) {
         std::string m = read_text(d + "/meta.json");
         write_text(d + "/meta.json", m.substr(0, m.size() / 2));
       }},
      {"garbled meta.json", [](const std::string& d) { write_text(d + "/meta.json", "\x01\xff not json"); }},
      {"empty meta.json", [](const std::string& d) { write_text(d + "/meta.json", ""); }},
      {"meta.json without digest",
       [](const std::string& d) {
         auto m = nlohmann::json::parse(read_text(d + "/meta.json"));
         m.erase("cubin_sha256");
         write_text(d + "/meta.json", m.dump());
       }},
      {"meta.json for another key",
       [](const std::string& d) {
         auto m = nlohmann::json::parse(read_text(d + "/meta.json"));
         m["key"] = key_of("someone else");
         write_text(d + "/meta.json", m.dump());
       }},
      {"meta.json with no kernel names",
       [](const std::string& d) {
         auto m = nlohmann::json::parse(read_text(d + "/meta.json"));
         m["kernel_names"] = nlohmann::json::array();
         write_text(d + "/meta.json", m.dump());
       }},
      {"meta.json with a renamed kernel",
       [](const std::string& d) {
         auto m = nlohmann::json::parse(read_text(d + "/meta.json"));
         m["kernel_names"][0] = "moejit_renamed";
         write_text(d + "/meta.json", m.dump());
       }},
      {"meta.json with a bit-flipped kernel name",
       [](const std::string& d) {
         auto m = nlohmann::json::parse(read_text(d + "/meta.json"));
         std::string name = m["kernel_names"][1];
         name[3] ^= 0x01;
         m["kernel_names"][1] = name;
         write_text(d + "/meta.json", m.dump());
       }},
      // Neither may hang or exhaust memory: a FIFO is not opened for a blocking read, a file past
      // an entry's size is not read.
      {"kernel.cubin a FIFO",
       [](const std::string& d) {
         fs::remove(d + "/kernel.cubin");
         ASSERT_EQ(::mkfifo((d + "/kernel.cubin").c_str(), 0600), 0);
       }},
      {"meta.json a FIFO",
       [](const std::string& d) {
         fs::remove(d + "/meta.json");
         ASSERT_EQ(::mkfifo((d + "/meta.json").c_str(), 0600), 0);
       }},
      {"kernel.cubin a 64 GiB sparse file",
       [](const std::string& d) { fs::resize_file(d + "/kernel.cubin", uintmax_t{64} << 30); }},
      {"meta.json missing", [](const std::string& d) { fs::remove(d + "/meta.json"); }},
      {"kernel.cubin missing", [](const std::string& d) { fs::remove(d + "/kernel.cubin"); }},
      {"kernel.cubin truncated", [](const std::string& d) { fs::resize_file(d + "/kernel.cubin", 10); }},
      {"kernel.cu edited", [](const std::string& d) { write_text(d + "/kernel.cu", "// edited\n"); }},
  };
  for (const auto& damage : damages) {
    SCOPED_TRACE(damage.what);
    TempDir tmp;
    std::string key = key_of(damage.what);
    KernelCache cache(CacheOptions{tmp.root(), 0, true});
    auto build = [&] { return make_binary("sm_90a", key); };
    cache.get_or_build("sm_90a", key, build);
    damage.apply(entry_path(tmp.root(), key));

    EXPECT_FALSE(cache.disk()->load("sm_90a", key).has_value());
    EXPECT_FALSE(fs::exists(entry_path(tmp.root(), key)));
    EXPECT_EQ(names_in(tmp.root() + "/v1/quarantine").size(), 1u);

    cache.clear_memory();
    CacheOutcome outcome{};
    cache.get_or_build("sm_90a", key, build, &outcome);
    EXPECT_EQ(outcome, CacheOutcome::Built);
    EXPECT_TRUE(cache.disk()->load("sm_90a", key).has_value());
  }
}

// Whatever stands where an entry's folders belong (a file, a link to another entry) is moved to
// the quarantine by the next publish, which then succeeds; it once failed every run.
TEST(DiskCache, PublishHealsWhatStandsInAnEntrysPlace) {
  const char* damages[] = {"entry is a file", "entry links to another entry", "prefix is a file", "prefix is a link",
                           "arch folder is a file"};
  for (const char* damage : damages) {
    SCOPED_TRACE(damage);
    TempDir tmp;
    DiskCache disk(tmp.root(), 0);
    ASSERT_TRUE(disk.usable()) << disk.reason();
    const std::string key = key_of(damage), other = key_of(std::string(damage) + " other");
    std::string error;
    ASSERT_TRUE(disk.publish(make_binary("sm_90a", other), &error)) << error;
    const std::string dir = entry_path(tmp.root(), key), prefix = fs::path(dir).parent_path().string();
    const std::string arch = fs::path(prefix).parent_path().string();
    const std::string d = damage;
    if (d == "arch folder is a file") {
      fs::remove_all(arch);
      write_text(arch, "x");
    } else if (d.starts_with("prefix")) {
      fs::remove_all(prefix);
      if (d == "prefix is a file") write_text(prefix, "x");
      else fs::create_directory_symlink(fs::path(entry_path(tmp.root(), other)).parent_path(), prefix);
    } else {
      fs::create_directories(prefix);
      if (d == "entry is a file") write_text(dir, "x");
      else fs::create_directory_symlink(entry_path(tmp.root(), other), dir);
    }
    EXPECT_FALSE(disk.load("sm_90a", key).has_value());
    ASSERT_TRUE(disk.publish(make_binary("sm_90a", key), &error)) << error;
    EXPECT_TRUE(disk.load("sm_90a", key).has_value());
    EXPECT_FALSE(names_in(tmp.root() + "/v1/quarantine").empty());
    if (d != "arch folder is a file" && d != "prefix is a file") {  // the linked-to entry is untouched
      EXPECT_TRUE(disk.load("sm_90a", other).has_value());
    }
  }
}

TEST(DiskCache, FilesystemRootIsNotACacheRoot) {
  DiskCache disk("/", 0);
  EXPECT_FALSE(disk.usable());
  EXPECT_NE(disk.reason().find("the filesystem's root"), std::string::npos) << disk.reason();
}

TEST(DiskCache, VerifyReportsAndQuarantinesBadEntries) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  std::vector<std::string> keys;
  for (const char* name : {"good", "flipped", "garbled"}) {
    keys.push_back(key_of(name));
    ASSERT_TRUE(disk.publish(make_binary("sm_90a", keys.back())));
  }
  std::string flipped = entry_path(tmp.root(), keys[1]);
  std::string garbled = entry_path(tmp.root(), keys[2]);
  write_text(flipped + "/kernel.cubin", std::string(1000, 'd'));
  write_text(garbled + "/meta.json", "{ nope");

  DiskVerifyResult v = disk.verify();
  EXPECT_EQ(v.checked, 3);
  std::vector<std::string> expected = {flipped, garbled};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(paths_of(v.bad), expected);
  EXPECT_TRUE(v.refused.empty());
  // Each says why: the cubin's digest, meta.json's syntax.
  for (const auto& f : v.bad) {
    const std::string& why = f.why;
    if (f.path == flipped)
      EXPECT_NE(why.find("kernel.cubin"), std::string::npos) << why;
    else
      EXPECT_NE(why.find("meta.json"), std::string::npos) << why;
  }
  ASSERT_EQ(disk.list().size(), 1u);
  EXPECT_EQ(disk.list()[0].key, keys[0]);
  EXPECT_EQ(names_in(tmp.root() + "/v1/quarantine").size(), 2u);

  DiskVerifyResult again = disk.verify();
  EXPECT_EQ(again.checked, 1);
  EXPECT_TRUE(again.bad.empty());
}

// Twenty corrupt-and-rebuild rounds leave the newest kQuarantineKeep bad entries; their bytes
// count against the cap (evicted before any entry) and prune() empties the quarantine.
TEST(DiskCache, QuarantineIsBoundedCountsAgainstTheCapAndPruneEmptiesIt) {
  TempDir tmp;
  std::string key = key_of("again and again");
  int64_t one = 0;
  {
    DiskCache disk(tmp.root(), 0);
    for (int round = 0; round < 20; ++round) {
      ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
      one = disk.total_bytes();
      write_text(entry_path(tmp.root(), key) + "/kernel.cubin", "flipped " + std::to_string(round));
      EXPECT_FALSE(disk.load("sm_90a", key).has_value());
    }
    const std::vector<std::string> kept = names_in(tmp.root() + "/v1/quarantine");
    EXPECT_EQ(kept.size(), static_cast<size_t>(DiskCache::kQuarantineKeep));
    for (const auto& name : kept)  // the newest: rounds 12..19
      EXPECT_GE(std::stoi(read_text(tmp.root() + "/v1/quarantine/" + name + "/kernel.cubin").substr(8)), 12) << name;
    EXPECT_GT(disk.quarantine_bytes(), 0);
  }
  {
    // A cap with room for two entries and little else: publishing evicts the quarantine first.
    DiskCache capped(tmp.root(), 2 * one + one / 2);
    ASSERT_TRUE(capped.publish(make_binary("sm_90a", key_of("a"))));
    ASSERT_TRUE(capped.publish(make_binary("sm_90a", key_of("b"))));
    EXPECT_LE(capped.total_bytes() + capped.quarantine_bytes(), 2 * one + one / 2);
    EXPECT_TRUE(capped.load("sm_90a", key_of("a")).has_value());
    EXPECT_TRUE(capped.load("sm_90a", key_of("b")).has_value());
  }
  DiskCache disk(tmp.root(), 0);
  write_text(entry_path(tmp.root(), key_of("a")) + "/kernel.cubin", "flipped");
  EXPECT_FALSE(disk.load("sm_90a", key_of("a")).has_value());
  ASSERT_GT(disk.quarantine_bytes(), 0);
  EXPECT_EQ(disk.prune(int64_t{1} << 40), 0);  // nothing to evict, but the quarantine goes
  EXPECT_TRUE(names_in(tmp.root() + "/v1/quarantine").empty());
  EXPECT_TRUE(disk.load("sm_90a", key_of("b")).has_value());
}

// ---- trust ---------------------------------------------------------------------------------

TEST(DiskCache, EntryWritableByOthersIsRefusedNotDeleted) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  std::string key = key_of("o+w");
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
  std::string dir = entry_path(tmp.root(), key);

  ASSERT_EQ(::chmod(dir.c_str(), 0702), 0);  // the entry folder
  EXPECT_FALSE(disk.load("sm_90a", key).has_value());
  EXPECT_TRUE(fs::exists(dir + "/kernel.cubin"));  // left where it is
  EXPECT_TRUE(names_in(tmp.root() + "/v1/quarantine").empty());
  DiskVerifyResult v = disk.verify();
  EXPECT_EQ(paths_of(v.refused), std::vector<std::string>{dir});
  ASSERT_EQ(v.refused.size(), 1u);
  EXPECT_NE(v.refused[0].why.find("writable by group or others"), std::string::npos) << v.refused[0].why;
  EXPECT_TRUE(v.bad.empty());

  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod((dir + "/kernel.cubin").c_str(), 0620), 0);  // one file, group-writable
  EXPECT_FALSE(disk.load("sm_90a", key).has_value());
  EXPECT_TRUE(fs::exists(dir + "/kernel.cubin"));

  ASSERT_EQ(::chmod((dir + "/kernel.cubin").c_str(), 0600), 0);
  EXPECT_TRUE(disk.load("sm_90a", key).has_value());  // the refusal was the mode, nothing else

  // KernelCache builds in memory rather than trusting a refused entry, and says so once: the
  // entry stays, so every run rebuilds it until someone fixes or removes it.
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  std::string other = key_of("o+w too");
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", other)));
  ASSERT_EQ(::chmod(entry_path(tmp.root(), other).c_str(), 0777), 0);
  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  CacheOutcome outcome{}, other_outcome{};
  testing::internal::CaptureStderr();
  cache.get_or_build("sm_90a", key, [&] { return make_binary("sm_90a", key, 1000, 'x'); }, &outcome);
  cache.get_or_build("sm_90a", other, [&] { return make_binary("sm_90a", other); }, &other_outcome);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(outcome, CacheOutcome::Built);
  EXPECT_EQ(other_outcome, CacheOutcome::Built);
  EXPECT_NE(err.find("refused"), std::string::npos) << err;
  EXPECT_NE(err.find(dir), std::string::npos) << err;
  EXPECT_NE(err.find("writable by group or others"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one warning, not one per entry: " << err;
  EXPECT_TRUE(fs::exists(dir + "/kernel.cubin"));  // still refused, not moved
}

TEST(DiskCache, EntryOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown an entry to another uid";
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  std::string key = key_of("chown");
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", key)));
  std::string dir = entry_path(tmp.root(), key);

  ASSERT_EQ(::chown((dir + "/kernel.cubin").c_str(), 12345, 12345), 0);  // one file
  EXPECT_FALSE(disk.load("sm_90a", key).has_value());
  EXPECT_TRUE(fs::exists(dir + "/kernel.cubin"));

  ASSERT_EQ(::chown((dir + "/kernel.cubin").c_str(), 0, 0), 0);
  ASSERT_TRUE(disk.load("sm_90a", key).has_value());
  ASSERT_EQ(::chown(dir.c_str(), 12345, 12345), 0);  // the folder
  EXPECT_FALSE(disk.load("sm_90a", key).has_value());
  EXPECT_TRUE(fs::exists(dir + "/kernel.cubin"));
  EXPECT_TRUE(names_in(tmp.root() + "/v1/quarantine").empty());
  EXPECT_EQ(paths_of(disk.verify().refused), std::vector<std::string>{dir});
}

TEST(DiskCache, RootWritableByOthersOrNotOwnedIsUnusable) {
  TempDir tmp;
  { DiskCache create(tmp.root(), 0); }
  ASSERT_EQ(::chmod(tmp.root().c_str(), 0777), 0);
  DiskCache disk(tmp.root(), 0);
  EXPECT_FALSE(disk.usable());
  EXPECT_NE(disk.reason().find("writable by group or others"), std::string::npos) << disk.reason();
  EXPECT_FALSE(disk.publish(make_binary("sm_90a", key_of("x"))));
  EXPECT_FALSE(disk.load("sm_90a", key_of("x")).has_value());
  EXPECT_EQ(disk.lock("sm_90a", key_of("x")), nullptr);
  EXPECT_TRUE(disk.list().empty());
  EXPECT_EQ(disk.clear(), 0);

  KernelCache cache(CacheOptions{tmp.root(), 0, true});
  EXPECT_EQ(cache.disk(), nullptr);
  EXPECT_NE(cache.warning().find("memory"), std::string::npos) << cache.warning();
  CacheOutcome outcome{};
  cache.get_or_build("sm_90a", key_of("x"), [&] { return make_binary("sm_90a", key_of("x")); }, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());

  // A service folder writable by others is refused the same way.
  ASSERT_EQ(::chmod(tmp.root().c_str(), 0700), 0);
  ASSERT_EQ(::chmod((tmp.root() + "/v1/tmp").c_str(), 0733), 0);
  EXPECT_FALSE(DiskCache(tmp.root(), 0).usable());
  ASSERT_EQ(::chmod((tmp.root() + "/v1/tmp").c_str(), 0700), 0);
  EXPECT_TRUE(DiskCache(tmp.root(), 0).usable());

  if (::geteuid() == 0) {  // only root can give the root to someone else
    ASSERT_EQ(::chown(tmp.root().c_str(), 12345, 12345), 0);
    DiskCache foreign(tmp.root(), 0);
    EXPECT_FALSE(foreign.usable());
    EXPECT_NE(foreign.reason().find("owned by uid 12345"), std::string::npos) << foreign.reason();
  }
}

// ---- read-only root ------------------------------------------------------------------------

void expect_memory_fallback(const std::string& root, const std::string& reason_part) {
  SCOPED_TRACE(root);
  KernelCache cache(CacheOptions{root, 0, true});
  EXPECT_EQ(cache.disk(), nullptr);
  EXPECT_NE(cache.warning().find(root), std::string::npos) << cache.warning();
  EXPECT_NE(cache.warning().find(reason_part), std::string::npos) << cache.warning();
  EXPECT_NE(cache.warning().find("keeping binaries in memory only"), std::string::npos) << cache.warning();
  std::string key = key_of("fallback");
  int builds = 0;
  auto build = [&] {
    ++builds;
    return make_binary("sm_90a", key);
  };
  CacheOutcome outcome{};
  cache.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::Built);
  cache.get_or_build("sm_90a", key, build, &outcome);
  EXPECT_EQ(outcome, CacheOutcome::MemoryHit);
  EXPECT_EQ(builds, 1);
}

// Root ignores permission bits, so the chmod simulation below only works for other users. These
// two cases fail for everyone, root included: the root path is a regular file, or lies below one
// (mkdir gives EEXIST / ENOTDIR).
TEST(DiskCache, UnwritableRootFallsBackToMemory) {
  TempDir tmp;
  std::string file = tmp.path() + "/a-file";
  write_text(file, "not a folder");
  expect_memory_fallback(file, "not a directory");
  expect_memory_fallback(file + "/cache", "not a directory");
  EXPECT_EQ(read_text(file), "not a folder");

  // Permission bits: a read-only existing root (the cache ran there before) and a root that
  // cannot be created in a read-only parent. Skipped as root only, which ignores the bits.
  if (::geteuid() != 0) {
    { DiskCache create(tmp.root(), 0); }
    ASSERT_EQ(::chmod(tmp.root().c_str(), 0500), 0);
    ASSERT_EQ(::chmod((tmp.root() + "/v1/tmp").c_str(), 0500), 0);
    {  // a read-only root the cache ran in before still loads: publish before, then read-only
      KernelCache ro(CacheOptions{tmp.root(), 0, true});
      ASSERT_NE(ro.disk(), nullptr);
      EXPECT_TRUE(ro.disk()->read_only());
      EXPECT_NE(ro.warning().find("read-only"), std::string::npos) << ro.warning();
      EXPECT_THROW(ro.disk()->prune(0), Error);
    }
    std::string parent = tmp.path() + "/ro-parent";
    ASSERT_EQ(::mkdir(parent.c_str(), 0500), 0);
    expect_memory_fallback(parent + "/cache", "read-only");
  } else {
    std::fprintf(stderr, "note: running as root: the chmod-based read-only cases are skipped\n");
  }
}

// A really read-only filesystem (EROFS), for root too: in a child process with its own mount
// namespace, the test folder is bind-mounted read-only and a worker runs get_or_build there. A
// populated read-only cache (how a fleet ships prebuilt binaries) must load its entries; a key it
// lacks is built and kept in memory. Needs CAP_SYS_ADMIN (root on a VM; often not in a
// container), else it is skipped.
TEST(DiskCache, ReadOnlyFilesystemLoadsItsEntriesAndKeepsNewOnesInMemory) {
  TempDir tmp;
  const std::string present = key_of("erofs present"), absent = key_of("erofs absent");
  {
    DiskCache create(tmp.root(), 0);  // an existing cache, then the disk turns read-only
    std::string error;
    ASSERT_TRUE(create.publish(make_binary("sm_90a", present), &error)) << error;
  }
  auto run_read_only = [&](const std::string& key, int* status) {
    int pipefd[2];
    EXPECT_EQ(::pipe(pipefd), 0);
    // Everything the child needs is prepared before fork: the child only makes system calls.
    std::string exe = MOEJIT_CACHE_WORKER, root = tmp.root(), k = key;
    const char* dir = tmp.path().c_str();
    char* argv[] = {exe.data(), const_cast<char*>("get_or_build"), root.data(),
                    const_cast<char*>("sm_90a"), k.data(), const_cast<char*>("1000"), nullptr};
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(pipefd[1], 1);
      ::close(pipefd[0]);
      ::close(pipefd[1]);
      if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount(dir, dir, nullptr, MS_BIND, nullptr) != 0 ||
          ::mount(nullptr, dir, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
        ::_exit(77);
      ::execv(argv[0], argv);
      ::_exit(127);
    }
    ::close(pipefd[1]);
    return finish_worker(Worker{pid, pipefd[0]}, status);
  };
  int status = 0;
  std::string out = run_read_only(present, &status);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot make a read-only bind mount here (no CAP_SYS_ADMIN)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("outcome=disk\n"), std::string::npos) << out;
  EXPECT_NE(out.find("read-only"), std::string::npos) << out;
  out = run_read_only(absent, &status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("outcome=built\n"), std::string::npos) << out;
  EXPECT_NE(out.find("keeping new binaries in memory only"), std::string::npos) << out;
  // Nothing was written: the absent key is still absent, the present one intact.
  DiskCache after(tmp.root(), 0);
  EXPECT_TRUE(after.load("sm_90a", present).has_value());
  EXPECT_FALSE(after.load("sm_90a", absent).has_value());
}

// ---- size cap ------------------------------------------------------------------------------

TEST(DiskCache, PruneEvictsLeastRecentlyUsedFirst) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  std::string a = key_of("a"), b = key_of("b"), c = key_of("c");
  for (const auto& k : {a, b, c}) ASSERT_TRUE(disk.publish(make_binary("sm_90a", k)));
  ASSERT_TRUE(disk.load("sm_90a", a).has_value());  // a is now the most recently used
  auto bytes_of = [&](const std::string& k) {
    for (const auto& e : disk.list())
      if (e.key == k) return e.bytes;
    return int64_t{-1};
  };
  int64_t keep_two = bytes_of(a) + bytes_of(c);
  EXPECT_EQ(disk.prune(keep_two), 1);
  EXPECT_FALSE(disk.load("sm_90a", b).has_value());
  EXPECT_TRUE(disk.load("sm_90a", c).has_value());  // c is now newer than a
  EXPECT_EQ(disk.prune(disk.total_bytes() - 1), 1);
  EXPECT_FALSE(disk.load("sm_90a", a).has_value());
  EXPECT_TRUE(disk.load("sm_90a", c).has_value());
  EXPECT_EQ(disk.prune(disk.total_bytes()), 0);  // already small enough
  EXPECT_EQ(disk.prune(0), 1);
  EXPECT_TRUE(disk.list().empty());
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());  // evicted folders are gone, not parked
}

TEST(DiskCache, PublishEvictsDownToMaxBytes) {
  TempDir tmp;
  int64_t one;
  {
    DiskCache probe(tmp.root(), 0);
    ASSERT_TRUE(probe.publish(make_binary("sm_90a", key_of("probe"))));
    one = probe.total_bytes();
    ASSERT_EQ(probe.clear(), 1);
  }
  DiskCache disk(tmp.root(), 2 * one + one / 2);  // room for two entries
  std::string a = key_of("a"), b = key_of("b"), c = key_of("c"), d = key_of("d");
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", a)));
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", b)));
  ASSERT_TRUE(disk.load("sm_90a", a).has_value());  // b is now the least recently used
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", c)));
  EXPECT_LE(disk.total_bytes(), 2 * one + one / 2);
  EXPECT_TRUE(disk.load("sm_90a", a).has_value());
  EXPECT_FALSE(disk.load("sm_90a", b).has_value());
  EXPECT_TRUE(disk.load("sm_90a", c).has_value());

  // An entry larger than the whole cap evicts everything else but stays itself.
  DiskCache tiny(tmp.root(), 10);
  ASSERT_TRUE(tiny.publish(make_binary("sm_90a", d)));
  auto entries = tiny.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, d);
}

TEST(DiskCache, ClearRemovesEverything) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  for (const char* name : {"1", "2", "3"}) ASSERT_TRUE(disk.publish(make_binary("sm_90a", key_of(name))));
  ASSERT_TRUE(disk.publish(make_binary("sm_80", key_of("4"))));
  { auto held = disk.lock("sm_90a", key_of("1")); }
  EXPECT_EQ(disk.list().size(), 4u);
  EXPECT_EQ(disk.clear(), 4);
  EXPECT_TRUE(disk.list().empty());
  EXPECT_EQ(disk.total_bytes(), 0);
  EXPECT_FALSE(disk.load("sm_90a", key_of("1")).has_value());
  EXPECT_TRUE(names_in(tmp.root() + "/v1/locks").empty());
  EXPECT_TRUE(names_in(tmp.root() + "/v1/tmp").empty());
  EXPECT_EQ(disk.clear(), 0);
  ASSERT_TRUE(disk.publish(make_binary("sm_90a", key_of("1"))));
  EXPECT_TRUE(disk.load("sm_90a", key_of("1")).has_value());
}

// ---- lock ----------------------------------------------------------------------------------

TEST(DiskCache, LockExcludesAnotherHolderUntilReleased) {
  TempDir tmp;
  DiskCache disk(tmp.root(), 0);
  std::string key = key_of("locked");
  auto held = disk.lock("sm_90a", key);
  ASSERT_NE(held, nullptr);
  std::atomic<bool> second_got_it{false};
  std::thread other([&] {
    DiskCache again(tmp.root(), 0);  // its own open file description, like another process
    auto mine = again.lock("sm_90a", key);
    second_got_it = mine != nullptr;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(second_got_it.load());
  held.reset();
  other.join();
  EXPECT_TRUE(second_got_it.load());
}

}  // namespace
}  // namespace moejit
