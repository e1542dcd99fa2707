// The C ABI without a GPU: bad input is code 2 with a message naming the field; a valid config
// on a machine with no driver is code 1 saying so; null arguments never crash.
#include <gtest/gtest.h>

#include <string>

#include "runtime/cuda_driver.h"
#include "runtime/moejit.h"

namespace {

TEST(CApi, InvalidConfigIsCodeTwoNamingTheField) {
  moejit_layer* layer = reinterpret_cast<moejit_layer*>(0x1);
  EXPECT_EQ(moejit_layer_create("deepseek-v3", R"({"num_expert_group": 7})", &layer), 2);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("num_expert_group: 7"), std::string::npos) << moejit_last_error();
  EXPECT_EQ(moejit_layer_create("{\"experts\": 0}", nullptr, &layer), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("experts: 0"), std::string::npos) << moejit_last_error();
  EXPECT_EQ(moejit_layer_create("deepseek-v3", "[1, 2]", &layer), 2);
  EXPECT_EQ(moejit_layer_create("deepseek-v3", "{not json", &layer), 2);
  EXPECT_EQ(moejit_layer_create("/nonexistent/model", nullptr, &layer), 2);
}

TEST(CApi, NullArgumentsAreRefused) {
  EXPECT_EQ(moejit_layer_create(nullptr, nullptr, nullptr), 2);
  size_t bytes = 0;
  EXPECT_EQ(moejit_layer_workspace_bytes(nullptr, 16, &bytes), 2);
  EXPECT_EQ(moejit_layer_forward(nullptr, nullptr, 1, nullptr, nullptr, nullptr, 0), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("layer: null"), std::string::npos);
  moejit_layer_destroy(nullptr);
}

TEST(CApi, ValidConfigWithoutAGpuSaysWhy) {
  if (moejit::cuda_driver().available) GTEST_SKIP() << "a CUDA driver is present; the GPU tier covers creation";
  moejit_layer* layer = nullptr;
  EXPECT_EQ(moejit_layer_create("mixtral-8x7b", nullptr, &layer), 1);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("CUDA driver"), std::string::npos) << moejit_last_error();
}

}  // namespace
