// common.h — errors with exit codes, byte-size parsing and formatting, atomic file writes, the median.
// Every other module reports bad input as UsageError (exit 2) and failures at run time as RuntimeError (exit
// 1).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace slimshard {

// Bad usage or bad input (flags, configs, plans, data files, checkpoints): exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A usage error every rank of a job found or was told of (comm.h: agree_on_error): each exits 2 on its own,
// rank 0 saying why once, instead of one rank ending the job for all.
struct AgreedUsageError : UsageError {
  using UsageError::UsageError;
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
// Reads a whole file; throws UsageError naming the file if it cannot be read or is not a regular file (a
// directory, a FIFO that would block, a device that never ends).
std::string read_file(const std::string& path, const std::string& what);
// The same check alone, for readers that open the file themselves: "WHAT PATH: no such file", "...: is a
// directory", "...: not a regular file".
void require_regular_file(const std::string& path, const std::string& what);
// An output the run will write later, checked now (before any training): `path` is not a directory and a file
// can be created beside it. Throws UsageError naming `what` and the path.
void check_output_file(const std::string& path, const std::string& what);
// The same for a directory the run will write into: created if missing, and writable.
void check_output_dir(const std::string& dir, const std::string& what);

// CRC-32 (zlib's) of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32_of(const void* data, size_t n, uint32_t crc = 0);

// The median of `v` (the upper one of an even count; 0 for none): how every timing here is summarised.
double median(std::vector<double> v);

}  // namespace slimshard
