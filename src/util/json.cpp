// json.cpp — user JSON parsed with its errors turned into usage errors, and ranges as messages say them
// (see json.h).
#include "slimshard/json.h"

#include <cstdio>

namespace slimshard {
namespace {

template <class Json>
Json parse_as(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + ": not valid JSON (" + e.what() + ")");
  }
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  return parse_as<nlohmann::json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what) {
  return parse_as<nlohmann::ordered_json>(text, what);
}

std::string integer_range(int64_t lo, int64_t hi) {
  if (hi == INT64_MAX) return lo == 1 ? "a positive integer" : "an integer >= " + std::to_string(lo);
  return "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
}

std::string number_range(double lo, double hi, bool open_lo, bool open_hi) {
  if (hi >= 1e300) {
    if (open_lo && lo == 0) return "a positive number";
    return std::string("a number ") + (open_lo ? "> " : ">= ") + num(lo);
  }
  return std::string("a number in ") + (open_lo ? "(" : "[") + num(lo) + ", " + num(hi) +
         (open_hi ? ")" : "]");
}

}  // namespace slimshard
