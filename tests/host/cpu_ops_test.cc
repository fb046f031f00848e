// CPU backend ops against plain double-precision loops written independently here.
// Tolerance: relative L2 error <= 1e-5. Derivation (a bound from norms and epsilon): float32 sums
// of K <= 576 products have a worst-case relative error near K x 2^-24 ≈ 3e-5 and a typical
// (random-walk) error near sqrt(K) x 2^-24 ≈ 1.5e-6 over a whole tensor; 1e-5 sits between the two.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {
namespace {

constexpr double kTolerance = 1e-5;

class CpuOpsTest : public ::testing::Test {
 protected:
  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng_);
    return v;
  }
  Tensor make(const std::vector<float>& values, Shape shape) {
    Tensor t = be_.empty(DType::kF32, std::move(shape)).value();
    EXPECT_TRUE(be_.upload(values.data(), DType::kF32, t).ok());
    return t;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(be_.download(t, v.data()).ok());
    return v;
  }
  static double norm(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s);
  }
  CpuBackend be_;
  std::mt19937 rng_{1234};
};

TEST_F(CpuOpsTest, LinearIntoColumnSliceWithBias) {
  const int64_t m = 7, k = 33, n = 5;
  const auto x = random(m * k), w = random(n * k), b = random(n);
  Tensor wide = make(std::vector<float>(m * 12, -7.0f), {m, 12});
  ASSERT_TRUE(
      be_.linear(make(x, {m, k}), make(w, {n, k}), make(b, {n}), wide.col_slice(4, n)).ok());
  const auto got = get(wide);
  std::vector<float> out, ref;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < 12; ++j) {
      if (j < 4 || j >= 4 + n) {
        EXPECT_EQ(got[i * 12 + j], -7.0f) << "wrote outside the slice";  // guard band
        continue;
      }
      double acc = b[j - 4];
      for (int64_t c = 0; c < k; ++c) acc += double(x[i * k + c]) * w[(j - 4) * k + c];
      out.push_back(got[i * 12 + j]);
      ref.push_back(static_cast<float>(acc));
    }
  }
  EXPECT_GT(norm(ref), 1.0);
  EXPECT_LE(relative_l2_error(out, ref), kTolerance);
}

TEST_F(CpuOpsTest, LinearRejectsMismatchedShapes) {
  Tensor x = make(random(6), {2, 3}), w = make(random(8), {2, 4}), y = make(random(4), {2, 2});
  const absl::Status status = be_.linear(x, w, {}, y);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("linear: w"), std::string::npos) << status;
}

// Reference attention: per head, softmax over allowed keys, all in double.
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, int64_t sq, int64_t sk,
                                   const AttentionParams& p) {
  const int64_t h = p.num_heads, hk = p.num_kv_heads, d = p.head_dim;
  std::vector<float> out(static_cast<size_t>(sq * h * d));
  const int64_t valid = p.num_valid_keys < 0 ? sk : p.num_valid_keys;
  for (int64_t head = 0; head < h; ++head) {
    const int64_t kvh = head / (h / hk);
    for (int64_t i = 0; i < sq; ++i) {
      std::vector<double> s;
      for (int64_t j = 0; j < sk; ++j) {
        if (j >= valid || (p.causal && j > i)) {
          s.push_back(-INFINITY);
          continue;
        }
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += double(q[(i * h + head) * d + c]) * k[(j * hk + kvh) * d + c];
        s.push_back(dot * p.scale);
      }
      double mx = -INFINITY, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < sk; ++j) acc += s[j] / sum * v[(j * hk + kvh) * d + c];
        out[(i * h + head) * d + c] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

TEST_F(CpuOpsTest, AttentionMatchesNaive) {
  struct Case {
    int64_t s, h, hk, d;
    bool causal;
    int64_t valid;
  };
  for (const Case c : {Case{17, 3, 3, 32, false, -1}, Case{24, 4, 2, 16, true, 19},
                       Case{9, 2, 1, 64, true, -1}, Case{5, 1, 1, 512, false, -1}}) {
    const auto q = random(c.s * c.h * c.d), k = random(c.s * c.hk * c.d),
               v = random(c.s * c.hk * c.d);
    const AttentionParams p{c.h,      c.hk,   c.d, static_cast<float>(1.0 / std::sqrt(double(c.d))),
                            c.causal, c.valid};
    Tensor out = be_.empty(DType::kF32, {c.s, c.h * c.d}).value();
    ASSERT_TRUE(be_.attention(make(q, {c.s, c.h * c.d}), make(k, {c.s, c.hk * c.d}),
                              make(v, {c.s, c.hk * c.d}), p, out)
                    .ok());
    const auto ref = naive_attention(q, k, v, c.s, c.s, p);
    EXPECT_LE(relative_l2_error(get(out), ref), kTolerance) << "S=" << c.s << " H=" << c.h;
  }
}

TEST_F(CpuOpsTest, Conv2dMatchesDirectLoop) {
  for (int64_t ksize : {1, 3}) {
    const int64_t hgt = 5, wid = 7, cin = 6, cout = 4, pad = ksize / 2;
    const auto x = random(hgt * wid * cin), w = random(cout * ksize * ksize * cin),
               b = random(cout);
    Tensor out = be_.empty(DType::kF32, {hgt, wid, cout}).value();
    ASSERT_TRUE(be_.conv2d(make(x, {hgt, wid, cin}), make(w, {cout, ksize, ksize, cin}),
                           make(b, {cout}), out)
                    .ok());
    std::vector<float> ref(static_cast<size_t>(hgt * wid * cout));
    for (int64_t y = 0; y < hgt; ++y)
      for (int64_t xx = 0; xx < wid; ++xx)
        for (int64_t o = 0; o < cout; ++o) {
          double acc = b[o];
          for (int64_t ky = 0; ky < ksize; ++ky)
            for (int64_t kx = 0; kx < ksize; ++kx) {
              const int64_t sy = y + ky - pad, sx = xx + kx - pad;
              if (sy < 0 || sy >= hgt || sx < 0 || sx >= wid) continue;
              for (int64_t i = 0; i < cin; ++i)
                acc += double(x[(sy * wid + sx) * cin + i]) *
                       w[((o * ksize + ky) * ksize + kx) * cin + i];
            }
          ref[(y * wid + xx) * cout + o] = static_cast<float>(acc);
        }
    EXPECT_LE(relative_l2_error(get(out), ref), kTolerance) << "k=" << ksize;
    // conv2d_add (the resnet's shortcut add) is the convolution, then the add: the same floats.
    const auto r = random(hgt * wid * cout);
    Tensor sum = be_.empty(DType::kF32, {hgt, wid, cout}).value();
    ASSERT_TRUE(be_.conv2d_add(make(x, {hgt, wid, cin}), make(w, {cout, ksize, ksize, cin}),
                               make(b, {cout}), make(r, {hgt, wid, cout}), sum)
                    .ok());
    const std::vector<float> conv = get(out), added = get(sum);
    for (size_t i = 0; i < added.size(); ++i)
      EXPECT_EQ(added[i], r[i] + conv[i]) << "k=" << ksize << " i=" << i;
  }
}

// Downsample2D: zero row and column appended at the bottom and right, 3x3, stride 2.
TEST_F(CpuOpsTest, Conv2dDownsampleMatchesDirectLoop) {
  const int64_t hgt = 6, wid = 8, cin = 5, cout = 3;
  const auto x = random(hgt * wid * cin), w = random(cout * 9 * cin), b = random(cout);
  Tensor out = be_.empty(DType::kF32, {hgt / 2, wid / 2, cout}).value();
  ASSERT_TRUE(be_.conv2d_downsample(make(x, {hgt, wid, cin}), make(w, {cout, 3, 3, cin}),
                                    make(b, {cout}), out)
                  .ok());
  std::vector<float> ref(static_cast<size_t>(hgt / 2 * wid / 2 * cout));
  for (int64_t y = 0; y < hgt / 2; ++y)
    for (int64_t xx = 0; xx < wid / 2; ++xx)
      for (int64_t o = 0; o < cout; ++o) {
        double acc = b[o];
        for (int64_t ky = 0; ky < 3; ++ky)
          for (int64_t kx = 0; kx < 3; ++kx) {
            const int64_t sy = 2 * y + ky, sx = 2 * xx + kx;  // padding (0, 1, 0, 1)
            if (sy >= hgt || sx >= wid) continue;
            for (int64_t i = 0; i < cin; ++i)
              acc += double(x[(sy * wid + sx) * cin + i]) * w[((o * 3 + ky) * 3 + kx) * cin + i];
          }
        ref[(y * wid / 2 + xx) * cout + o] = static_cast<float>(acc);
      }
  EXPECT_LE(relative_l2_error(get(out), ref), kTolerance);
  // Odd sides and a wrong output size are refused.
  Tensor odd = be_.empty(DType::kF32, {2, 4, cout}).value();
  EXPECT_FALSE(be_.conv2d_downsample(make(random(5 * 8 * cin), {5, 8, cin}),
                                     make(w, {cout, 3, 3, cin}), make(b, {cout}), odd)
                   .ok());
}

TEST_F(CpuOpsTest, LayerNormModulate) {
  const int64_t m = 5, d = 48;
  const auto x = random(m * d, 3.0f), shift = random(d), scale = random(d);
  Tensor out = be_.empty(DType::kF32, {m, d}).value();
  ASSERT_TRUE(
      be_.layer_norm_modulate(make(x, {m, d}), make(shift, {d}), make(scale, {d}), 1e-6f, out)
          .ok());
  std::vector<float> ref;
  for (int64_t r = 0; r < m; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < d; ++c) mean += x[r * d + c] / double(d);
    for (int64_t c = 0; c < d; ++c)
      var += (x[r * d + c] - mean) * (x[r * d + c] - mean) / double(d);
    for (int64_t c = 0; c < d; ++c)
      ref.push_back(static_cast<float>(
          (1 + scale[c]) * (x[r * d + c] - mean) / std::sqrt(var + 1e-6) + shift[c]));
  }
  EXPECT_LE(relative_l2_error(get(out), ref), kTolerance);
}

TEST_F(CpuOpsTest, QkNormRopeBothStyles) {
  const int64_t s = 6, heads = 2, dh = 8;
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const auto x = random(s * heads * dh), w = random(dh), cs = random(s * dh), sn = random(s * dh);
    Tensor t = make(x, {s, heads * dh});
    ASSERT_TRUE(
        be_.qk_norm_rope(t, dh, make(w, {dh}), 1e-6f, make(cs, {s, dh}), make(sn, {s, dh}), style)
            .ok());
    std::vector<float> ref;
    for (int64_t r = 0; r < s; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = &x[(r * heads + h) * dh];
        double ms = 0;
        for (int64_t d = 0; d < dh; ++d) ms += double(v[d]) * v[d] / dh;
        std::vector<double> n(dh);
        for (int64_t d = 0; d < dh; ++d) n[d] = v[d] / std::sqrt(ms + 1e-6) * w[d];
        for (int64_t d = 0; d < dh; ++d) {
          double rot;
          if (style == RopeStyle::kInterleaved)
            rot = d % 2 == 0 ? -n[d + 1] : n[d - 1];
          else
            rot = d < dh / 2 ? -n[d + dh / 2] : n[d - dh / 2];
          ref.push_back(static_cast<float>(n[d] * cs[r * dh + d] + rot * sn[r * dh + d]));
        }
      }
    EXPECT_LE(relative_l2_error(get(t), ref), kTolerance);
  }
}

// Backend::normed_attention's default: qk_norm_rope on each row range with its weights, then
// attention, bit for bit; a split outside the rows is an error naming it.
TEST_F(CpuOpsTest, NormedAttentionIsTheNormsThenAttention) {
  const int64_t s = 7, heads = 2, dh = 8, split = 3;
  const auto x = random(3 * s * heads * dh), cs = random(s * dh), sn = random(s * dh);
  const std::vector<float> weights[4] = {random(dh), random(dh), random(dh), random(dh)};
  const QkNormRope norm{{make(weights[0], {dh}), make(weights[1], {dh})},
                        {make(weights[2], {dh}), make(weights[3], {dh})},
                        split,
                        1e-6f,
                        make(cs, {s, dh}),
                        make(sn, {s, dh}),
                        RopeStyle::kInterleaved};
  const AttentionParams params{heads, heads, dh, 0.35f};
  auto split_rows = [&](const Tensor& fused) {
    return std::vector<Tensor>{fused.col_slice(0, heads * dh),
                               fused.col_slice(heads * dh, heads * dh),
                               fused.col_slice(2 * heads * dh, heads * dh)};
  };
  Tensor fused = make(x, {s, 3 * heads * dh}), again = make(x, {s, 3 * heads * dh});
  Tensor out = be_.empty(DType::kF32, {s, heads * dh}).value(),
         want = be_.empty(DType::kF32, {s, heads * dh}).value();
  const std::vector<Tensor> a = split_rows(fused), b = split_rows(again);
  ASSERT_TRUE(be_.normed_attention(a[0], a[1], a[2], norm, params, out).ok());
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : split, count = part == 0 ? split : s - split;
    for (int which = 0; which < 2; ++which) {
      ASSERT_TRUE(be_.qk_norm_rope(b[which].row_slice(first, count), dh,
                                   which == 0 ? norm.q_weight[part] : norm.k_weight[part], norm.eps,
                                   norm.cos.row_slice(first, count),
                                   norm.sin.row_slice(first, count), norm.style)
                      .ok());
    }
  }
  ASSERT_TRUE(be_.attention(b[0], b[1], b[2], params, want).ok());
  EXPECT_EQ(get(out), get(want));
  QkNormRope bad = norm;
  bad.split = s + 1;
  const absl::Status status = be_.normed_attention(a[0], a[1], a[2], bad, params, out);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("split"), std::string::npos) << status;
}

TEST_F(CpuOpsTest, SwigluLinearIsSwigluThenLinear) {
  // x = [prefix | act]: the prefix is read as it is, act receives swiglu(gate, up).
  const int64_t m = 5, prefix = 3, f = 4, n = 6;
  const auto x = random(m * (prefix + f)), mlp = random(m * 2 * f), w = random(n * (prefix + f));
  Tensor gate_up = make(mlp, {m, 2 * f}), weight = make(w, {n, prefix + f});
  const Tensor gate = gate_up.col_slice(0, f), up = gate_up.col_slice(f, f);
  Tensor fused_in = make(x, {m, prefix + f}), eager_in = make(x, {m, prefix + f});
  Tensor out = be_.empty(DType::kF32, {m, n}).value(),
         want = be_.empty(DType::kF32, {m, n}).value();
  ASSERT_TRUE(be_.swiglu_linear(gate, up, fused_in, weight, out, nullptr).ok());
  ASSERT_TRUE(be_.swiglu(gate, up, eager_in.col_slice(prefix, f)).ok());
  ASSERT_TRUE(be_.linear(eager_in, weight, {}, want).ok());
  EXPECT_EQ(get(out), get(want));
  // With the gated residual: the stream receives gate_residual's result.
  const auto stream_values = random(m * n), gate_values = random(n);
  Tensor stream = make(stream_values, {m, n}), want_stream = make(stream_values, {m, n});
  const GatedResidual residual{stream, make(gate_values, {n})};
  ASSERT_TRUE(be_.swiglu_linear(gate, up, fused_in, weight, out, &residual).ok());
  ASSERT_TRUE(be_.gate_residual(want_stream, residual.gate, want).ok());
  EXPECT_EQ(get(stream), get(want_stream));
  const absl::Status status =
      be_.swiglu_linear(gate, up, fused_in.col_slice(0, f - 1), weight, out, nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("gate's rows"), std::string::npos) << status;
}

TEST_F(CpuOpsTest, LayerNormModulateLinearIsTheNormThenTheLinear) {
  const int64_t m = 5, d = 8, n = 3;
  const auto x = random(m * d), shift = random(d), scale = random(d), w = random(n * d);
  Tensor normed = be_.empty(DType::kF32, {m, d}).value(),
         want_normed = be_.empty(DType::kF32, {m, d}).value();
  Tensor out = be_.empty(DType::kF32, {m, n}).value(),
         want = be_.empty(DType::kF32, {m, n}).value();
  ASSERT_TRUE(be_.layer_norm_modulate_linear(make(x, {m, d}), make(shift, {d}), make(scale, {d}),
                                             1e-6f, normed, make(w, {n, d}), out)
                  .ok());
  ASSERT_TRUE(be_.layer_norm_modulate(make(x, {m, d}), make(shift, {d}), make(scale, {d}), 1e-6f,
                                      want_normed)
                  .ok());
  ASSERT_TRUE(be_.linear(want_normed, make(w, {n, d}), {}, want).ok());
  EXPECT_EQ(get(out), get(want));
}

TEST_F(CpuOpsTest, GroupNormSilu) {
  const int64_t p = 20, c = 12, groups = 3;
  const auto x = random(p * c, 2.0f), gamma = random(c), beta = random(c);
  Tensor out = be_.empty(DType::kF32, {p, c}).value();
  ASSERT_TRUE(
      be_.group_norm(make(x, {p, c}), groups, make(gamma, {c}), make(beta, {c}), 1e-6f, true, out)
          .ok());
  std::vector<float> ref(static_cast<size_t>(p * c));
  const int64_t per = c / groups;
  for (int64_t g = 0; g < groups; ++g) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < p; ++i)
      for (int64_t k = 0; k < per; ++k) mean += x[i * c + g * per + k];
    mean /= double(p * per);
    for (int64_t i = 0; i < p; ++i)
      for (int64_t k = 0; k < per; ++k) var += std::pow(x[i * c + g * per + k] - mean, 2);
    var /= double(p * per);
    for (int64_t i = 0; i < p; ++i)
      for (int64_t k = 0; k < per; ++k) {
        const int64_t ch = g * per + k;
        const double y = (x[i * c + ch] - mean) / std::sqrt(var + 1e-6) * gamma[ch] + beta[ch];
        ref[i * c + ch] = static_cast<float>(y / (1 + std::exp(-y)));
      }
  }
  EXPECT_LE(relative_l2_error(get(out), ref), kTolerance);
}

TEST_F(CpuOpsTest, LatentUnpackIsBatchNormThenUnpatchify) {
  const int64_t h = 2, w = 3, c = 2;  // tokens [6, 8] -> image [4, 6, 2]
  const auto tokens = random(h * w * 4 * c), mean = random(4 * c);
  std::vector<float> var(4 * c);
  for (int64_t i = 0; i < 4 * c; ++i) var[i] = 0.5f + 0.1f * i;
  Tensor out = be_.empty(DType::kF32, {2 * h, 2 * w, c}).value();
  ASSERT_TRUE(be_.latent_unpack(make(tokens, {h * w, 4 * c}), make(mean, {4 * c}),
                                make(var, {4 * c}), 1e-4f, out)
                  .ok());
  const auto got = get(out);
  for (int64_t y = 0; y < 2 * h; ++y)
    for (int64_t x = 0; x < 2 * w; ++x)
      for (int64_t ch = 0; ch < c; ++ch) {
        const int64_t packed = ch * 4 + (y % 2) * 2 + (x % 2);  // c·4 + dy·2 + dx
        const int64_t token = (y / 2) * w + (x / 2);
        const double expected =
            tokens[token * 4 * c + packed] * std::sqrt(var[packed] + 1e-4) + mean[packed];
        EXPECT_NEAR(got[(y * 2 * w + x) * c + ch], expected, 1e-6) << y << "," << x << "," << ch;
      }
}

// latent_pack reads the first C channels of [mean | logvar] and inverts latent_unpack.
TEST_F(CpuOpsTest, LatentPackInvertsUnpack) {
  const int64_t h = 2, w = 3, c = 2;
  const auto tokens = random(h * w * 4 * c);
  const auto mean = random(4 * c);
  std::vector<float> var(4 * c);
  for (int64_t i = 0; i < 4 * c; ++i) var[i] = 0.5f + 0.1f * i;
  Tensor unpacked = be_.empty(DType::kF32, {2 * h, 2 * w, c}).value();
  ASSERT_TRUE(be_.latent_unpack(make(tokens, {h * w, 4 * c}), make(mean, {4 * c}),
                                make(var, {4 * c}), 1e-4f, unpacked)
                  .ok());
  // Moments [2h, 2w, 2C]: the unpacked mean, then junk log-variances the pack must ignore.
  const auto means = get(unpacked);
  std::vector<float> moments(static_cast<size_t>(4 * h * w * 2 * c), 99.0f);
  for (int64_t p = 0; p < 4 * h * w; ++p)
    for (int64_t ch = 0; ch < c; ++ch) moments[p * 2 * c + ch] = means[p * c + ch];
  Tensor packed = be_.empty(DType::kF32, {h * w, 4 * c}).value();
  ASSERT_TRUE(be_.latent_pack(make(moments, {2 * h, 2 * w, 2 * c}), make(mean, {4 * c}),
                              make(var, {4 * c}), 1e-4f, packed)
                  .ok());
  const auto got = get(packed);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], tokens[i], 1e-5) << i;
}

TEST_F(CpuOpsTest, ElementwiseOps) {
  const int64_t m = 4, d = 10;
  const auto a = random(m * d), b = random(m * d), g = random(d);
  // gate_residual: x += g * u
  Tensor x = make(a, {m, d});
  ASSERT_TRUE(be_.gate_residual(x, make(g, {d}), make(b, {m, d})).ok());
  auto got = get(x);
  for (int64_t i = 0; i < m * d; ++i) EXPECT_FLOAT_EQ(got[i], a[i] + g[i % d] * b[i]);
  // swiglu
  Tensor out = be_.empty(DType::kF32, {m, d}).value();
  ASSERT_TRUE(be_.swiglu(make(a, {m, d}), make(b, {m, d}), out).ok());
  got = get(out);
  for (int64_t i = 0; i < m * d; ++i)
    EXPECT_NEAR(got[i], a[i] / (1 + std::exp(-a[i])) * b[i], 1e-6);
  // cfg_combine and euler_step
  ASSERT_TRUE(be_.cfg_combine(make(a, {m, d}), make(b, {m, d}), 4.0f, out).ok());
  got = get(out);
  for (int64_t i = 0; i < m * d; ++i) EXPECT_NEAR(got[i], a[i] + 4.0f * (b[i] - a[i]), 1e-5);
  Tensor s = make(a, {m, d});
  ASSERT_TRUE(be_.euler_step(s, make(b, {m, d}), -0.25f).ok());
  got = get(s);
  for (int64_t i = 0; i < m * d; ++i) EXPECT_FLOAT_EQ(got[i], a[i] + -0.25f * b[i]);
}

TEST_F(CpuOpsTest, UpsampleNearest2x) {
  const auto x = random(2 * 3 * 4);
  Tensor up = be_.empty(DType::kF32, {4, 6, 4}).value();
  ASSERT_TRUE(be_.upsample_nearest_2x(make(x, {2, 3, 4}), up).ok());
  const auto got = get(up);
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t xx = 0; xx < 6; ++xx)
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_EQ(got[(y * 6 + xx) * 4 + c], x[((y / 2) * 3 + xx / 2) * 4 + c]);
}

// quality=high on the CPU backend emulates the CUDA backend's FP8 formats (cpu_fp8.h): the
// reference of the quality=high bounds. Against a double-precision product of operands quantized
// here with the E4M3 conversions of fp8_nvfp4.h (per row of x, per row of w, scale = amax / 448):
// the float32 sgemm of the same E4M3 values stays within the float32 bound above.
TEST_F(CpuOpsTest, Fp8LinearEqualsTheProductOfE4m3Operands) {
  const int64_t m = 9, k = 64, n = 12;
  const auto x = random(m * k, 3.0f), w = random(n * k, 0.2f);
  auto quantized = [](std::vector<float> v, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
      const float scale = fp8_dequant_scale(amax);
      for (int64_t c = 0; c < cols; ++c) {
        v[r * cols + c] = e4m3_to_f32(fp8_quantize_value(v[r * cols + c], scale)) * scale;
      }
    }
    return v;
  };
  const std::vector<float> xq = quantized(x, m, k), wq = quantized(w, n, k);
  Weight weight = make(w, {n, k});
  auto low = be_.add_fp8_weight(weight.tensor);
  ASSERT_TRUE(low.ok()) << low.status();
  weight.low_precision = *low;
  Tensor y = be_.empty(DType::kF32, {m, n}).value(), plain = be_.empty(DType::kF32, {m, n}).value();
  {
    const RequestScope high(be_, {Quality::kHigh});
    ASSERT_TRUE(be_.linear(make(x, {m, k}), weight, {}, y).ok());
  }
  ASSERT_TRUE(be_.linear(make(x, {m, k}), weight, {}, plain).ok());  // lossless: the values
  std::vector<float> ref(static_cast<size_t>(m * n)), exact(ref.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0, full = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        acc += double(xq[i * k + c]) * wq[j * k + c];
        full += double(x[i * k + c]) * w[j * k + c];
      }
      ref[i * n + j] = static_cast<float>(acc);
      exact[i * n + j] = static_cast<float>(full);
    }
  }
  EXPECT_LE(relative_l2_error(get(y), ref), kTolerance);
  EXPECT_LE(relative_l2_error(get(plain), exact), kTolerance) << "lossless used the FP8 copy";
  // E4M3 keeps 3 mantissa bits: each operand within 2^-4 relative, so the product within ~2^-3.
  const double fp8_error = relative_l2_error(get(y), exact);
  EXPECT_GT(fp8_error, 1e-3);
  EXPECT_LE(fp8_error, 0.125);
  EXPECT_FALSE(be_.add_fp8_weight(make(random(4 * 12), {4, 12})).ok()) << "K % 16 != 0";
}

// The transformer's attention at quality=high takes E4M3 operands (per head and 128 tokens) and
// E4M3 probabilities: a few percent from the float32 one (3 mantissa bits on Q, K, V and P), while
// causal attention (the text encoder's, which the FP8 kernel does not serve) stays as it is.
TEST_F(CpuOpsTest, Fp8AttentionOnlyForTheTransformersAttention) {
  const int64_t s = 200, heads = 2, d = 32;
  const auto q = random(s * heads * d), k = random(s * heads * d), v = random(s * heads * d);
  const Tensor tq = make(q, {s, heads * d}), tk = make(k, {s, heads * d}),
               tv = make(v, {s, heads * d});
  auto run = [&](Quality quality, bool causal) {
    Tensor out = be_.empty(DType::kF32, {s, heads * d}).value();
    const RequestScope request(be_, {quality});
    AttentionParams p{heads, heads, d, 1.0f / std::sqrt(float(d)), causal};
    EXPECT_TRUE(be_.attention(tq, tk, tv, p, out).ok());
    return get(out);
  };
  const double error =
      relative_l2_error(run(Quality::kHigh, false), run(Quality::kLossless, false));
  EXPECT_GT(error, 1e-3);
  EXPECT_LE(error, 0.125);
  EXPECT_EQ(run(Quality::kHigh, true), run(Quality::kLossless, true));
}

}  // namespace
}  // namespace flux2
