// validators.cpp — numbers on the command line read exactly: an integer flag takes digits only (no fraction,
// no exponent, no wrap past its range), a real flag a finite number; both within the flag's range. CLI11's
// own number checks let NaN through and print ranges as 309-digit numbers.
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "commands.h"
#include "slimshard/json.h"

namespace slimshard::cli {

CLI::Validator integer(int64_t lo, int64_t hi) {
  const std::string want = integer_range(lo, hi);
  return CLI::Validator(
      [lo, hi, want](std::string& s) -> std::string {
        int64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || ec != std::errc() || p != end || v < lo || v > hi)
          return "must be " + want + ", not '" + s + "'";
        return "";
      },
      want, "integer");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || ec != std::errc() || p != end)
          return "must be an integer from 0 to 18446744073709551615, not '" + s + "'";
        return "";
      },
      "an integer >= 0", "seed");
}

CLI::Validator real(double lo, double hi, bool open_lo, bool open_hi) {
  const std::string want = number_range(lo, hi, open_lo, open_hi);
  return CLI::Validator(
      [lo, hi, open_lo, open_hi, want](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v < lo || v > hi ||
            (open_lo && v <= lo) || (open_hi && v >= hi))
          return "must be " + want + ", not '" + s + "'";
        return "";
      },
      want, "number");
}

}  // namespace slimshard::cli
