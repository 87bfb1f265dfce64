// json.h — JSON that comes from a user (plans, profiles, cluster specs, checkpoint indexes, metrics): one
// parse whose failure is the usage error naming what was read (exit 2), never nlohmann's exception.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace slimshard {

// `what` names the source in the message, e.g. "--plan p.json": "--plan p.json: not valid JSON (...)".
nlohmann::json parse_json(const std::string& text, const std::string& what);
// The same, keeping the order of object keys (plan entries apply in file order).
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what);

}  // namespace slimshard
