// test_main.cpp — installs the tracking allocator before any test creates a tensor, as the executable does.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "slimshard/memory.h"

int main(int argc, char** argv) {
  slimshard::memory::install();
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
