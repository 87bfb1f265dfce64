// common.cpp — size parsing/formatting and atomic file writes (see common.h).
#include "slimshard/common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace slimshard {

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw UsageError(what + ": '" + text + "' is not a size (examples: 512MiB, 2GiB, 4096)");
  }
  std::string unit = text.substr(pos);
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  if (mult == 0)
    throw UsageError(what + ": unknown unit '" + unit + "' in '" + text + "' (use KiB, MiB or GiB)");
  if (!(value > 0) || !std::isfinite(value) || value * mult > 9e18)
    throw UsageError(what + ": '" + text + "' must be a positive size");
  return static_cast<int64_t>(value * mult);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string format_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / (1024.0 * 1024.0));
  return buf;
}

void write_file_atomic(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw RuntimeError("cannot write " + path + ": " + std::strerror(errno));
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw RuntimeError("cannot write " + path + ": " + std::strerror(err));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path + ": " + std::strerror(err));
  }
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(what + " " + path + ": " + (errno == ENOENT ? "no such file" : std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw UsageError(what + " " + path + ": is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw UsageError(what + " " + path + ": not a regular file");
}

std::string read_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UsageError(what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw UsageError(what + " " + path + ": read error (" + std::strerror(err) + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

namespace {
// Creates and removes a file in `dir`: the way to know it can be written (permissions, read-only or full
// file systems, /proc).
void probe_write(const std::string& dir, const std::string& what, const std::string& path) {
  const std::string probe =
      (dir.empty() ? std::string(".") : dir) + "/.slimshard-probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw UsageError(what + " " + path + ": cannot write there (" + std::strerror(errno) + ")");
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) throw UsageError(what + " " + path + ": cannot write there (" + std::strerror(err) + ")");
}
}  // namespace

void check_output_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw UsageError(what + " " + path + ": is a directory");
    if (::access(path.c_str(), W_OK) != 0)
      throw UsageError(what + " " + path + ": cannot write (" + std::strerror(errno) + ")");
    if (!S_ISREG(st.st_mode)) return;  // a device or a pipe the user chose: written as it is
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError(what + " " + path + ": directory " + dir + " does not exist");
  probe_write(dir, what, path);
}

void check_output_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError(what + " " + dir + ": cannot create the directory" +
                     (ec ? " (" + ec.message() + ")" : ""));
  probe_write(dir, what, dir);
}

uint32_t crc32_of(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  for (size_t off = 0; off < n; off += 1u << 30) {  // zlib takes 32-bit lengths
    const auto len = static_cast<uInt>(std::min<size_t>(n - off, 1u << 30));
    c = crc32(c, p + off, len);
  }
  return static_cast<uint32_t>(c);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}

}  // namespace slimshard
