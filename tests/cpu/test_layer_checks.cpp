// runtime/layer_checks.h: the refusals every layer call makes before a launch, here the device
// check with faked device indices (one GPU cannot show a second device's context; the GPU tier
// shows the same device's contexts are accepted).
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "runtime/layer_checks.h"

namespace moejit {
namespace {

TEST(LayerChecks, ACallOnAnotherDevicesStreamIsRefusedNamingBoth) {
  EXPECT_NO_THROW(check_call_device(0, 0));
  EXPECT_NO_THROW(check_call_device(3, 3));
  try {
    check_call_device(0, 1);
    FAIL() << "device 1's stream was accepted by a layer of device 0";
  } catch (const InvalidInput& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("stream: its context is on device 1"), std::string::npos) << message;
    EXPECT_NE(message.find("created for device 0"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace moejit
