// Hostile JSON documents (config files, JSON texts through the APIs) are InvalidInput naming the
// document, never a crash, a hang or gigabytes of memory: deep nesting (200,000 arrays once
// overflowed the stack when an error message printed the value), numbers beyond a double, too
// many values, too many bytes, and files that are not regular files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "temp_dir.h"

#include "common/bounded_json.h"
#include "common/error.h"
#include "compiler/hf_config.h"

namespace moejit {
namespace {

using testing_support::TempDir;

// The InvalidInput message of load_config_file(path), or "" when it loaded.
std::string refusal(const std::string& path) {
  try {
    load_config_file(path);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

TEST(BoundedJson, DeepNestingIsRefusedWhereverItIs) {
  TempDir dir;
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& doc : {deep, "{\"experts\": " + deep + "}",
                                 "{\"model_type\": \"mixtral\", \"num_local_experts\": " + deep + "}"}) {
    const std::string message = refusal(dir.write("config.json", doc));
    EXPECT_NE(message.find("config.json: the JSON nests deeper than 64 levels"), std::string::npos) << message;
  }
  // 64 levels still parse.
  const std::string ok = std::string(63, '[') + std::string(63, ']');
  EXPECT_NO_THROW(parse_bounded_json("{\"a\": " + ok + "}", "test"));
}

TEST(BoundedJson, NumbersBeyondADoubleNameTheirKeyAndTheNumber) {
  TempDir dir;
  const std::string message = refusal(dir.write("config.json", "{\"topk\": 2, \"experts\": 1e400}"));
  EXPECT_NE(message.find("config.json: key 'experts': a number does not fit a double ('1e400')"), std::string::npos)
      << message;
  try {  // no key to name: the number alone
    parse_bounded_json("[1, -1e400]", "doc");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("doc: a number does not fit a double ('-1e400')"), std::string::npos)
        << e.what();
  }
}

TEST(BoundedJson, SizeAndValueCountAreBounded) {
  std::string many = "[0";
  for (int64_t i = 0; i < kMaxJsonValues; ++i) many += ",0";
  many += "]";
  try {
    parse_bounded_json(many, "doc");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("doc: the JSON holds more than 1048576 values"), std::string::npos) << e.what();
  }
  TempDir dir;
  const std::string big = "{\"experts\": 8, \"pad\": \"" + std::string(kMaxJsonBytes, 'x') + "\"}";
  const std::string message = refusal(dir.write("config.json", big));
  EXPECT_NE(message.find("a config file of at most 16777216 bytes is read"), std::string::npos) << message;
}

TEST(BoundedJson, OnlyRegularFilesAreRead) {
  TempDir dir;
  const std::string fifo = dir.path() + "/config.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string message = refusal(fifo);  // opening a FIFO without a writer would block forever
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
  EXPECT_NE(refusal(dir.path() + "/missing.json").find("cannot open the config file"), std::string::npos);
}

TEST(BoundedJson, InvalidJsonMessagesAreShort) {
  try {
    parse_bounded_json("{\"experts\": " + std::string(100000, 'x') + "}", "doc");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_LE(std::string(e.what()).size(), 300u) << e.what();
    EXPECT_NE(std::string(e.what()).find("doc: not valid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moejit
