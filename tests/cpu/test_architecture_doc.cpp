// docs/ARCHITECTURE.md is a newcomer's map of the tree, so it must stay true: every path it names
// exists, every source folder of the tree has a row in its ownership table, the README's layout
// section points to it, and no source file outside templates/ and tests/ grows past 500 lines (the
// rule that keeps one job per file).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#ifndef MOEJIT_SOURCE_ROOT
#error "tests/CMakeLists.txt defines MOEJIT_SOURCE_ROOT (the repository root)"
#endif

namespace moejit {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = MOEJIT_SOURCE_ROOT;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Backticked words that look like repository paths: "compiler/heuristics/sm90.cpp", "cache/".
std::set<std::string> named_paths(const std::string& text) {
  std::set<std::string> out;
  const std::regex backticked("`([A-Za-z0-9_./-]+)`");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), backticked); it != std::sregex_iterator(); ++it) {
    const std::string word = (*it)[1];
    if (word.find('/') == std::string::npos || word.starts_with("../") || word.starts_with("/")) continue;
    out.insert(word);
  }
  return out;
}

// A path from the root, or a sub-folder named in its parent's context ("tests/ (`cpu/` ...)").
bool exists_in_tree(const std::string& p) {
  if (fs::exists(kRoot / p)) return true;
  if (p.back() != '/' || p.find('/') != p.size() - 1) return false;
  for (const char* parent : {"tests", "compiler", "backends", "bench", "python"})
    if (fs::is_directory(kRoot / parent / p)) return true;
  return false;
}

TEST(ArchitectureDoc, EveryPathItNamesExists) {
  const std::string doc = read(kRoot / "docs" / "ARCHITECTURE.md");
  ASSERT_FALSE(doc.empty()) << "docs/ARCHITECTURE.md is missing";
  const std::set<std::string> paths = named_paths(doc);
  EXPECT_GT(paths.size(), 20u);
  for (const std::string& p : paths) EXPECT_TRUE(exists_in_tree(p)) << "docs/ARCHITECTURE.md names " << p;
}

TEST(ArchitectureDoc, EverySourceFolderHasARow) {
  const std::string doc = read(kRoot / "docs" / "ARCHITECTURE.md");
  std::set<std::string> rows;
  std::istringstream lines(doc);
  const std::regex row("^\\| `([A-Za-z0-9_./-]+)/` \\|");
  std::smatch m;
  for (std::string line; std::getline(lines, line);)
    if (std::regex_search(line, m, row)) rows.insert(m[1]);
  for (const char* folder : {"common", "compiler", "compiler/families", "compiler/heuristics", "templates", "cache",
                             "checkpoint", "runtime", "backends/torch", "backends/ixformer", "python/moejit", "cli", "tests",
                             "bench", "scripts"}) {
    ASSERT_TRUE(fs::is_directory(kRoot / folder)) << folder;
    EXPECT_EQ(rows.count(folder), 1u) << "docs/ARCHITECTURE.md has no row for " << folder << "/";
  }
  // And no row for a folder that is gone.
  for (const std::string& r : rows) EXPECT_TRUE(fs::is_directory(kRoot / r)) << r;
}

TEST(ArchitectureDoc, ReadmeLayoutPointsToIt) {
  const std::string readme = read(kRoot / "README.md");
  const size_t layout = readme.find("## Layout");
  ASSERT_NE(layout, std::string::npos);
  EXPECT_NE(readme.find("docs/ARCHITECTURE.md", layout), std::string::npos);
  for (const std::string& p : named_paths(readme.substr(layout)))
    EXPECT_TRUE(exists_in_tree(p)) << "README's layout names " << p;
}

TEST(ArchitectureDoc, NoSourceFileOutsideTemplatesAndTestsPassesFiveHundredLines) {
  for (const char* folder : {"common", "compiler", "cache", "checkpoint", "runtime", "backends", "cli", "python/moejit",
                             "bench", "scripts", "examples", "cmake"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / folder)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".py" && ext != ".sh" && ext != ".c" && ext != ".cmake") continue;
      std::ifstream in(entry.path());
      int lines = 0;
      for (std::string line; std::getline(in, line);) ++lines;
      EXPECT_LE(lines, 500) << fs::relative(entry.path(), kRoot).string() << ": split it (one job per file)";
    }
  }
}

}  // namespace
}  // namespace moejit
