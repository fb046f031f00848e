// Placeholder: FP8 / NVFP4 quantizer tests land with issue 8.
#include <gtest/gtest.h>

TEST(QuantizeTest, NotImplementedYet) { GTEST_SKIP() << "quantizers land with issue 8"; }
