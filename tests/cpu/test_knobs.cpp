// The knob descriptors (common/knobs.h): the README's table, `moejit info`, the cache-key fields
// and the parsing all come from them. The README test fails with the table to paste when they drift.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/knobs.h"

#ifndef MOEJIT_SOURCE_ROOT
#error "tests/CMakeLists.txt defines MOEJIT_SOURCE_ROOT (the repository root, for README.md)"
#endif

namespace moejit {
namespace {

constexpr const char* kSection = "## Environment knobs";

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "| a | b | c |" -> {"a", "b", "c"}.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string t = trim(line);
  if (t.size() < 2 || t.front() != '|' || t.back() != '|') return out;
  std::stringstream in(t.substr(1, t.size() - 2));
  std::string cell;
  while (std::getline(in, cell, '|')) out.push_back(trim(cell));
  return out;
}

// The table lines (header, separator, rows) of the README's knob section.
std::vector<std::string> readme_knob_table() {
  std::ifstream in(std::string(MOEJIT_SOURCE_ROOT) + "/README.md");
  EXPECT_TRUE(in) << "cannot read " << MOEJIT_SOURCE_ROOT << "/README.md";
  std::vector<std::string> table;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (!in_section) {
      in_section = line.rfind(kSection, 0) == 0;
      continue;
    }
    if (line.rfind("## ", 0) == 0) break;
    if (!line.empty() && line.front() == '|') {
      table.push_back(line);
    } else if (!table.empty()) {
      break;  // the first table of the section ends
    }
  }
  EXPECT_TRUE(in_section) << "README.md has no \"" << kSection << "\" section";
  return table;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

TEST(Knobs, DescriptorsAreWellFormed) {
  std::set<std::string_view> seen;
  for (const KnobDescriptor& d : knob_descriptors()) {
    SCOPED_TRACE(std::string(d.variable));
    EXPECT_EQ(d.variable.rfind("MOEJIT_", 0), 0u);
    EXPECT_TRUE(seen.insert(d.variable).second) << "listed twice";
    EXPECT_FALSE(d.default_text.empty());
    EXPECT_FALSE(d.meaning.empty());
    EXPECT_NE(d.read, nullptr);
    EXPECT_NE(d.show, nullptr);
    // A '|' or a line break would split the README's table row.
    for (std::string_view text : {d.default_text, d.meaning}) {
      EXPECT_EQ(text.find('|'), std::string_view::npos) << text;
      EXPECT_EQ(text.find('\n'), std::string_view::npos) << text;
    }
  }
}

// Same variables in the same order, same default and meaning, as the descriptors.
TEST(Knobs, ReadmeTableMatchesTheDescriptors) {
  std::vector<std::string> table = readme_knob_table();
  const std::string hint = "README.md's knob table must be (knob_markdown_table()):\n" + knob_markdown_table();
  ASSERT_GE(table.size(), 2u) << hint;
  EXPECT_EQ(cells(table[0]), (std::vector<std::string>{"variable", "default", "meaning"})) << hint;
  EXPECT_EQ(cells(table[1]), (std::vector<std::string>{"---", "---", "---"})) << hint;
  auto descriptors = knob_descriptors();
  ASSERT_EQ(table.size() - 2, descriptors.size()) << hint;
  for (size_t i = 0; i < descriptors.size(); ++i) {
    const KnobDescriptor& d = descriptors[i];
    SCOPED_TRACE(table[i + 2]);
    std::vector<std::string> row = cells(table[i + 2]);
    ASSERT_EQ(row.size(), 3u) << hint;
    EXPECT_EQ(row[0], "`" + std::string(d.variable) + "`") << hint;
    EXPECT_EQ(row[1], d.default_text) << hint;
    EXPECT_EQ(row[2], d.meaning) << hint;
  }
  // Byte for byte too, so spacing stays as knob_markdown_table() prints it.
  EXPECT_EQ(joined(table), knob_markdown_table());
}

TEST(Knobs, CodeAffectingListsExactlyTheMarkedDescriptors) {
  for (bool lineinfo : {false, true}) {
    Knobs k;
    k.lineinfo = lineinfo;
    std::vector<std::pair<std::string, std::string>> expected;
    for (const KnobDescriptor& d : knob_descriptors())
      if (d.code_affecting) expected.emplace_back(d.variable, d.show(k));
    EXPECT_EQ(k.code_affecting(), expected);
    // What cache keys hold today: changing this changes every key.
    EXPECT_EQ(k.code_affecting(),
              (std::vector<std::pair<std::string, std::string>>{{"MOEJIT_LINEINFO", lineinfo ? "1" : "0"}}));
  }
}

TEST(Knobs, InfoTableHasOneRowPerDescriptor) {
  Knobs k;
  k.cache_dir = "/some/root";
  auto rows = k.table();
  auto descriptors = knob_descriptors();
  ASSERT_EQ(rows.size(), descriptors.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 3u);
    EXPECT_EQ(rows[i][0], descriptors[i].variable);
    EXPECT_EQ(rows[i][1], descriptors[i].show(k));
    EXPECT_EQ(rows[i][2], descriptors[i].meaning);
  }
  EXPECT_EQ(rows[0][1], "/some/root");
}

// Sets variables for one test and puts every one it touched back as it was.
class Environment {
 public:
  Environment() {
    for (const KnobDescriptor& d : knob_descriptors()) save(std::string(d.variable));
    for (const char* other : {"XDG_CACHE_HOME", "HOME", "CUDA_HOME", "TMPDIR"}) save(other);
    for (const auto& [name, value] : saved_) ::unsetenv(name.c_str());
  }
  ~Environment() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }

 private:
  void save(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(Knobs, DefaultsWhenNothingIsSet) {
  Environment env;
  env.set("HOME", "/home/someone");
  Knobs k = Knobs::from_environment();
  EXPECT_EQ(k.cache_dir, "/home/someone/.cache/moejit");
  EXPECT_EQ(k.cache_max_bytes, int64_t{4} << 30);
  EXPECT_TRUE(k.disk_cache);
  // cuda_home: the toolkit the build used, a real one: its CUB headers are there (NVRTC needs them).
  EXPECT_FALSE(k.cuda_home.empty());
  EXPECT_TRUE(std::filesystem::exists(k.cuda_home + "/include/cccl/cub") ||
              std::filesystem::exists(k.cuda_home + "/include/cub"))
      << k.cuda_home;
  EXPECT_GE(k.compile_threads, 1);
  EXPECT_EQ(k.log_level, "off");
  EXPECT_FALSE(k.nvrtc_pch);
  EXPECT_FALSE(k.lineinfo);
  EXPECT_EQ(k.repro_dir, "/tmp");
  EXPECT_EQ(k.tiles, "");
  EXPECT_TRUE(k.programmatic_launch);
  EXPECT_EQ(k.backend, "auto");
  env.set("XDG_CACHE_HOME", "/xdg");
  env.set("CUDA_HOME", "/opt/cuda");
  env.set("TMPDIR", "/scratch");
  k = Knobs::from_environment();
  EXPECT_EQ(k.cache_dir, "/xdg/moejit");
  EXPECT_EQ(k.cuda_home, "/opt/cuda");
  EXPECT_EQ(k.repro_dir, "/scratch");
}

TEST(Knobs, EveryVariableReachesItsField) {
  Environment env;
  env.set("MOEJIT_CACHE_DIR", "/c");
  env.set("MOEJIT_CACHE_MAX_BYTES", "0");
  env.set("MOEJIT_DISK_CACHE", "0");
  env.set("MOEJIT_CUDA_HOME", "/cuda");
  env.set("CUDA_HOME", "/not-this-one");
  env.set("MOEJIT_COMPILE_THREADS", "3");
  env.set("MOEJIT_LOG", "debug");
  env.set("MOEJIT_NVRTC_PCH", "1");
  env.set("MOEJIT_LINEINFO", "1");
  env.set("MOEJIT_REPRO_DIR", "/r");
  env.set("MOEJIT_TILES", "decode.gemm2=simt:16x64x32");
  env.set("MOEJIT_PDL", "0");
  env.set("MOEJIT_BACKEND", "jit");
  Knobs k = Knobs::from_environment();
  EXPECT_EQ(k.cache_dir, "/c");
  EXPECT_EQ(k.cache_max_bytes, 0);
  EXPECT_FALSE(k.disk_cache);
  EXPECT_EQ(k.cuda_home, "/cuda");
  EXPECT_EQ(k.compile_threads, 3);
  EXPECT_EQ(k.log_level, "debug");
  EXPECT_TRUE(k.nvrtc_pch);
  EXPECT_TRUE(k.lineinfo);
  EXPECT_EQ(k.repro_dir, "/r");
  EXPECT_EQ(k.tiles, "decode.gemm2=simt:16x64x32");
  EXPECT_FALSE(k.programmatic_launch);
  EXPECT_EQ(k.backend, "jit");
  EXPECT_EQ(k.code_affecting(), (std::vector<std::pair<std::string, std::string>>{{"MOEJIT_LINEINFO", "1"}}));
}

// The messages as they are today: the refactoring into descriptors changed none of them.
TEST(Knobs, BadValuesNameTheVariable) {
  struct Case {
    const char* variable;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"MOEJIT_DISK_CACHE", "maybe", "MOEJIT_DISK_CACHE: 'maybe' is not allowed; allowed values: 0, 1"},
      {"MOEJIT_CACHE_MAX_BYTES", "-1",
       "MOEJIT_CACHE_MAX_BYTES: '-1' is not allowed; expected an integer from 0 to 9223372036854775807"},
      // Read strictly: no saturation of a too-large value, no surrounding space.
      {"MOEJIT_CACHE_MAX_BYTES", "99999999999999999999",
       "MOEJIT_CACHE_MAX_BYTES: '99999999999999999999' is not allowed; expected an integer from 0 to "
       "9223372036854775807"},
      {"MOEJIT_CACHE_MAX_BYTES", " 5", "MOEJIT_CACHE_MAX_BYTES: ' 5' is not allowed; expected an integer from 0 to 9223372036854775807"},
      {"MOEJIT_CACHE_MAX_BYTES", "5 ", "MOEJIT_CACHE_MAX_BYTES: '5 ' is not allowed; expected an integer from 0 to 9223372036854775807"},
      {"MOEJIT_COMPILE_THREADS", "2x",
       "MOEJIT_COMPILE_THREADS: '2x' is not allowed; expected an integer from 1 to 9223372036854775807"},
      {"MOEJIT_LOG", "verbose", "MOEJIT_LOG: 'verbose' is not allowed; allowed values: off, info, debug"},
      {"MOEJIT_BACKEND", "cuda", "MOEJIT_BACKEND: 'cuda' is not allowed; allowed values: auto, jit, ixformer"},
  };
  for (const Case& c : cases) {
    Environment env;
    env.set(c.variable, c.value);
    try {
      Knobs::from_environment();
      ADD_FAILURE() << c.variable << "=" << c.value << " was accepted";
    } catch (const InvalidInput& e) {
      EXPECT_STREQ(e.what(), c.message);
    }
  }
}

}  // namespace
}  // namespace moejit
