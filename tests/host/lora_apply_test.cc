// LoRA adapters on the CPU backend: lora_up_add, the per-request terms (order, weight 0, fused-row
// targets, A matrices stacked per fused weight), the device LRU (budget, eviction order, in-use and
// pinned adapters), and that an adapter of weight 0 leaves the transformer's output bit for bit as
// without it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "kernels/base/read_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint.h"
#include "model/flux2_lora.h"
#include "model/flux2_transformer.h"
#include "model/lora_device_cache.h"
#include "model/rope.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using testing::download;
using testing::test_data_dir;
using testing::two_head_config;

// An adapter of `rank` on the named modules of `config`, every A value `a`, every B value `b`.
std::shared_ptr<const LoraAdapter> constant_adapter(const Flux2Config& config, int64_t rank,
                                                    std::vector<std::string> modules, float a,
                                                    float b) {
  auto adapter = std::make_shared<LoraAdapter>();
  const auto targets = flux2_lora_targets(config);
  for (const std::string& name : modules) {
    const LoraTarget& t = targets.at(name);
    LoraModule m{name, rank, t.in_features, t.out_features, {}, {}, double(rank), false};
    m.a.assign(static_cast<size_t>(rank * t.in_features), a);
    m.b.assign(static_cast<size_t>(t.out_features * rank), b);
    adapter->modules.push_back(std::move(m));
  }
  return adapter;
}

class LoraApplyTest : public ::testing::Test {
 protected:
  Tensor tensor(Shape shape, const std::vector<float>& values) {
    Tensor t = be_.empty(DType::kF32, std::move(shape)).value();
    EXPECT_TRUE(be_.upload(values.data(), DType::kF32, t).ok());
    return t;
  }
  CpuBackend be_;
};

TEST_F(LoraApplyTest, LoraUpAddAddsEachScaledProductOnItsColumnsInOrder) {
  Tensor y = tensor({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor t = tensor({2, 2}, {1, 2, 3, 4});
  Tensor b = tensor({3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor b_last = tensor({1, 1}, {10});
  const std::vector<LoraUpTerm> terms = {{t, b, 0.5f, 0}, {t.col_slice(0, 1), b_last, 1.0f, 2}};
  ASSERT_TRUE(be_.lora_up_add(y, terms).ok());
  // t · bᵀ = [[1, 2, 3], [3, 4, 7]], halved and added; then column 2 gets t[:, 0] · 10.
  EXPECT_EQ(download(be_, y), (std::vector<float>{1.5f, 3, 14.5f, 5.5f, 7, 39.5f}));
  const LoraUpTerm bad_rank{t, tensor({3, 1}, {0, 0, 0}), 1.0f, 0};
  EXPECT_FALSE(be_.lora_up_add(y, {bad_rank}).ok());  // r must agree
  const LoraUpTerm outside{t, b, 1.0f, 1};
  const absl::Status status = be_.lora_up_add(y, {outside});
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("terms[0]: columns [1, 4) outside y"));
}

TEST_F(LoraApplyTest, LoraColumnsCutTermsToAColumnRange) {
  Tensor t = tensor({1, 1}, {1});
  Tensor whole = tensor({6, 1}, {0, 1, 2, 3, 4, 5}), tail = tensor({2, 1}, {6, 7});
  const std::vector<LoraUpTerm> ups = {{t, whole, 1.0f, 0}, {t, tail, 2.0f, 4}};
  const std::vector<LoraUpTerm> part = lora_columns(ups, 3, 2);  // columns [3, 5)
  ASSERT_EQ(part.size(), 2u);
  EXPECT_EQ(download(be_, part[0].b), (std::vector<float>{3, 4}));
  EXPECT_EQ(part[0].out_offset, 0);
  EXPECT_EQ(download(be_, part[1].b), (std::vector<float>{6}));
  EXPECT_EQ(part[1].out_offset, 1);
  EXPECT_EQ(part[1].scale, 2.0f);
  EXPECT_TRUE(lora_columns(ups, 6, 2).empty());
}

TEST_F(LoraApplyTest, QkTermsTakeQAndKColumnsOfEachPartsRows) {
  // Rows [0, 1) carry the first list's products, rows [1, 3) the second's; d = 2, so q is
  // columns [0, 2) and k [2, 4) of a fused [q | k | v] output of 6 columns.
  Tensor t = tensor({3, 1}, {1, 2, 3});
  Tensor whole = tensor({6, 1}, {0, 1, 2, 3, 4, 5}), only_k = tensor({2, 1}, {7, 8});
  Tensor a = tensor({1, 1}, {1});  // rank 1: the products are t's one column
  Flux2LoraTerms txt, img;
  txt.push_back({a, whole, 1.0f, 0, a, 0});
  img.push_back({a, only_k, 2.0f, 2, a, 0});
  const QkLoraTerms qk = lora_qk_terms(&txt, &img, 1, 3, t, 2);
  ASSERT_EQ(qk.q[0].size(), 1u);
  ASSERT_EQ(qk.k[0].size(), 1u);
  EXPECT_EQ(download(be_, qk.q[0][0].b), (std::vector<float>{0, 1}));
  EXPECT_EQ(download(be_, qk.k[0][0].b), (std::vector<float>{2, 3}));
  EXPECT_EQ(download(be_, qk.k[0][0].t), (std::vector<float>{1}));  // part 0's row
  EXPECT_TRUE(qk.q[1].empty());                                     // img has no q term
  ASSERT_EQ(qk.k[1].size(), 1u);
  EXPECT_EQ(download(be_, qk.k[1][0].t), (std::vector<float>{2, 3}));  // part 1's rows
  EXPECT_EQ(qk.k[1][0].out_offset, 0);
  EXPECT_EQ(qk.k[1][0].scale, 2.0f);
  const QkLoraTerms none = lora_qk_terms(&txt, nullptr, 3, 3, t, 2);  // one part, all rows
  EXPECT_EQ(none.q[0].size(), 1u);
  EXPECT_TRUE(none.q[1].empty() && none.k[1].empty());
}

TEST_F(LoraApplyTest, LoraUpQkNormRopeIsTheAddThenTheNorm) {
  // The default op against lora_up_add then qk_norm_rope (one head of 4, interleaved RoPE).
  const std::vector<float> x_values = {0.5f, -1, 2, 0.25f, 1, 3, -2, 0.5f};
  Tensor t = tensor({2, 1}, {1, -2}), b = tensor({4, 1}, {1, 2, 3, 4});
  Tensor weight = tensor({4}, {1, 0.5f, 2, -1});
  Tensor cos = tensor({2, 4}, {1, 1, 0.5f, 0.5f, 0, 0, 1, 1});
  Tensor sin = tensor({2, 4}, {0, 0, 0.5f, 0.5f, 1, 1, 0, 0});
  const LoraUpTerm term{t, b, 0.5f, 0};
  Tensor x = tensor({2, 4}, x_values), x2 = tensor({2, 4}, x_values);
  ASSERT_TRUE(
      be_.lora_up_qk_norm_rope(x, {term}, 4, weight, 1e-6f, cos, sin, RopeStyle::kInterleaved)
          .ok());
  ASSERT_TRUE(be_.lora_up_add(x2, {term}).ok());
  ASSERT_TRUE(be_.qk_norm_rope(x2, 4, weight, 1e-6f, cos, sin, RopeStyle::kInterleaved).ok());
  EXPECT_EQ(download(be_, x), download(be_, x2));
}

TEST_F(LoraApplyTest, FusedConsumersEqualTheAddThenTheirOp) {
  // swiglu(y') and x + gate ⊙ y' with y' = y after the terms, against the two ops run apart.
  const std::vector<float> y_values = {0.5f, -1, 2, 0.25f, 1, 3, -2, 0.5f};
  Tensor t = tensor({2, 1}, {1, -2});
  Tensor b = tensor({4, 1}, {1, 2, 3, 4});
  const LoraUpTerm term{t, b, 0.5f, 0};
  Tensor y = tensor({2, 4}, y_values), act = tensor({2, 2}, {0, 0, 0, 0});
  ASSERT_TRUE(be_.lora_up_swiglu(y, {term}, act).ok());
  Tensor y2 = tensor({2, 4}, y_values), act2 = tensor({2, 2}, {0, 0, 0, 0});
  ASSERT_TRUE(be_.lora_up_add(y2, {term}).ok());
  ASSERT_TRUE(be_.swiglu(y2.col_slice(0, 2), y2.col_slice(2, 2), act2).ok());
  EXPECT_EQ(download(be_, act), download(be_, act2));

  Tensor x = tensor({2, 4}, {1, 1, 1, 1, 2, 2, 2, 2}), gate = tensor({4}, {1, 0.5f, -1, 2});
  Tensor x2 = tensor({2, 4}, {1, 1, 1, 1, 2, 2, 2, 2});
  y = tensor({2, 4}, y_values), y2 = tensor({2, 4}, y_values);
  ASSERT_TRUE(be_.lora_up_gate_residual(y, {term}, x, gate).ok());
  ASSERT_TRUE(be_.lora_up_add(y2, {term}).ok());
  ASSERT_TRUE(be_.gate_residual(x2, gate, y2).ok());
  EXPECT_EQ(download(be_, x), download(be_, x2));
  EXPECT_FALSE(be_.lora_up_swiglu(y, {term}, tensor({2, 3}, {0, 0, 0, 0, 0, 0})).ok());
}

TEST_F(LoraApplyTest, TermsKeepRequestOrderSkipWeightZeroAndLandOnTheirFusedRows) {
  const Flux2Config config = two_head_config();
  const int64_t d = config.hidden();
  LoraDeviceCache uploads;
  auto first = constant_adapter(config, 2, {"transformer_blocks.0.attn.to_k", "norm_out.linear"},
                                1.0f, 1.0f);
  auto second = constant_adapter(config, 4, {"transformer_blocks.0.attn.to_k"}, 1.0f, 1.0f);
  auto unused = constant_adapter(config, 8, {"proj_out"}, 1.0f, 1.0f);
  const std::vector<LoraRequest> requests = {
      {"a", first, 0.5}, {"b", second, 2.0}, {"c", unused, 0.0}};
  auto uses = uploads.acquire(be_, config, requests);
  ASSERT_TRUE(uses.ok()) << uses.status();
  const Flux2Lora lora = flux2_lora(config, *uses);
  ASSERT_EQ(lora.double_blocks[0].img_qkv.size(), 2u);
  EXPECT_EQ(lora.double_blocks[0].img_qkv[0].out_offset, d);      // k: rows D..2D of q|k|v
  EXPECT_EQ(lora.double_blocks[0].img_qkv[0].a.rows(), 2);        // the first adapter first
  EXPECT_FLOAT_EQ(lora.double_blocks[0].img_qkv[0].scale, 0.5f);  // weight * alpha / r
  EXPECT_FLOAT_EQ(lora.double_blocks[0].img_qkv[1].scale, 2.0f);
  ASSERT_EQ(lora.modulation.size(), 1u);
  EXPECT_EQ(lora.modulation[0].out_offset, 15 * d);  // norm_out: scale, then shift
  EXPECT_TRUE(lora.proj_out.empty());                // weight 0: left out
  EXPECT_EQ(lora.max_rank, 6);                       // the widest list: k's ranks 2 + 4
}

TEST_F(LoraApplyTest, StackedATermsEqualTermsAppliedOneByOne) {
  const Flux2Config config = two_head_config();
  LoraDeviceCache uploads;
  // q, k and v of one adapter (rows of one A stack), then k of another (a stack of its own).
  auto qkv = constant_adapter(config, 2,
                              {"transformer_blocks.0.attn.to_v", "transformer_blocks.0.attn.to_q",
                               "transformer_blocks.0.attn.to_k"},
                              0.5f, 0.25f);
  auto k = constant_adapter(config, 3, {"transformer_blocks.0.attn.to_k"}, 0.25f, 1.0f);
  const std::vector<LoraRequest> requests = {{"qkv", qkv, 1.0}, {"k", k, -2.0}};
  auto uses = uploads.acquire(be_, config, requests);
  ASSERT_TRUE(uses.ok()) << uses.status();
  const Flux2Lora lora = flux2_lora(config, *uses);
  const Flux2LoraTerms& stacked = lora.double_blocks[0].img_qkv;
  ASSERT_EQ(stacked.size(), 4u);
  EXPECT_EQ(stacked[1].a_stack.data(), stacked[0].a_stack.data());
  EXPECT_EQ(stacked[1].a_row, 2);
  EXPECT_EQ(stacked[2].a_row, 4);
  EXPECT_NE(stacked[3].a_stack.data(), stacked[0].a_stack.data());
  Flux2LoraTerms separate = stacked;
  for (Flux2LoraTerm& term : separate) term.a_stack = term.a, term.a_row = 0;
  Flux2LoraScratch scratch;
  ASSERT_TRUE(scratch.allocate(be_, lora, 2).ok());
  const int64_t d = config.hidden();
  std::vector<float> xv(static_cast<size_t>(2 * d));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i % 5) - 2.0f;
  Tensor x = tensor({2, d}, xv);
  Tensor y1 = tensor({2, 3 * d}, std::vector<float>(static_cast<size_t>(6 * d), 1.0f));
  Tensor y2 = tensor({2, 3 * d}, std::vector<float>(static_cast<size_t>(6 * d), 1.0f));
  ASSERT_TRUE(apply_lora(be_, stacked, x, y1, scratch).ok());
  ASSERT_TRUE(apply_lora(be_, separate, x, y2, scratch).ok());
  EXPECT_EQ(download(be_, y1), download(be_, y2));  // small integers and halves: exact
  EXPECT_NE(download(be_, y1), std::vector<float>(static_cast<size_t>(6 * d), 1.0f));
}

TEST_F(LoraApplyTest, ApplyLoraIsThePeftChain) {
  const Flux2Config config = two_head_config();
  LoraDeviceCache uploads;
  auto adapter = constant_adapter(config, 1, {"proj_out"}, 1.0f, 2.0f);
  const std::vector<LoraRequest> requests = {{"a", adapter, 0.25}};
  auto uses = uploads.acquire(be_, config, requests);
  ASSERT_TRUE(uses.ok());
  const Flux2Lora lora = flux2_lora(config, *uses);
  Flux2LoraScratch scratch;
  ASSERT_TRUE(scratch.allocate(be_, lora, 1).ok());
  const int64_t d = config.hidden();
  std::vector<float> xv(static_cast<size_t>(d), 1.0f);
  Tensor x = tensor({1, d}, xv);
  Tensor y = tensor({1, 8}, std::vector<float>(8, 1.0f));
  ASSERT_TRUE(apply_lora(be_, lora.proj_out, x, y, scratch).ok());
  // t = sum(x) = D, u = 2 D, y = 1 + 0.25 * 2 D.
  EXPECT_EQ(download(be_, y), std::vector<float>(8, 1.0f + 0.5f * static_cast<float>(d)));
}

TEST_F(LoraApplyTest, DeviceCacheEvictsTheLeastRecentlyUsedOutsideTheRequest) {
  const Flux2Config config = two_head_config();
  auto make = [&](float v) { return constant_adapter(config, 2, {"proj_out"}, v, v); };
  const int64_t one = Flux2LoraWeights::device_bytes(*make(1), 4);
  LoraDeviceCache cache(2 * one);  // room for two
  auto run = [&](std::vector<std::string> keys) {
    std::vector<LoraRequest> requests;
    for (const std::string& k : keys) requests.push_back({k, make(1), 1.0});
    return cache.acquire(be_, config, requests).status();
  };
  ASSERT_TRUE(run({"a"}).ok());
  ASSERT_TRUE(run({"b"}).ok());
  ASSERT_TRUE(run({"a"}).ok());  // a is now the most recent
  ASSERT_TRUE(run({"c"}).ok());  // evicts b
  EXPECT_TRUE(cache.resident("a"));
  EXPECT_FALSE(cache.resident("b"));
  EXPECT_TRUE(cache.resident("c"));
  LoraCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 3);
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.bytes, 2 * one);
  // A request's own adapters are not evicted for it: three at once do not fit.
  const absl::Status three = run({"a", "c", "d"});
  EXPECT_EQ(three.code(), absl::StatusCode::kResourceExhausted) << three;
  EXPECT_NE(three.message().find("--lora-cache-bytes"), std::string::npos);
  // A pinned adapter stays: the next newcomer evicts the other one.
  ASSERT_TRUE(cache.pin(be_, config, {"c", make(1), 1.0}).ok());
  ASSERT_TRUE(run({"e"}).ok());
  EXPECT_TRUE(cache.resident("c"));
  EXPECT_FALSE(cache.resident("a"));
  EXPECT_EQ(run({"f", "g"}).code(), absl::StatusCode::kResourceExhausted);  // c is pinned
}

TEST_F(LoraApplyTest, AnAdapterOfWeightZeroLeavesTheTransformerBitForBit) {
  const std::string dir = test_data_dir() + "/tiny-klein";
  auto weights = ComponentWeights::open(dir + "/checkpoint/transformer");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto model = Flux2Transformer::load(be_, *weights);
  ASSERT_TRUE(model.ok()) << model.status();
  const Flux2Config& config = (*model)->config();
  auto bytes = read_file(dir + "/loras/style_diffusers.safetensors", "style");
  ASSERT_TRUE(bytes.ok());
  auto parsed = parse_lora_adapter(
      std::span(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()), config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto adapter = std::make_shared<const LoraAdapter>(std::move(*parsed));

  const int64_t l = 5, h = 2, w = 3, n = h * w;
  std::vector<float> text(static_cast<size_t>(l * config.joint_attention_dim));
  std::vector<float> latents(static_cast<size_t>(n * config.in_channels));
  for (size_t i = 0; i < text.size(); ++i) text[i] = std::sin(0.1f * static_cast<float>(i));
  for (size_t i = 0; i < latents.size(); ++i) latents[i] = std::cos(0.07f * static_cast<float>(i));
  Tensor prompt = tensor({l, config.joint_attention_dim}, text);
  Tensor x = tensor({n, config.in_channels}, latents);
  const std::vector<float> timesteps = {0.7f};
  auto output = [&](std::vector<LoraRequest> requests) {
    LoraDeviceCache uploads;
    auto uses = uploads.acquire(be_, config, requests);
    EXPECT_TRUE(uses.ok());
    auto lora = std::make_shared<const Flux2Lora>(flux2_lora(config, *uses));
    auto cond = (*model)->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, {},
                                  nullptr, lora);
    EXPECT_TRUE(cond.ok()) << cond.status();
    Tensor out = be_.empty(DType::kF32, {n, config.out_channels}).value();
    EXPECT_TRUE((*model)->forward(*cond, 0, x, out).ok());
    return download(be_, out);
  };
  const std::vector<float> plain = output({});
  EXPECT_EQ(output({{"style", adapter, 0.0}}), plain);
  EXPECT_NE(output({{"style", adapter, 1.0}}), plain);
}

}  // namespace
}  // namespace flux2
