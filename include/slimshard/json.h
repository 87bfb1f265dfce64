// json.h — JSON that comes from a user (plans, profiles, cluster specs, checkpoint indexes, model configs,
// metrics): one parse whose failure is the usage error naming what was read (exit 2), never nlohmann's
// exception; and numbers read exactly — an integer field must be an integer (no fraction, no exponent, no
// wrap) within its range, a real field finite within its range — or a usage error naming the field.
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "slimshard/common.h"

namespace slimshard {

// `what` names the source in the message, e.g. "--plan p.json": "--plan p.json: not valid JSON (...)".
nlohmann::json parse_json(const std::string& text, const std::string& what);
// The same, keeping the order of object keys (plan entries apply in file order).
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what);

// "an integer from 1 to 64", "a positive integer", "an integer >= 0": the range as a user reads it.
std::string integer_range(int64_t lo, int64_t hi);
std::string number_range(double lo, double hi, bool open_lo, bool open_hi = false);

// `v` as an integer in [lo, hi]; `what` names the field ("--plan p.json: world").
template <class Json>
int64_t json_integer(const Json& v, const std::string& what, int64_t lo, int64_t hi) {
  bool ok = v.is_number_integer();
  int64_t x = 0;
  if (ok && v.is_number_unsigned()) {
    const auto u = v.template get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT64_MAX);
    x = static_cast<int64_t>(u);
  } else if (ok) {
    x = v.template get<int64_t>();
  }
  if (!ok || x < lo || x > hi)
    throw UsageError(what + ": must be " + integer_range(lo, hi) + ", not " + v.dump());
  return x;
}

// `v` as a finite number in [lo, hi] ((lo, hi] with `open_lo`).
template <class Json>
double json_number(const Json& v, const std::string& what, double lo, double hi, bool open_lo = false) {
  const double x = v.is_number() ? v.template get<double>() : NAN;
  if (!std::isfinite(x) || x < lo || x > hi || (open_lo && x <= lo))
    throw UsageError(what + ": must be " + number_range(lo, hi, open_lo) + ", not " + v.dump());
  return x;
}

}  // namespace slimshard
