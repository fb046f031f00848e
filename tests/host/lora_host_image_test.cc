// The packed layout of an adapter (model/lora_host_image.h): A matrices stacked per fused weight,
// every stack and B aligned, the bound the caches charge; the host image's values (f32 as they are,
// bf16 rounded to nearest even, gaps zero); and that an upload from the image gives the device
// weights the converting upload gives (CPU backend).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>

#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/flux2_lora.h"
#include "model/lora_host_image.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using testing::download;
using testing::two_head_config;

// An adapter of `rank` on the named modules, its values distinct: module m's A[i] = m + i / 1024,
// B[i] = -(m + i / 1024).
std::shared_ptr<const LoraAdapter> counting_adapter(const Flux2Config& config, int64_t rank,
                                                    std::vector<std::string> modules) {
  auto adapter = std::make_shared<LoraAdapter>();
  const auto targets = flux2_lora_targets(config);
  float m_value = 1.0f;
  for (const std::string& name : modules) {
    const LoraTarget& t = targets.at(name);
    LoraModule m{name, rank, t.in_features, t.out_features, {}, {}, double(rank), false};
    m.a.resize(static_cast<size_t>(rank * t.in_features));
    m.b.resize(static_cast<size_t>(t.out_features * rank));
    for (size_t i = 0; i < m.a.size(); ++i) m.a[i] = m_value + static_cast<float>(i) / 1024;
    for (size_t i = 0; i < m.b.size(); ++i) m.b[i] = -(m_value + static_cast<float>(i) / 1024);
    m_value += 1.0f;
    adapter->modules.push_back(std::move(m));
  }
  return adapter;
}

// Host memory from `be`, every byte 0xAB until the image writes it.
LoraHostAllocator dirty_memory(CpuBackend& be) {
  return [&be](DType dtype, Shape shape) -> absl::StatusOr<Tensor> {
    FLUX_ASSIGN_OR_RETURN(Tensor t, be.empty(dtype, std::move(shape)));
    std::memset(t.data(), 0xAB, static_cast<size_t>(t.bytes()));
    return t;
  };
}

const std::vector<std::string> kModules = {"transformer_blocks.0.attn.to_v", "proj_out",
                                           "transformer_blocks.0.attn.to_q",
                                           "transformer_blocks.0.attn.to_k"};

TEST(LoraPackingTest, StacksEachFusedWeightsAMatricesAndAlignsEveryMatrix) {
  const Flux2Config config = two_head_config();
  auto adapter = counting_adapter(config, 3, kModules);
  for (const int64_t value_bytes : {2, 4}) {
    auto packing = pack_lora_modules(config, *adapter, value_bytes);
    ASSERT_TRUE(packing.ok()) << packing.status();
    ASSERT_EQ(packing->modules.size(), 4u);
    // By fused weight (proj_out's before the double block's q|k|v); q, k and v write one fused
    // weight: one stack, in adapter order.
    EXPECT_EQ(packing->modules[0].source->module, "proj_out");
    EXPECT_EQ(packing->modules[0].stack_rows, 3);
    const PackedLoraModule& v = packing->modules[1];
    EXPECT_EQ(v.source->module, "transformer_blocks.0.attn.to_v");
    EXPECT_EQ(packing->modules[2].source->module, "transformer_blocks.0.attn.to_q");
    EXPECT_EQ(packing->modules[3].source->module, "transformer_blocks.0.attn.to_k");
    for (int i = 1; i < 4; ++i) {
      EXPECT_EQ(packing->modules[i].stack, v.stack);
      EXPECT_EQ(packing->modules[i].stack_rows, 9);
      EXPECT_EQ(packing->modules[i].a_row, 3 * (i - 1));
    }
    // Every matrix aligned, none overlapping, all inside the buffer, within the charged bound.
    std::set<std::pair<int64_t, int64_t>> spans;
    for (const PackedLoraModule& m : packing->modules) {
      const int64_t in = m.source->in_features, out = m.source->out_features;
      EXPECT_EQ(m.stack * value_bytes % kLoraPackAlignmentBytes, 0);
      EXPECT_EQ(m.b * value_bytes % kLoraPackAlignmentBytes, 0);
      if (m.a_row == 0) spans.insert({m.stack, m.stack + m.stack_rows * in});
      spans.insert({m.b, m.b + out * m.source->rank});
    }
    int64_t end = 0;
    for (const auto& [begin, finish] : spans) {
      EXPECT_GE(begin, end);
      end = finish;
    }
    EXPECT_LE(end, packing->values);
    EXPECT_LE(packing->values * value_bytes, lora_packed_bytes_bound(*adapter, value_bytes));
  }
}

TEST(LoraPackingTest, RefusesAModuleThatDoesNotFitTheTransformer) {
  const Flux2Config config = two_head_config();
  auto adapter = std::make_shared<LoraAdapter>(*counting_adapter(config, 2, {"proj_out"}));
  adapter->modules[0].in_features += 1;
  const absl::Status status = pack_lora_modules(config, *adapter, 4).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "LoRA module proj_out does not fit this transformer");
}

TEST(LoraHostImageTest, HoldsEachMatrixAtItsOffsetAsBf16RoundedToNearestEvenGapsZero) {
  const Flux2Config config = two_head_config();
  auto counting = counting_adapter(config, 3, kModules);
  LoraAdapter adapter = *counting;
  adapter.modules[1].a[0] = 1.00390625f;  // halfway between bf16 1 and 1.0078125: to even, 1
  adapter.modules[1].a[1] = 1.01171875f;  // halfway between 1.0078125 and 1.015625: 1.015625
  CpuBackend be;
  auto image = LoraHostImage::make(config, adapter, DType::kBF16, dirty_memory(be));
  ASSERT_TRUE(image.ok()) << image.status();
  const auto packing = pack_lora_modules(config, adapter, 2).value();
  ASSERT_EQ((*image)->values().numel(), packing.values);
  const auto* bits = (*image)->values().data_as<uint16_t>();
  std::vector<bool> written(static_cast<size_t>(packing.values), false);
  for (const PackedLoraModule& m : packing.modules) {
    const int64_t a = m.stack + m.a_row * m.source->in_features;
    for (size_t i = 0; i < m.source->a.size(); ++i) {
      ASSERT_EQ(bits[a + i], f32_to_bf16_bits(m.source->a[i])) << m.source->module << " A " << i;
      written[a + i] = true;
    }
    for (size_t i = 0; i < m.source->b.size(); ++i) {
      ASSERT_EQ(bits[m.b + i], f32_to_bf16_bits(m.source->b[i])) << m.source->module << " B " << i;
      written[m.b + i] = true;
    }
  }
  const PackedLoraModule& proj_out = packing.modules[0];
  EXPECT_EQ(bits[proj_out.stack], 0x3F80);      // 1.0
  EXPECT_EQ(bits[proj_out.stack + 1], 0x3F82);  // 1.015625
  for (int64_t i = 0; i < packing.values; ++i) {
    if (!written[i]) {
      ASSERT_EQ(bits[i], 0) << "gap element " << i;
    }
  }
  EXPECT_EQ(LoraHostImage::make(config, adapter, DType::kF16, dirty_memory(be)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoraHostImageTest, AnUploadFromTheImageGivesTheConvertingUploadsWeights) {
  const Flux2Config config = two_head_config();
  auto adapter = counting_adapter(config, 3, kModules);
  CpuBackend be;
  auto image = LoraHostImage::make(config, *adapter, DType::kF32, dirty_memory(be));
  ASSERT_TRUE(image.ok()) << image.status();
  // One value changed in the image only: the upload that copies the image carries it.
  const LoraPacking packing = pack_lora_modules(config, *adapter, 4).value();
  float* marked = (*image)->values().data_as<float>() + packing.modules[0].stack;
  const float original = *marked;
  *marked = 12345.0f;
  auto copied = Flux2LoraWeights::upload(be, config, adapter, image->get());
  *marked = original;
  auto converted = Flux2LoraWeights::upload(be, config, adapter);
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ((*copied)->modules().size(), 4u);
  EXPECT_EQ((*copied)->device_bytes(), (*converted)->device_bytes());
  for (size_t i = 0; i < 4; ++i) {
    const Flux2LoraWeights::Module& c = (*copied)->modules()[i];
    const Flux2LoraWeights::Module& u = (*converted)->modules()[i];
    std::vector<float> a = download(be, c.a), stack = download(be, c.a_stack);
    if (i == 0) {
      EXPECT_EQ(a[0], 12345.0f);
      EXPECT_EQ(stack[0], 12345.0f);
      a[0] = stack[0] = original;
    }
    EXPECT_EQ(a, download(be, u.a)) << c.source->module;
    EXPECT_EQ(a, c.source->a) << c.source->module;  // f32: the values themselves
    EXPECT_EQ(download(be, c.b), download(be, u.b)) << c.source->module;
    EXPECT_EQ(stack, download(be, u.a_stack)) << c.source->module;
    EXPECT_EQ(c.a_row, u.a_row);
  }
  // An image of another dtype than the backend's is not used: the upload converts instead.
  auto bf16 = LoraHostImage::make(config, *adapter, DType::kBF16, dirty_memory(be));
  ASSERT_TRUE(bf16.ok());
  auto fallback = Flux2LoraWeights::upload(be, config, adapter, bf16->get());
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(download(be, (*fallback)->modules()[0].a), download(be, (*converted)->modules()[0].a));
}

}  // namespace
}  // namespace flux2
