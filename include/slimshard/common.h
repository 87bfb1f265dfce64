// common.h — errors with exit codes, byte-size parsing and formatting, atomic file writes, the median.
// Every other module reports bad input as UsageError (exit 2) and failures at run time as RuntimeError (exit
// 1).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace slimshard {

// Bad usage or bad input (flags, configs, plans, data files, checkpoints): exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure while running (out of memory budget, watchdog, I/O error on output): exit code 1.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "512MiB", "1.5GiB", "4096", "64KiB", "2GB" -> bytes. Throws UsageError naming `what`.
int64_t parse_bytes(const std::string& text, const std::string& what);
// 1536 -> "1.5 KiB"
std::string format_bytes(double bytes);
// MiB with one decimal, for tables.
std::string format_mib(double bytes);
// Text made safe inside SVG/XML: <, > and & escaped.
std::string xml_escape(const std::string& s);

// Writes `data` to `path` through a temporary file in the same directory, fsync, rename:
// a reader sees the old file or the new one, never half of one. Throws RuntimeError.
void write_file_atomic(const std::string& path, const std::string& data);
// Reads a whole file; throws UsageError naming the file if it cannot be read.
std::string read_file(const std::string& path, const std::string& what);

// The median of `v` (the upper one of an even count; 0 for none): how every timing here is summarised.
double median(std::vector<double> v);

}  // namespace slimshard
