// json.cpp — user JSON parsed with its errors turned into usage errors (see json.h).
#include "slimshard/json.h"

#include "slimshard/common.h"

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

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  return parse_as<nlohmann::json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what) {
  return parse_as<nlohmann::ordered_json>(text, what);
}

}  // namespace slimshard
