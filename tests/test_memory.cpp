// test_memory.cpp — the tracking allocator counts exactly, tracks peaks per phase, and enforces the limit
// with an error that names the rank, op, bytes asked, live bytes and limit.
#include <gtest/gtest.h>

#include "slimshard/common.h"
#include "slimshard/memory.h"

using namespace slimshard;

TEST(Memory, CountsKnownAllocationExactly) {
  ASSERT_TRUE(memory::installed());
  const int64_t live0 = memory::live_bytes();
  const int64_t count0 = memory::allocation_count();
  {
    at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(memory::live_bytes() - live0, 4000);
    EXPECT_EQ(memory::allocation_count() - count0, 1);
    at::Tensor u = at::empty({3, 7}, at::kDouble);
    EXPECT_EQ(memory::live_bytes() - live0, 4000 + 21 * 8);
  }
  EXPECT_EQ(memory::live_bytes(), live0);
}

TEST(Memory, PeakPerPhase) {
  memory::reset_peaks();
  const int64_t live0 = memory::live_bytes();
  {
    memory::PhaseScope phase(memory::Phase::backward);
    at::Tensor t = at::empty({1 << 20}, at::kByte);
  }
  EXPECT_EQ(memory::live_bytes(), live0);
  EXPECT_EQ(memory::peak_bytes(), live0 + (1 << 20));
  EXPECT_EQ(memory::phase_peak_bytes(memory::Phase::backward), live0 + (1 << 20));
  EXPECT_LT(memory::phase_peak_bytes(memory::Phase::forward), live0 + (1 << 20));
}

TEST(Memory, LimitErrorNamesOpAndSizes) {
  const int64_t live0 = memory::live_bytes();
  memory::set_rank(3);
  memory::set_limit(live0 + 10000);
  std::string msg;
  {
    static const std::string op = "blocks.1.mlp.fc";
    memory::OpScope scope(op);
    at::Tensor ok = at::empty({1000}, at::kFloat);  // 4000 bytes: fits
    try {
      at::Tensor big = at::empty({4000}, at::kFloat);  // 16000 more: does not
    } catch (const std::exception& e) {
      msg = e.what();
    }
  }
  memory::set_limit(0);
  memory::set_rank(0);
  EXPECT_NE(msg.find("[rank 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blocks.1.mlp.fc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("asked 15.6 KiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  EXPECT_EQ(memory::live_bytes(), live0);  // the failed allocation is not counted
}

TEST(Memory, ParseBytes) {
  EXPECT_EQ(parse_bytes("512MiB", "--mem-limit"), 512LL << 20);
  EXPECT_EQ(parse_bytes("1.5GiB", "--mem-limit"), 3LL << 29);
  EXPECT_EQ(parse_bytes("4096", "--mem-limit"), 4096);
  EXPECT_EQ(parse_bytes("2GB", "--mem-limit"), 2000000000LL);
  EXPECT_THROW(parse_bytes("12XB", "--mem-limit"), UsageError);
  EXPECT_THROW(parse_bytes("-5MiB", "--mem-limit"), UsageError);
  EXPECT_THROW(parse_bytes("MiB", "--mem-limit"), UsageError);
}
