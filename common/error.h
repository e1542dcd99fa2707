// Error types shared by every stage of the pipeline.
#pragma once

#include <stdexcept>
#include <string>

namespace moejit {

// Any failure moejit reports. The message is meant for the user: it says what to change.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller gave a value moejit cannot accept (a config field, a CLI flag, a file).
// The CLI maps it to exit code 2; the message names the field, the value and the rule.
class InvalidInput : public Error {
 public:
  using Error::Error;
};

}  // namespace moejit
