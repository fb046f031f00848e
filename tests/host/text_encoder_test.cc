// The text encoder (Qwen3 here; Mistral in dev_pipeline_test.cc): config errors, loading only the
// layers up to the last tap (later layers are never read, so a corrupt later layer does not fail
// the load), errors naming a mis-shaped needed tensor, and the forward against a float64 naive
// implementation written here (GQA head mapping, causal + padding mask, tap stacking order) and
// against the tiny-klein golden pad rows.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/text_encoder.h"
#include "model/text_encoder_weights.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

// tests/data/README.md's float32 bar: a correct float32 implementation lands within 1e-4 relative
// L2 of a float64-accurate reference (here the float32 CPU path measures about 1e-6 against the
// float64 naive forward; a missing or misplaced term such as the wrong GQA head gives > 1e-2).
constexpr double kFloat32Tolerance = 1e-4;

std::string tiny_klein_encoder_dir() {
  return testing::test_data_dir() + "/tiny-klein/checkpoint/text_encoder";
}

using testing::download;

// Columns [begin, begin + count) of a row-major [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t cols, int64_t begin,
                           int64_t count) {
  std::vector<float> out;
  for (size_t r = 0; r < m.size() / cols; ++r) {
    out.insert(out.end(), m.begin() + r * cols + begin, m.begin() + r * cols + begin + count);
  }
  return out;
}

// Rows [begin, begin + count) of a row-major [rows, cols] matrix.
std::vector<float> rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t count) {
  return std::vector<float>(m.begin() + begin * cols, m.begin() + (begin + count) * cols);
}

// ---- a small synthetic Qwen3 checkpoint and a float64 naive forward of it ----------------------

struct SyntheticQwen3 {
  int64_t hidden = 16, layers = 6, heads = 4, kv_heads = 2, head_dim = 8;  // q width 32 != hidden
  int64_t intermediate = 24, vocab = 40;
  double eps = 1e-6, theta = 10000.0;  // a small theta so RoPE rotates every pair noticeably
  std::map<std::string, std::vector<float>> weights;
  std::map<std::string, std::vector<int64_t>> shapes;

  SyntheticQwen3() {
    std::mt19937 rng(1234);
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float center,
                   float spread) {
      std::uniform_real_distribution<float> dist(center - spread, center + spread);
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = dist(rng);
      weights[name] = std::move(v);
      shapes[name] = std::move(shape);
    };
    const float w = 1.0f / std::sqrt(static_cast<float>(hidden));
    add("model.embed_tokens.weight", {vocab, hidden}, 0.0f, 1.0f);
    for (int64_t i = 0; i < layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      add(p + "input_layernorm.weight", {hidden}, 1.0f, 0.3f);
      add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden}, 0.0f, 2 * w);
      add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden}, 0.0f, 2 * w);
      add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden}, 0.0f, 2 * w);
      add(p + "self_attn.q_norm.weight", {head_dim}, 1.0f, 0.5f);
      add(p + "self_attn.k_norm.weight", {head_dim}, 1.0f, 0.5f);
      add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim}, 0.0f, w);
      add(p + "post_attention_layernorm.weight", {hidden}, 1.0f, 0.3f);
      add(p + "mlp.gate_proj.weight", {intermediate, hidden}, 0.0f, 2 * w);
      add(p + "mlp.up_proj.weight", {intermediate, hidden}, 0.0f, 2 * w);
      add(p + "mlp.down_proj.weight", {hidden, intermediate}, 0.0f, w);
    }
    add("model.norm.weight", {hidden}, 1.0f, 0.3f);
  }

  nlohmann::json config() const {
    return {{"architectures", {"Qwen3ForCausalLM"}},
            {"model_type", "qwen3"},
            {"hidden_size", hidden},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"head_dim", head_dim},
            {"intermediate_size", intermediate},
            {"vocab_size", vocab},
            {"rms_norm_eps", eps},
            {"rope_theta", theta},
            {"rope_scaling", nullptr},
            {"attention_bias", false},
            {"hidden_act", "silu"},
            {"use_sliding_window", false},
            {"sliding_window", nullptr},
            {"tie_word_embeddings", true}};
  }

  void write(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config().dump(2);
    std::map<std::string, testing::RawTensor> tensors;
    for (const auto& [name, values] : weights)
      tensors[name] = testing::f32_tensor(shapes.at(name), values);
    testing::write_safetensors(dir + "/model.safetensors", tensors);
  }

  // HF hidden_states[0..layers] in float64, each [L, hidden]. `kv_head_of` maps a query head to
  // its key/value head (HF repeat_kv: h / (heads / kv_heads)).
  std::vector<std::vector<double>> forward(const std::vector<int32_t>& ids, int64_t num_valid,
                                           int64_t (*kv_head_of)(int64_t h, int64_t heads,
                                                                 int64_t kv_heads)) const {
    const int64_t seq = static_cast<int64_t>(ids.size()), d = hidden, half = head_dim / 2;
    auto W = [&](const std::string& name) { return weights.at(name).data(); };
    // y[s, o] = sum_i x[s, i] w[o, i]
    auto matmul = [&](const std::vector<double>& x, const float* w, int64_t in, int64_t out) {
      std::vector<double> y(static_cast<size_t>(seq * out), 0.0);
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i) y[s * out + o] += x[s * in + i] * w[o * in + i];
      return y;
    };
    auto rms_norm = [&](std::vector<double> x, const float* w, int64_t width) {
      for (size_t s = 0; s < x.size() / width; ++s) {
        double ms = 0.0;
        for (int64_t i = 0; i < width; ++i) ms += x[s * width + i] * x[s * width + i];
        const double r = 1.0 / std::sqrt(ms / width + eps);
        for (int64_t i = 0; i < width; ++i) x[s * width + i] *= r * w[i];
      }
      return x;
    };
    // Per-head norm then rotate_half RoPE at position s: pairs (m, m + half), angle s *
    // theta^(-2m/Dh).
    auto norm_rope = [&](std::vector<double> x, const float* w) {
      x = rms_norm(std::move(x), w, head_dim);
      for (size_t r = 0; r < x.size() / head_dim; ++r) {
        const int64_t s =
            static_cast<int64_t>(r) / (static_cast<int64_t>(x.size()) / head_dim / seq);
        double* v = &x[r * head_dim];
        for (int64_t m = 0; m < half; ++m) {
          const double angle = s * std::pow(theta, -2.0 * m / head_dim);
          const double a = v[m], b = v[m + half];
          v[m] = a * std::cos(angle) - b * std::sin(angle);
          v[m + half] = b * std::cos(angle) + a * std::sin(angle);
        }
      }
      return x;
    };

    std::vector<std::vector<double>> states;
    std::vector<double> x(static_cast<size_t>(seq * d));
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t i = 0; i < d; ++i) x[s * d + i] = W("model.embed_tokens.weight")[ids[s] * d + i];
    states.push_back(x);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const std::string p = absl::StrCat("model.layers.", layer, ".");
      const std::vector<double> normed = rms_norm(x, W(p + "input_layernorm.weight"), d);
      const std::vector<double> q =
          norm_rope(matmul(normed, W(p + "self_attn.q_proj.weight"), d, heads * head_dim),
                    W(p + "self_attn.q_norm.weight"));
      const std::vector<double> k =
          norm_rope(matmul(normed, W(p + "self_attn.k_proj.weight"), d, kv_heads * head_dim),
                    W(p + "self_attn.k_norm.weight"));
      const std::vector<double> v =
          matmul(normed, W(p + "self_attn.v_proj.weight"), d, kv_heads * head_dim);
      std::vector<double> attn(static_cast<size_t>(seq * heads * head_dim), 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = kv_head_of(h, heads, kv_heads);
        for (int64_t i = 0; i < seq; ++i) {
          std::vector<double> score;
          for (int64_t j = 0; j < seq; ++j) {
            if (j > i || j >= num_valid) continue;  // causal AND key padding mask
            double dot = 0.0;
            for (int64_t e = 0; e < head_dim; ++e) {
              dot += q[(i * heads + h) * head_dim + e] * k[(j * kv_heads + g) * head_dim + e];
            }
            score.push_back(dot / std::sqrt(static_cast<double>(head_dim)));
          }
          double max_score = -INFINITY, total = 0.0;
          for (double sc : score) max_score = std::max(max_score, sc);
          for (double& sc : score) total += (sc = std::exp(sc - max_score));
          for (size_t j = 0; j < score.size(); ++j) {
            for (int64_t e = 0; e < head_dim; ++e) {
              attn[(i * heads + h) * head_dim + e] +=
                  score[j] / total * v[(j * kv_heads + g) * head_dim + e];
            }
          }
        }
      }
      const std::vector<double> o =
          matmul(attn, W(p + "self_attn.o_proj.weight"), heads * head_dim, d);
      for (size_t n = 0; n < x.size(); ++n) x[n] += o[n];
      const std::vector<double> normed2 = rms_norm(x, W(p + "post_attention_layernorm.weight"), d);
      const std::vector<double> gate =
          matmul(normed2, W(p + "mlp.gate_proj.weight"), d, intermediate);
      const std::vector<double> up = matmul(normed2, W(p + "mlp.up_proj.weight"), d, intermediate);
      std::vector<double> act(gate.size());
      for (size_t n = 0; n < act.size(); ++n) act[n] = gate[n] / (1.0 + std::exp(-gate[n])) * up[n];
      const std::vector<double> down = matmul(act, W(p + "mlp.down_proj.weight"), intermediate, d);
      for (size_t n = 0; n < x.size(); ++n) x[n] += down[n];
      states.push_back(x);
    }
    return states;
  }
};

int64_t hf_kv_head(int64_t h, int64_t heads, int64_t kv_heads) {
  return h / (heads / kv_heads);
}
int64_t round_robin_kv_head(int64_t h, int64_t, int64_t kv_heads) {
  return h % kv_heads;
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

class TextEncoderTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<TextEncoder>> load(const std::string& dir,
                                                    std::vector<int64_t> taps) {
    auto weights = ComponentWeights::open(dir);
    if (!weights.ok()) return weights.status();
    return TextEncoder::load(backend_, *weights, std::move(taps));
  }
  // A writable copy of the tiny-klein text encoder with its tensors in memory for editing.
  void copy_tiny_klein() {
    dir_path_ = dir_.path() + "/text_encoder";
    testing::copy_tree(tiny_klein_encoder_dir(), dir_path_);
    tensors_ = testing::read_all_tensors(dir_path_ + "/model.safetensors");
  }
  void rewrite() { testing::write_safetensors(dir_path_ + "/model.safetensors", tensors_); }

  CpuBackend backend_;
  testing::TempDir dir_;
  std::string dir_path_;
  std::map<std::string, testing::RawTensor> tensors_;
};

// ---- config ------------------------------------------------------------------------------------

TEST(TextEncoderConfigTest, ReadsTinyKleinWithRopeParameters) {
  auto json = nlohmann::json::parse(std::ifstream(tiny_klein_encoder_dir() + "/config.json"));
  auto config = TextEncoderConfig::from_json(json, "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden_size, 32);
  EXPECT_EQ(config->num_hidden_layers, 28);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->intermediate_size, 64);
  EXPECT_EQ(config->vocab_size, 151936);
  EXPECT_EQ(config->rope_theta, 1e6);  // from rope_parameters.rope_theta
  EXPECT_EQ(config->rms_norm_eps, 1e-6);
}

TEST(TextEncoderConfigTest, TopLevelRopeThetaAndDerivedHeadDim) {
  nlohmann::json json = SyntheticQwen3().config();
  json["rope_theta"] = 5e5;
  json.erase("head_dim");
  auto config = TextEncoderConfig::from_json(json, "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_theta, 5e5);
  EXPECT_EQ(config->head_dim, 16 / 4);  // hidden / heads
}

TEST(TextEncoderConfigTest, UnsupportedSettingsNameTheField) {
  struct Case {
    const char* what;
    void (*edit)(nlohmann::json&);
    const char* field;
  };
  const Case cases[] = {
      {"attention bias", [](nlohmann::json& j) { j["attention_bias"] = true; },
       "\"attention_bias\""},
      {"sliding window", [](nlohmann::json& j) { j["use_sliding_window"] = true; },
       "\"use_sliding_window\""},
      {"sliding layer type",
       [](nlohmann::json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "\"layer_types\"[1]"},
      {"yarn rope",
       [](nlohmann::json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}};
       },
       "\"rope_parameters.rope_type\""},
      {"linear rope scaling (old style)",
       [](nlohmann::json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "\"rope_scaling.type\""},
      {"partial rotary",
       [](nlohmann::json& j) {
         j["rope_parameters"] = {{"partial_rotary_factor", 0.5}};
       },
       "\"rope_parameters.partial_rotary_factor\""},
      {"activation", [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, "\"hidden_act\""},
      {"model type", [](nlohmann::json& j) { j["model_type"] = "llama"; }, "\"model_type\""},
      {"kv heads", [](nlohmann::json& j) { j["num_key_value_heads"] = 3; },
       "\"num_key_value_heads\""},
      {"odd head dim", [](nlohmann::json& j) { j["head_dim"] = 7; }, "\"head_dim\""},
      {"missing hidden size", [](nlohmann::json& j) { j.erase("hidden_size"); }, "\"hidden_size\""},
      {"string layer count", [](nlohmann::json& j) { j["num_hidden_layers"] = "6"; },
       "\"num_hidden_layers\""},
  };
  for (const Case& c : cases) {
    nlohmann::json json = SyntheticQwen3().config();
    c.edit(json);
    auto config = TextEncoderConfig::from_json(json, "te/config.json");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(config.status().message(), HasSubstr("te/config.json")) << c.what;
    EXPECT_THAT(config.status().message(), HasSubstr(c.field)) << c.what;
  }
}

// ---- loading
// -------------------------------------------------------------------------------------

TEST_F(TextEncoderTest, BadTapsAreRejected) {
  for (const std::vector<int64_t>& taps :
       std::vector<std::vector<int64_t>>{{}, {0}, {-1, 9}, {29}, {9, 9}}) {
    auto model = load(tiny_klein_encoder_dir(), taps);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(model.status().message(), HasSubstr("tap"));
  }
}

TEST_F(TextEncoderTest, DeviceBytesCountOnlyTheNeededLayers) {
  auto model = load(tiny_klein_encoder_dir(), {2});
  ASSERT_TRUE(model.ok()) << model.status();
  const TextEncoderConfig& c = (*model)->config();
  const int64_t h = c.num_attention_heads, hkv = c.num_key_value_heads, dh = c.head_dim;
  const int64_t d = c.hidden_size, i = c.intermediate_size;
  const int64_t per_layer =
      (h + 2 * hkv) * dh * d + d * h * dh + 2 * i * d + d * i + 2 * dh + 2 * d;
  // The layers on the device; the embedding table in host memory (its rows are gathered there).
  EXPECT_EQ((*model)->device_bytes(), 2 * per_layer * dtype_size(backend_.weight_dtype()));
  EXPECT_EQ((*model)->host_bytes(), c.vocab_size * d * dtype_size(backend_.weight_dtype()));
}

TEST_F(TextEncoderTest, LaterLayersAreNotRead) {
  copy_tiny_klein();
  // Layer 5 gets shapes that contradict the config (same byte size, so the file stays valid).
  tensors_["model.layers.5.self_attn.q_proj.weight"].shape = {32, 64};
  tensors_["model.layers.5.mlp.down_proj.weight"].shape = {64, 32};
  rewrite();
  auto shallow = load(dir_path_, {2, 5});
  EXPECT_TRUE(shallow.ok()) << shallow.status();
  auto deep = load(dir_path_, {9});
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(deep.status().message(),
              HasSubstr("model.layers.5.self_attn.q_proj.weight is [32, 64], expected [64, 32]"));
  EXPECT_THAT(deep.status().message(),
              HasSubstr("model.layers.5.mlp.down_proj.weight is [64, 32], expected [32, 64]"));
}

TEST_F(TextEncoderTest, MissingNeededTensorIsNamed) {
  copy_tiny_klein();
  tensors_.erase("model.layers.1.self_attn.k_norm.weight");
  rewrite();
  auto model = load(dir_path_, {2});
  EXPECT_THAT(model.status().message(),
              HasSubstr("missing tensors: model.layers.1.self_attn.k_norm.weight"));
}

TEST_F(TextEncoderTest, UnknownTensorInASkippedLayerIsStillAnError) {
  copy_tiny_klein();
  auto node = tensors_.extract("model.layers.3.self_attn.q_proj.weight");
  node.key() = "model.layers.3.self_attn.q_proj.weightX";
  tensors_.insert(std::move(node));
  rewrite();
  auto model = load(dir_path_, {2});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr("unexpected tensors: model.layers.3.self_attn.q_proj.weightX"));
}

TEST(Qwen3UnusedTensorsTest, AcceptsExactlyTheSkippedCategories) {
  TextEncoderConfig config;
  config.num_hidden_layers = 28;
  const UnusedTensorFilter unused = text_encoder_unused_tensors(config, 9);
  for (const char* name :
       {"model.norm.weight", "lm_head.weight", "model.layers.9.self_attn.q_proj.weight",
        "model.layers.27.mlp.down_proj.weight", "model.layers.12.input_layernorm.weight",
        "model.layers.20.self_attn.k_norm.weight"}) {
    EXPECT_TRUE(unused(name)) << name;
  }
  for (const char* name :
       {"model.layers.8.self_attn.q_proj.weight",   // a needed layer is never "unused"
        "model.layers.28.self_attn.q_proj.weight",  // beyond num_hidden_layers
        "model.layers.12.self_attn.q_proj.weightX", "model.layers.12.self_attn.q_proj.bias",
        "model.layers.012.self_attn.q_proj.weight", "model.layers.+12.self_attn.q_proj.weight",
        "model.layers.x.self_attn.q_proj.weight", "model.layers.12", "model.layers.",
        "model.norm.bias", "model.embed_tokens.weight", "lm_head.weightX",
        "layers.12.mlp.up_proj.weight"}) {
    EXPECT_FALSE(unused(name)) << name;
  }
}

// ---- forward
// -------------------------------------------------------------------------------------

class Qwen3ForwardTest : public TextEncoderTest {
 protected:
  void SetUp() override {
    model_dir_ = dir_.path() + "/synthetic";
    synthetic_.write(model_dir_);
  }
  SyntheticQwen3 synthetic_;
  std::string model_dir_;
  // 9 tokens, the last 3 padding (id 0 like a pad token would be).
  const std::vector<int32_t> ids_ = {5, 17, 3, 39, 22, 8, 0, 0, 0};
  const int64_t num_valid_ = 6;
};

TEST_F(Qwen3ForwardTest, MatchesNaiveForwardAndStacksTapsInOrder) {
  const std::vector<int64_t> taps = {
      4, 2, 6};  // deliberately not sorted: column blocks follow this order
  auto model = load(model_dir_, taps);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> tapped;
  std::map<std::string, std::vector<float>> tap_values;
  auto tap = [&](absl::string_view name, const Tensor& value) {
    tapped.emplace_back(name);
    tap_values[std::string(name)] = download(backend_, value);
  };
  auto embeds = (*model)->encode(ids_, num_valid_, tap);
  ASSERT_TRUE(embeds.ok()) << embeds.status();
  const int64_t d = synthetic_.hidden, seq = static_cast<int64_t>(ids_.size());
  ASSERT_EQ(embeds->rows(), seq);
  ASSERT_EQ(embeds->cols(), 3 * d);
  EXPECT_THAT(tapped,
              ::testing::ElementsAre("hidden_states.2", "hidden_states.4", "hidden_states.6"));

  const auto reference = synthetic_.forward(ids_, num_valid_, hf_kv_head);
  const std::vector<float> stacked = download(backend_, *embeds);
  for (size_t c = 0; c < taps.size(); ++c) {
    const std::vector<float> expected = to_float(reference[taps[c]]);
    const double norm_check =
        relative_l2_error(std::vector<float>(expected.size(), 0.0f), expected);
    ASSERT_EQ(norm_check, 1.0);  // the reference is not all zeros
    EXPECT_LE(relative_l2_error(columns(stacked, 3 * d, c * d, d), expected), kFloat32Tolerance)
        << "column block " << c << " (tap " << taps[c] << ")";
    EXPECT_LE(relative_l2_error(tap_values[absl::StrCat("hidden_states.", taps[c])], expected),
              kFloat32Tolerance);
  }
  // Neighbouring layers differ by far more than the tolerance, so a block holding the wrong layer
  // fails.
  EXPECT_GT(relative_l2_error(columns(stacked, 3 * d, 0, d), to_float(reference[2])), 1e-2);
}

TEST_F(Qwen3ForwardTest, QueryHeadsShareKvHeadsInConsecutiveGroups) {
  auto model = load(model_dir_, {6});
  ASSERT_TRUE(model.ok()) << model.status();
  auto embeds = (*model)->encode(ids_, num_valid_);
  ASSERT_TRUE(embeds.ok()) << embeds.status();
  const std::vector<float> out = download(backend_, *embeds);
  // HF repeat_kv: query heads 0,1 read kv head 0 and 2,3 read kv head 1 (h / (H / Hkv)).
  const std::vector<float> grouped = to_float(synthetic_.forward(ids_, num_valid_, hf_kv_head)[6]);
  const std::vector<float> round_robin =
      to_float(synthetic_.forward(ids_, num_valid_, round_robin_kv_head)[6]);
  EXPECT_LE(relative_l2_error(out, grouped), kFloat32Tolerance);
  EXPECT_GT(relative_l2_error(out, round_robin), 1e-2);  // the mapping matters for these weights
}

TEST_F(Qwen3ForwardTest, ValidRowsIgnorePaddingIds) {
  auto model = load(model_dir_, {3, 6});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> other_pads = ids_;
  for (int64_t i = num_valid_; i < static_cast<int64_t>(ids_.size()); ++i) other_pads[i] = 31;
  auto a = (*model)->encode(ids_, num_valid_);
  auto b = (*model)->encode(other_pads, num_valid_);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t width = 2 * synthetic_.hidden;
  // Exact: every op computes a valid row from that row and from valid keys only, in the same order.
  EXPECT_EQ(rows(download(backend_, *a), width, 0, num_valid_),
            rows(download(backend_, *b), width, 0, num_valid_));
  EXPECT_NE(rows(download(backend_, *a), width, num_valid_, 3),
            rows(download(backend_, *b), width, num_valid_, 3));
}

TEST_F(Qwen3ForwardTest, BadInputsAreRejected) {
  auto model = load(model_dir_, {2});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->encode({}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->encode(ids_, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->encode(ids_, 10).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = ids_;
  bad[2] = 40;  // vocab is 40
  auto status = (*model)->encode(bad, num_valid_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("position 2"));
}

// The golden pad rows (right padding; they attend to every real token before them) on their own,
// so a pad-row mistake cannot hide behind the valid rows in the whole-tensor check-golden error.
TEST_F(TextEncoderTest, TinyKleinPaddingRowsMatchGolden) {
  auto model = load(tiny_klein_encoder_dir(), {9, 18, 27});
  ASSERT_TRUE(model.ok()) << model.status();
  auto vectors =
      SafetensorsFile::open(testing::test_data_dir() + "/tiny-klein/text_encoder.safetensors");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  for (int c = 0; c < 3; ++c) {
    const std::string p = absl::StrCat("case", c, ".");
    const std::vector<float> id_values = read_f32(**vectors, p + "input_ids").value();
    const std::vector<float> mask = read_f32(**vectors, p + "attention_mask").value();
    int64_t num_valid = 0;
    for (float m : mask) num_valid += m == 1.0f;
    const int64_t seq = static_cast<int64_t>(id_values.size()), d = (*model)->config().hidden_size;
    ASSERT_LT(num_valid, seq) << "case " << c << " has no padding";
    std::map<std::string, std::vector<float>> taps;
    auto tap = [&](absl::string_view name, const Tensor& value) {
      taps[std::string(name)] = download(backend_, value);
    };
    auto embeds =
        (*model)->encode(std::vector<int32_t>(id_values.begin(), id_values.end()), num_valid, tap);
    ASSERT_TRUE(embeds.ok()) << embeds.status();
    for (const char* name : {"hidden_states.9", "hidden_states.18", "hidden_states.27"}) {
      const std::vector<float> golden = read_f32(**vectors, p + name).value();
      EXPECT_LE(relative_l2_error(rows(taps[name], d, num_valid, seq - num_valid),
                                  rows(golden, d, num_valid, seq - num_valid)),
                kFloat32Tolerance)
          << p << name << " padding rows";
      EXPECT_LE(relative_l2_error(rows(taps[name], d, 0, num_valid), rows(golden, d, 0, num_valid)),
                kFloat32Tolerance)
          << p << name << " valid rows";
    }
  }
}

}  // namespace
}  // namespace flux2
