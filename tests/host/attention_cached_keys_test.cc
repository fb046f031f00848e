// Attention over cached keys (klein-KV) on the CPU reference: the FP8 attention's key layout (two
// segments of 128-key tiles that never straddle them, kernels/base/fp8_attention_keys.h), the
// backend op at lossless (the concatenation, bit for bit) and at quality=high (each segment
// quantized on its own, which the GPU test compares the kernel to), its layout refusals, and
// Flux2KvCache's bookkeeping: each layer cached once per request at step 0, read by later steps.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/fp8_attention_keys.h"
#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_fp8.h"
#include "model/flux2_kv_cache.h"
#include "model/flux2_transformer.h"
#include "model/rope.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

// Every tile in order: segment 0's, then segment 1's, indices counting from 0 in each, all 128 keys
// valid but a segment's last tile, and each segment's keys counted exactly once.
TEST(Fp8AttentionKeysTest, TilesCoverEachSegmentWithoutStraddling) {
  const int cases[][2] = {{4608, 4096}, {300, 1000}, {77, 0},     {128, 1},
                          {1, 128},     {4608, 0},   {640, 4096}, {129, 255}};
  for (const auto& keys : cases) {
    const int tiles = fp8_attention_tiles(keys[0]) + fp8_attention_tiles(keys[1]);
    int counted[2] = {0, 0}, next[2] = {0, 0}, last_segment = 0;
    for (int j = 0; j < tiles; ++j) {
      const Fp8KeyTile t = fp8_attention_key_tile(keys[0], keys[1], j);
      SCOPED_TRACE(::testing::Message() << keys[0] << " + " << keys[1] << " keys, tile " << j);
      ASSERT_TRUE(t.segment == 0 || t.segment == 1);
      EXPECT_GE(t.segment, last_segment) << "segment 1's tiles come after segment 0's";
      EXPECT_EQ(t.tile, next[t.segment]++);
      EXPECT_GE(t.valid, 1);
      EXPECT_LE(t.valid, 128);
      EXPECT_TRUE(t.valid == 128 || t.tile == fp8_attention_tiles(keys[t.segment]) - 1)
          << "only a segment's last tile is partial";
      counted[t.segment] += t.valid;
      last_segment = t.segment;
    }
    EXPECT_EQ(counted[0], keys[0]);
    EXPECT_EQ(counted[1], keys[1]);
  }
}

class AttentionCachedKeysTest : public ::testing::Test {
 protected:
  Tensor random(int64_t rows, int64_t cols, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = normal(rng_);
    Tensor t = be_.empty(DType::kF32, {rows, cols}).value();
    EXPECT_TRUE(be_.upload(v.data(), DType::kF32, t).ok());
    return t;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(be_.download(t, v.data()).ok());
    return v;
  }
  // q [S_q, w]; the call's own k, v [S, w] as the first rows of rooms [S + R, w] (column slices of
  // one wide buffer, as the transformer's workspace); the cached reference rows [R, w].
  struct Inputs {
    Tensor q, k, v, k_room, v_room, ref_k, ref_v;
  };
  Inputs inputs(int64_t s_q, int64_t s, int64_t r, int64_t width) {
    Inputs in;
    in.q = random(s_q, width, 2.0f);
    const Tensor wide = random(s + r, 3 * width, 2.0f);
    in.k_room = wide.col_slice(width, width);
    in.v_room = wide.col_slice(2 * width, width);
    in.k = in.k_room.row_slice(0, s);
    in.v = in.v_room.row_slice(0, s);
    in.ref_k = random(r, width, 2.0f);
    in.ref_v = random(r, width);
    return in;
  }
  // attention over [k ; ref_k], [v ; ref_v] as one sequence (fresh buffers).
  std::vector<float> concatenated(const Inputs& in, const AttentionParams& params) {
    const int64_t s = in.k.rows(), r = in.ref_k.rows(), width = in.k.cols();
    Tensor k = be_.empty(DType::kF32, {s + r, width}).value();
    Tensor v = be_.empty(DType::kF32, {s + r, width}).value();
    EXPECT_TRUE(be_.copy(in.k, k.row_slice(0, s)).ok());
    EXPECT_TRUE(be_.copy(in.ref_k, k.row_slice(s, r)).ok());
    EXPECT_TRUE(be_.copy(in.v, v.row_slice(0, s)).ok());
    EXPECT_TRUE(be_.copy(in.ref_v, v.row_slice(s, r)).ok());
    Tensor out = be_.empty(DType::kF32, {in.q.rows(), params.num_heads * params.head_dim}).value();
    EXPECT_TRUE(be_.attention(in.q, k, v, params, out).ok());
    return get(out);
  }
  std::vector<float> with_cache(const Inputs& in, const AttentionParams& params) {
    auto cached = be_.cache_keys(in.ref_k, in.ref_v, params);
    EXPECT_TRUE(cached.ok()) << cached.status();
    Tensor out = be_.empty(DType::kF32, {in.q.rows(), params.num_heads * params.head_dim}).value();
    const absl::Status status = be_.attention_with_cached_keys(in.q, in.k, in.v, **cached,
                                                               in.k_room, in.v_room, params, out);
    EXPECT_TRUE(status.ok()) << status;
    return get(out);
  }
  CpuBackend be_;
  std::mt19937 rng_{2024};
};

// At lossless the two segments are one key sequence: the concatenation's attention bit for bit.
TEST_F(AttentionCachedKeysTest, LosslessEqualsAttentionOverTheConcatenation) {
  const AttentionParams params{2, 2, 32, 1.0f / std::sqrt(32.0f)};
  const Inputs in = inputs(70, 70, 45, 64);
  EXPECT_EQ(with_cache(in, params), concatenated(in, params));
  EXPECT_EQ(get(in.k_room.row_slice(70, 45)), get(in.ref_k)) << "the cache was copied after k";
}

// The emulated FP8 attention, written out in double from E4M3 operands: scores, P rounded as the
// kernel rounds it (relative to the row's maximum), the output normalised by the unrounded sum.
std::vector<float> fp8_reference(const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, int64_t s_q, int64_t keys,
                                 int64_t heads, int64_t dh, float scale) {
  const int64_t width = heads * dh;
  std::vector<float> out(static_cast<size_t>(s_q * width));
  std::vector<float> scores(static_cast<size_t>(keys));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < s_q; ++i) {
      float max_score = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        float dot = 0.0f;  // in the emulation's order and precision
        for (int64_t d = 0; d < dh; ++d)
          dot += q[i * width + h * dh + d] * k[j * width + h * dh + d];
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      for (int64_t d = 0; d < dh; ++d) {
        double sum = 0.0, acc = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          const float p = std::exp(scores[j] - max_score);
          sum += p;
          acc += double(cpu::round_probability_e4m3(p)) * v[j * width + h * dh + d];
        }
        out[i * width + h * dh + d] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

// At quality=high each segment is quantized per head and 128 keys from its own first row: with
// 300 own keys (a partial block) the result is the emulation of those operands, and measurably
// not the concatenation's (whose block 2 would mix own and cached keys); with 256 own keys the
// blocks coincide and so do the results, bit for bit.
TEST_F(AttentionCachedKeysTest, HighQuantizesEachSegmentOnItsOwn) {
  const int64_t heads = 2, dh = 32, width = heads * dh, r = 200;
  const AttentionParams params{heads, heads, dh, 1.0f / std::sqrt(32.0f)};
  const RequestScope high(be_, {Quality::kHigh});
  {
    const Inputs in = inputs(40, 256, r, width);
    EXPECT_EQ(with_cache(in, params), concatenated(in, params));
  }
  const int64_t s = 300;
  const Inputs in = inputs(50, s, r, width);
  auto quantized = [&](const Tensor& t, bool value) {
    Tensor copy = be_.empty(DType::kF32, {t.rows(), t.cols()}).value();
    cpu::quantize_head_blocks_e4m3(t, dh, value, copy);
    return get(copy);
  };
  std::vector<float> k = quantized(in.k, false), v = quantized(in.v, true);
  const std::vector<float> ref_k = quantized(in.ref_k, false), ref_v = quantized(in.ref_v, true);
  k.insert(k.end(), ref_k.begin(), ref_k.end());
  v.insert(v.end(), ref_v.begin(), ref_v.end());
  const std::vector<float> want =
      fp8_reference(quantized(in.q, false), k, v, 50, s + r, heads, dh, params.scale);
  const std::vector<float> got = with_cache(in, params);
  const double error = relative_l2_error(got, want);
  const double concatenation_error = relative_l2_error(concatenated(in, params), want);
  // The same float32 operations in the same order: equal up to the summation of rows into
  // threads' chunks (none here); 1e-6 leaves room for a different libm exp.
  EXPECT_LE(error, 1e-6);
  EXPECT_GT(concatenation_error, 100 * std::max(error, 1e-7))
      << "the segments were quantized as one sequence";
}

TEST_F(AttentionCachedKeysTest, RefusesKeysThatAreNotTheFirstRowsOfTheirRoom) {
  const AttentionParams params{2, 2, 32, 0.17f};
  const Inputs in = inputs(10, 20, 30, 64);
  auto cached = be_.cache_keys(in.ref_k, in.ref_v, params);
  ASSERT_TRUE(cached.ok());
  Tensor out = be_.empty(DType::kF32, {10, 64}).value();
  for (const Quality quality : {Quality::kLossless, Quality::kHigh}) {
    const RequestScope request(be_, {quality});
    // k one row into its room; then a room one row short of the cache.
    absl::Status status = be_.attention_with_cached_keys(
        in.q, in.k_room.row_slice(1, 20), in.v, **cached, in.k_room, in.v_room, params, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("k f32[20, 64]"), std::string::npos) << status;
    EXPECT_NE(status.message().find("must be the first rows of its room"), std::string::npos);
    status = be_.attention_with_cached_keys(in.q, in.k, in.v, **cached, in.k_room,
                                            in.v_room.row_slice(0, 49), params, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("holds 30 more rows"), std::string::npos) << status;
  }
  EXPECT_FALSE(be_.cache_keys(in.ref_k, in.v, params).ok()) << "k and v differ in rows";
}

// Flux2KvCache: a layer is cached by its extract (once: a second one is an error) and read by
// every cached forward; a cached forward before the extract is refused.
TEST_F(AttentionCachedKeysTest, KvCacheCachesEachLayerOnceAndRefusesReadsBeforeIt) {
  const AttentionParams params{2, 2, 32, 0.17f};
  const int64_t joint = 24, r = 16, width = 64;
  auto cache = Flux2KvCache::allocate(be_, 2, r, width);
  ASSERT_TRUE(cache.ok());
  const Inputs in = inputs(joint, joint, r, width);
  Tensor out = be_.empty(DType::kF32, {joint + r, width}).value();
  const absl::Status early = (*cache)->attend_cached(be_, 0, params, in.q, in.k, in.v, in.k_room,
                                                     in.v_room, out.row_slice(0, joint));
  EXPECT_NE(early.message().find("layer 0 has no cached keys (step 0 must run first)"),
            std::string::npos)
      << early;
  // The extract forward's q, k, v: [joint + R] rows, the references last.
  const Tensor q = random(joint + r, width), k = random(joint + r, width),
               v = random(joint + r, width);
  ASSERT_TRUE((*cache)->extract(be_, 0, params, joint, q, k, v, out).ok());
  const CachedKeys* layer0 = (*cache)->layer(0);
  ASSERT_NE(layer0, nullptr);
  EXPECT_EQ(layer0->rows(), r);
  EXPECT_EQ((*cache)->layer(1), nullptr);
  EXPECT_EQ((*cache)->device_bytes(), 2 * r * width * 4);
  EXPECT_FALSE((*cache)->extract(be_, 0, params, joint, q, k, v, out).ok()) << "extracted twice";
  for (int step = 1; step <= 2; ++step) {
    ASSERT_TRUE((*cache)
                    ->attend_cached(be_, 0, params, in.q, in.k, in.v, in.k_room, in.v_room,
                                    out.row_slice(0, joint))
                    .ok());
    EXPECT_EQ((*cache)->layer(0), layer0) << "the cache was made again at step " << step;
  }
}

// A klein-KV request on the tiny transformer (2 + 2 blocks, 12 heads of 8) at quality=high: step 0
// caches every layer, later steps read the same caches, and a request that starts at a later step
// is refused.
TEST(KleinKvRequestTest, CachesEveryLayerOnceAtStepZero) {
  CpuBackend be;
  const Flux2Config config = testing::twelve_head_config();
  auto model = Flux2Transformer::create_random(be, config, 7);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->enable_quality_high().ok());
  const int64_t l = 5, h = 3, w = 4, n = h * w, r = 6;
  Flux2References refs;
  refs.kv_cache = true;
  for (int64_t i = 0; i < r; ++i) refs.ids.insert(refs.ids.end(), {10, i / 3, i % 3, 0});
  Tensor prompt = be.empty(DType::kF32, {l, 16}).value();
  Tensor x = be.empty(DType::kF32, {n + r, 8}).value();
  ASSERT_TRUE(be.fill_uniform(prompt, 1, 1.0f).ok());
  ASSERT_TRUE(be.fill_uniform(x, 2, 1.0f).ok());
  const std::vector<float> timesteps = {1.0f, 0.75f, 0.5f};
  const RequestScope high(be, {Quality::kHigh});
  auto cond =
      (*model)->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, {}, &refs);
  ASSERT_TRUE(cond.ok()) << cond.status();
  Tensor out = be.empty(DType::kF32, {n, 8}).value();
  const absl::Status early = (*model)->forward(*cond, 1, x.row_slice(0, n), out);
  EXPECT_NE(early.message().find("step 0 must run first"), std::string::npos) << early;
  ASSERT_TRUE((*model)->forward(*cond, 0, x, out).ok());
  std::vector<const CachedKeys*> layers;
  for (size_t i = 0; i < 4; ++i) {
    layers.push_back(cond->kv->layer(i));
    ASSERT_NE(layers.back(), nullptr) << "layer " << i;
    EXPECT_EQ(layers.back()->rows(), r);
  }
  for (int64_t step = 1; step < 3; ++step) {
    ASSERT_TRUE((*model)->forward(*cond, step, x.row_slice(0, n), out).ok());
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(cond->kv->layer(i), layers[i]) << "step " << step;
  }
}

}  // namespace
}  // namespace flux2
