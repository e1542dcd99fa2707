// Error types shared by every stage of the pipeline.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

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

// A value as an error message shows it: control characters and bytes past ASCII escaped (\n,
// \xNN), so the message stays one line; past 40 characters cut, with the value's length noted, so
// a hostile value is never echoed whole.
std::string shown(std::string_view value);

// The CLI's last guard on what it prints for a refusal: newlines flattened, at most `max_chars`.
std::string one_line_message(std::string_view message, size_t max_chars);

}  // namespace moejit
