// The op cases of gpu_op_test (harness: op_harness.h), at the real FLUX.2 shapes (klein-4B D=3072
// F=9216, klein-9B D=4096, dev D=6144; 4608 = 4096 image + 512 text tokens) and awkward ones (17
// text tokens, odd token counts, single rows, strided column slices of the fused buffers the model
// passes). Adding an op or a shape is one add(). The main: `gpu_op_test [--perf] [--op NAME]`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/base/status.h"
#include "kernels/cuda/attention_fallback.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/lora_down.h"
#include "tests/cuda/op_harness.h"

namespace flux2::testing {
namespace {

struct Rows {
  int64_t s, d;
};
// Token counts x widths for the fused element-wise and norm kernels.
constexpr Rows kFusedShapes[] = {{4608, 3072}, {4608, 6144}, {17, 3072}, {4611, 3072},
                                 {1, 128},     {29, 4096},   {33, 768}};

std::string sd(const Rows& r) {
  return absl::StrCat("S=", r.s, ",D=", r.d);
}

cuda::Mat mat(const Tensor& t) {
  return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()};
}

// RoPE-like f32 tables [rows, width].
std::vector<float> table(int64_t rows, bool sine, int64_t width = 128) {
  std::vector<float> values(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = sine ? std::sin(0.001f * i) : std::cos(0.001f * i);
  }
  return values;
}

struct AttentionShape {
  int64_t s, heads, kv_heads, head_dim;
  bool causal;
  int64_t valid_keys;
};

AttentionParams params_of(const AttentionShape& a) {
  return {a.heads,  a.kv_heads,  a.head_dim, static_cast<float>(1 / std::sqrt(double(a.head_dim))),
          a.causal, a.valid_keys};
}

std::string vars_of(const AttentionShape& a) {
  return absl::StrCat("S=", a.s, ",H=", a.heads, ",Hkv=", a.kv_heads, ",Dh=", a.head_dim,
                      a.causal ? ",causal" : "", a.valid_keys >= 0 ? ",valid=" : "",
                      a.valid_keys >= 0 ? absl::StrCat(a.valid_keys) : "");
}

// The request's options at quality=high, the harness's fast-path switch kept.
RequestOptions at_high(const Backend& be) {
  RequestOptions options = be.request();
  options.quality = Quality::kHigh;
  return options;
}

// Our FP8 attention against the CPU backend's emulation of it (cpu_fp8.h): the same E4M3 Q, K and V
// (the operand quantizer is the CPU recipe bit for bit); each probability rounded to E4M3 within
// 2^-4 relative of the exact one, the kernel's against a running maximum and the emulation's
// against the final one, so the two at most 2 x 2^-4 apart through the convex sum over keys; plus
// the kernel's fast accumulation ((padded keys / 32) steps of 2^-13) and its bf16 output (2^-8).
double fp8_against_emulation(int64_t padded_keys) {
  return 2 * std::ldexp(1.0, -4) + static_cast<double>(padded_keys / 32) * std::ldexp(1.0, -13) +
         std::ldexp(1.0, -8);
}
constexpr char kFp8AgainstEmulationWhy[] =
    "FP8 attention vs the CPU's emulation: the same E4M3 operands, P rounded against a running "
    "vs the final maximum (2 x 2^-4), fast accumulation and the bf16 output";

// klein-KV's attention over cached keys: the step's own k and v the first rows of rooms (column
// ranges of one buffer, as the workspace's), the cache made by the backend first. At lossless
// (cuDNN over the room the cache is copied into) and at quality=high (the cache quantized once,
// our kernel's second key segment; the CPU emulates the two segments).
void add_cached_keys_cases(std::vector<OpCase>& cases) {
  struct Shape {
    int64_t s_q, s, r, heads;
    bool high;
  };
  for (const Shape a : {Shape{300, 300, 556, 4, false}, Shape{300, 300, 1000, 2, true}}) {
    const int64_t w = a.heads * 128;
    OpCase c{"attention_with_cached_keys",
             absl::StrCat("Sq=", a.s_q, ",S=", a.s, ",R=", a.r, ",H=", a.heads, ",Dh=128",
                          a.high ? ",high" : ""),
             [a, w](OpEnv& e) -> absl::StatusOr<Tensor> {
               Tensor q = e.input(a.s_q, w, 2.0f), room = e.input(a.s + a.r, 2 * w, 2.0f);
               Tensor ref_k = e.input(a.r, w, 2.0f), ref_v = e.input(a.r, w);
               Tensor out = e.output(a.s_q, w);
               Backend& be = e.backend();
               const AttentionParams p{a.heads, a.heads, 128, 1.0f / std::sqrt(128.0f)};
               std::shared_ptr<const CachedKeys> cache;
               {
                 const RequestScope quality(be, a.high ? at_high(be) : be.request());
                 FLUX_ASSIGN_OR_RETURN(cache, be.cache_keys(ref_k, ref_v, p));
               }
               return e.call(out, [&be, a, w, p, q, room, cache, out] {
                 const RequestScope quality(be, a.high ? at_high(be) : be.request());
                 const Tensor k_room = room.col_slice(0, w), v_room = room.col_slice(w, w);
                 return be.attention_with_cached_keys(q, k_room.row_slice(0, a.s),
                                                      v_room.row_slice(0, a.s), *cache, k_room,
                                                      v_room, p, out);
               });
             },
             a.high ? "flash_attention_fp8" : "cudnn_attention"};
    if (a.high) {
      c.bound = fp8_against_emulation(cuda::flash_fp8_padded_keys(a.s) +
                                      cuda::flash_fp8_padded_keys(a.r));
      c.bound_why = kFp8AgainstEmulationWhy;
    }
    cases.push_back(std::move(c));
  }
}

// LoRA's B products fused with their consumers, and more terms than one launch takes. The SwiGLU
// reads the MLP columns of the single block's fused output, the whole-output term cut to them as
// lora_columns does, a second term straddling the gate|up boundary; then ragged shapes with
// unaligned operands (the scalar paths).
void add_lora_consumer_cases(std::vector<OpCase>& cases) {
  struct Mlp {
    int64_t s, d, f, r, second_offset, second_width, t_offset;
  };
  for (const Mlp m : {Mlp{4608, 3072, 9216, 32, 9216 - 64, 128, 0},
                      Mlp{131, 40, 100, 12, 5, 150, 3}, Mlp{1, 8, 16, 1, 0, 32, 0}}) {
    cases.push_back(
        {"lora_up_swiglu",
         absl::StrCat("S=", m.s, ",D=", m.d, ",F=", m.f, ",r=", m.r, ",t_offset=", m.t_offset),
         [m](OpEnv& e) {
           Tensor wide = e.input(m.s, 3 * m.d + 2 * m.f, 3.0f);
           Tensor y = wide.col_slice(3 * m.d, 2 * m.f);
           Tensor t = e.input(m.s, m.t_offset + 2 * m.r).col_slice(m.t_offset, 2 * m.r);
           Tensor b1 = e.input(3 * m.d + 2 * m.f, m.r), b2 = e.input(m.second_width, m.r);
           Tensor act = e.output(m.s, m.d + m.f).col_slice(m.d, m.f);
           return e.call(act, [&be = e.backend(), m, y, t, b1, b2, act] {
             const std::vector<LoraUpTerm> terms = {
                 {t.col_slice(0, m.r), b1.row_slice(3 * m.d, 2 * m.f), 0.5f, 0},
                 {t.col_slice(m.r, m.r), b2, -2.0f, m.second_offset}};
             return be.lora_up_swiglu(y, terms, act);
           });
         },
         "lora_up_swiglu"});
  }
  // q's LoRA terms with its QK-norm and RoPE, q inside the fused [q|k|v] output: a term over all
  // three (cut to q's columns as lora_columns does) and a second one straddling a head boundary;
  // a ragged row count; head_dim 64, which the fused kernel does not take (the eager chain runs).
  struct Qk {
    int64_t s, d, head_dim;
    RopeStyle style;
  };
  for (const Qk c :
       {Qk{4608, 3072, 128, RopeStyle::kInterleaved}, Qk{131, 256, 128, RopeStyle::kHalfSplit},
        Qk{40, 256, 64, RopeStyle::kInterleaved}}) {
    OpCase qk_case(
        "lora_up_qk_norm_rope",
        absl::StrCat("S=", c.s, ",D=", c.d, ",Dh=", c.head_dim,
                     c.style == RopeStyle::kInterleaved ? ",interleaved" : ",half_split"),
        [c](OpEnv& e) {
          Tensor qkv = e.in_place(c.s, 3 * c.d, 3.0f), weight = e.input(1, c.head_dim);
          Tensor cos = e.input_values(c.s, c.head_dim, table(c.s, false, c.head_dim), true);
          Tensor sin = e.input_values(c.s, c.head_dim, table(c.s, true, c.head_dim), true);
          Tensor t = e.input(c.s, 48), b1 = e.input(3 * c.d, 32), b2 = e.input(96, 16);
          Tensor q = qkv.col_slice(0, c.d);
          e.set_bytes(2 * c.s * c.d * 2 + 2 * c.s * c.head_dim * 4);  // q twice, the tables
          return e.call(q, [&be = e.backend(), c, q, weight, cos, sin, t, b1, b2] {
            const std::vector<LoraUpTerm> terms = {
                {t.col_slice(0, 32), b1.row_slice(0, c.d), 0.5f, 0},
                {t.col_slice(32, 16), b2, -1.25f, c.head_dim - 40}};
            return be.lora_up_qk_norm_rope(q, terms, c.head_dim, weight.reshape({c.head_dim}),
                                           1e-6f, cos, sin, c.style);
          });
        },
        "lora_up_qk_norm_rope");
    if (c.head_dim != 128) {
      qk_case.path = "";
      qk_case.expected_fallback = "lora_up_qk_norm_rope:unsupported_shape";
    }
    cases.push_back(std::move(qk_case));
  }
  // Ten adapters on one output: two launches, the first storing y.
  cases.push_back({"lora_up_add", "S=70,N=300,terms=10", [](OpEnv& e) {
                     Tensor y = e.in_place(70, 300, 4.0f), t = e.input(70, 80);
                     std::vector<Tensor> b;
                     for (int i = 0; i < 10; ++i) b.push_back(e.input(300 - 20 * i, 8));
                     return e.call(y, [&be = e.backend(), y, t, b] {
                       std::vector<LoraUpTerm> terms;
                       for (int i = 0; i < 10; ++i) {
                         terms.push_back({t.col_slice(8 * i, 8), b[i], 0.25f * (i + 1), 10 * i});
                       }
                       return be.lora_up_add(y, terms);
                     });
                   }});
}

cuda::Mat as_mat(const Tensor& t) {
  return {t.data(), t.rows(), t.cols(), t.row_stride()};
}

// Values in {-1, 0, 1} (half of them 0) from a fixed hash of (seed, index).
std::vector<float> ternary_values(int64_t count, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t h =
        (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
    const uint64_t q = (h ^ (h >> 31)) * 0x94D049BB133111EBull >> 62;  // 0..3
    values[static_cast<size_t>(i)] = q == 0 ? -1.0f : q == 1 ? 1.0f : 0.0f;
  }
  return values;
}

// lora_down bit for bit: x and the A stacks in {-1, 0, 1}, so every fp32 sum is an exact integer
// whatever the order or the K split, and |t| stays far below 256 (a sum of K terms of variance
// 1/4: a standard deviation of 27 at K = 2992), where bf16 holds every integer; the kernel's one
// rounding is then exact and its result must equal the CPU's exactly. Any slip of indexing,
// fragment layout, slice bounds or of the partial sums shows as an integer off. The shapes: K split
// over 10 slices with 131 ragged rows and ranks 20 + 13 (a stack boundary inside an 8-column
// fragment), the 128-column kernel (ranks 1 + 7 + 120) with a partial last chunk of K, and x and t
// as column slices of wider buffers, as the model passes them.
void add_exact_lora_down_cases(std::vector<OpCase>& cases) {
  struct Exact {
    int64_t s, k;
    std::vector<int64_t> ranks;
    int64_t x_pad, t_pad;  // extra columns of the buffers x and t are column slices of
  };
  for (const Exact& l : {Exact{131, 2992, {20, 13}, 0, 0}, Exact{65, 1032, {1, 7, 120}, 0, 0},
                         Exact{200, 3072, {32}, 64, 16}}) {
    int64_t rank = 0;
    std::string ranks;
    for (const int64_t r : l.ranks) {
      rank += r;
      absl::StrAppend(&ranks, ranks.empty() ? "" : "_", r);
    }
    // On the GPU the case first makes sure the kernel takes these operands (a refusal would run
    // cuBLASLt, exact here too, and test nothing of the kernel).
    auto run = [l, rank](bool on_gpu) {
      return [l, rank, on_gpu](OpEnv& e) -> absl::StatusOr<Tensor> {
        const int64_t x_cols = l.k + l.x_pad;
        Tensor x = e.input_values(l.s, x_cols, ternary_values(l.s * x_cols, 1)).col_slice(0, l.k);
        Tensor t = e.output(l.s, rank + l.t_pad).col_slice(0, rank);
        std::vector<Tensor> stacks;
        std::vector<cuda::Mat> mats;
        for (size_t i = 0; i < l.ranks.size(); ++i) {
          stacks.push_back(
              e.input_values(l.ranks[i], l.k, ternary_values(l.ranks[i] * l.k, 2 + i)));
          mats.push_back(as_mat(stacks.back()));
        }
        const absl::string_view refused = cuda::lora_down_unsupported(as_mat(x), mats, as_mat(t));
        if (on_gpu && !refused.empty()) {
          return absl::FailedPreconditionError(absl::StrCat("the kernel refuses it: ", refused));
        }
        return e.call(t, [&be = e.backend(), x, stacks, t] { return be.lora_down(x, stacks, t); });
      };
    };
    OpCase c(
        "lora_down",
        absl::StrCat("S=", l.s, ",K=", l.k, ",r=", ranks, ",exact", l.x_pad > 0 ? ",strided" : ""),
        run(false));
    c.run_gpu = run(true);
    c.bound = 0.0;
    c.bound_why = "integer sums below 256: exact in fp32 and bf16";
    cases.push_back(std::move(c));
  }
}

// LoRA's A products (Backend::lora_down): the klein-4B shapes whose cuBLASLt GEMMs were slow (the
// single block's [attn | mlp] input at K = 12288, the text stream's 512 rows), one stack per
// q, k, v module of one adapter, two adapters, ragged shapes, and operands the kernel does not
// take (R > 128, K not a multiple of 8: one GEMM per stack). `--perf` also times the same shapes
// through one cuBLASLt GEMM per stack (the base implementation), vars ending ",cublas".
void add_lora_down_cases(std::vector<OpCase>& cases) {
  struct LoraDown {
    int64_t s, k;
    std::vector<int64_t> ranks;
  };
  for (const LoraDown& l :
       {LoraDown{4608, 12288, {32}}, LoraDown{512, 9216, {32}}, LoraDown{4096, 3072, {32, 32, 32}},
        LoraDown{4608, 3072, {32, 16}}, LoraDown{70, 200, {8, 24}}, LoraDown{1, 64, {4}},
        LoraDown{131, 104, {100, 30}}, LoraDown{33, 100, {16}}}) {
    int64_t rank = 0;
    std::string ranks;
    for (const int64_t r : l.ranks) {
      rank += r;
      absl::StrAppend(&ranks, ranks.empty() ? "" : "_", r);
    }
    const std::string vars = absl::StrCat("S=", l.s, ",K=", l.k, ",r=", ranks);
    auto run = [l, rank](bool cublas) {
      return [l, rank, cublas](OpEnv& e) {
        Tensor x = e.input(l.s, l.k, 2.0f), t = e.output(l.s, rank);
        std::vector<Tensor> stacks;
        for (const int64_t r : l.ranks) stacks.push_back(e.input(r, l.k, 0.05f));
        return e.call(t, [&be = e.backend(), x, stacks, t, cublas] {
          return cublas ? be.Backend::lora_down(x, stacks, t) : be.lora_down(x, stacks, t);
        });
      };
    };
    cases.push_back({"lora_down", vars, run(false)});
    OpCase cublas("lora_down", vars + ",cublas", run(false));
    cublas.run_gpu = run(true);
    cases.push_back(std::move(cublas));
  }
  add_exact_lora_down_cases(cases);
}

std::vector<OpCase> make_cases() {
  std::vector<OpCase> cases;
  auto add = [&](OpCase c) { cases.push_back(std::move(c)); };

  for (const Rows r : kFusedShapes) {
    add({"gate_residual", sd(r),
         [r](OpEnv& e) {
           Tensor x = e.in_place(r.s, r.d, 4.0f);
           Tensor gate = e.input(1, r.d).reshape({r.d}), update = e.input(r.s, r.d, 4.0f);
           return e.call(x, [&be = e.backend(), x, gate, update] {
             return be.gate_residual(x, gate, update);
           });
         },
         "gate_residual"});
    // LoRA's B product and add onto k's columns of the fused [q|k|v] output, rank 32, as
    // apply_lora runs it (t a column slice of the stacked x · Aᵀ).
    add({"lora_up_add", sd(r) + ",r=32,into_qkv", [r](OpEnv& e) {
           Tensor qkv = e.in_place(r.s, 3 * r.d, 4.0f);
           Tensor k = qkv.col_slice(r.d, r.d), t = e.input(r.s, 96).col_slice(32, 32);
           Tensor b = e.input(r.d, 32);
           e.set_bytes(2 * r.s * r.d * 2 + r.s * 32 * 2 + r.d * 32 * 2);  // k twice, t, b
           return e.call(k, [&be = e.backend(), k, t, b] {
             const LoraUpTerm term{t, b, -0.375f, 0};
             return be.lora_up_add(k, {term});
           });
         }});
    // A block's output projection with two adapters (ranks 32 and 16), added with its gated
    // residual.
    add({"lora_up_gate_residual", sd(r) + ",two_terms",
         [r](OpEnv& e) {
           Tensor x = e.in_place(r.s, r.d, 2.0f), y = e.input(r.s, r.d, 4.0f);
           Tensor gate = e.input(1, r.d).reshape({r.d});
           Tensor t = e.input(r.s, 48), b1 = e.input(r.d, 32), b2 = e.input(r.d, 16);
           return e.call(x, [&be = e.backend(), x, y, gate, t, b1, b2] {
             const std::vector<LoraUpTerm> terms = {{t.col_slice(0, 32), b1, 0.75f, 0},
                                                    {t.col_slice(32, 16), b2, -1.5f, 0}};
             return be.lora_up_gate_residual(y, terms, x, gate);
           });
         },
         "lora_up_gate_residual"});
    // The single block: [q|k|v|gate|up] -> SwiGLU into the mlp columns of [attn|mlp].
    add({"swiglu", sd(r) + ",into_concat",
         [r](OpEnv& e) {
           const int64_t f = 3 * r.d;
           Tensor wide = e.input(r.s, 3 * r.d + 2 * f, 3.0f);
           Tensor out = e.output(r.s, r.d + f).col_slice(r.d, f);
           e.set_bytes(3 * r.s * f * 2);  // gate and up read, the product written (bf16)
           return e.call(out, [&be = e.backend(), wide, out, r, f] {
             return be.swiglu(wide.col_slice(3 * r.d, f), wide.col_slice(3 * r.d + f, f), out);
           });
         },
         "swiglu"});
    // shift and scale are column slices of the fused per-step modulation row, as in the model.
    add({"layer_norm_modulate", sd(r),
         [r](OpEnv& e) {
           Tensor x = e.input(r.s, r.d, 5.0f), mod = e.input(1, 17 * r.d);
           Tensor out = e.output(r.s, r.d);
           return e.call(out, [&be = e.backend(), x, mod, out, r] {
             return be.layer_norm_modulate(x, mod.col_slice(3 * r.d, r.d),
                                           mod.col_slice(4 * r.d, r.d), 1e-6f, out);
           });
         },
         "layer_norm_modulate"});
    for (const RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      // q inside the fused [q|k|v] projection buffer, as the model passes it.
      add({"qk_norm_rope",
           sd(r) + (style == RopeStyle::kInterleaved ? ",interleaved" : ",half_split"),
           [r, style](OpEnv& e) {
             Tensor qkv = e.in_place(r.s, 3 * r.d, 3.0f), weight = e.input(1, 128);
             Tensor cos = e.input_values(r.s, 128, table(r.s, false), /*f32=*/true);
             Tensor sin = e.input_values(r.s, 128, table(r.s, true), /*f32=*/true);
             Tensor q = qkv.col_slice(r.d, r.d);
             e.set_bytes(2 * r.s * r.d * 2 + 2 * r.s * 128 * 4);  // q read and written, tables
             return e.call(q, [&be = e.backend(), q, weight, cos, sin, style] {
               return be.qk_norm_rope(q, 128, weight.reshape({128}), 1e-6f, cos, sin, style);
             });
           },
           "qk_norm_rope"});
      // RoPE alone (Mistral's attention, no q/k norm), on the same strided q.
      add({"rope", sd(r) + (style == RopeStyle::kInterleaved ? ",interleaved" : ",half_split"),
           [r, style](OpEnv& e) {
             Tensor qkv = e.in_place(r.s, 3 * r.d, 3.0f);
             Tensor cos = e.input_values(r.s, 128, table(r.s, false), /*f32=*/true);
             Tensor sin = e.input_values(r.s, 128, table(r.s, true), /*f32=*/true);
             Tensor q = qkv.col_slice(r.d, r.d);
             e.set_bytes(2 * r.s * r.d * 2 + 2 * r.s * 128 * 4);
             return e.call(q, [&be = e.backend(), q, cos, sin, style] {
               return be.rope(q, 128, cos, sin, style);
             });
           }});
    }
  }

  // LayerNorm + modulation holds a row in registers, as many 16-byte packs per thread as the row
  // needs: every instantiation (1, 2, 3, 4, 6 and 8 packs of 128 threads).
  for (const int64_t d : {1024, 2048, 3072, 4096, 6144, 8192}) {
    add({"layer_norm_modulate", absl::StrCat("S=19,D=", d, ",packs"),
         [d](OpEnv& e) {
           Tensor x = e.input(19, d, 3.0f), shift = e.input(1, d), scale = e.input(1, d);
           Tensor out = e.output(19, d);
           return e.call(out, [&be = e.backend(), x, shift, scale, out, d] {
             return be.layer_norm_modulate(x, shift.reshape({d}), scale.reshape({d}), 1e-6f, out);
           });
         },
         "layer_norm_modulate"});
  }

  add({"linear", "M=77,N=512,K=3072,bias,into_slice", [](OpEnv& e) {
         Tensor x = e.input(77, 3072), w = e.input(512, 3072, 0.02f), bias = e.input(1, 512);
         Tensor y = e.output(77, 1024).col_slice(256, 512);
         return e.call(y, [&be = e.backend(), x, w, bias, y] {
           return be.linear(x, w, bias.reshape({512}), y);
         });
       }});

  // Attention: cuDNN SDPA where it applies (its path must run), the VAE's single wide head by
  // GEMMs, and the text encoder's causal, padded GQA attention, which cuDNN's path does not serve
  // by design: the plain kernel, and no fallback counted. Each shape also runs the plain kernel
  // directly (the fallback cuDNN hides), against the same CPU reference.
  for (const AttentionShape a :
       {AttentionShape{600, 4, 4, 128, false, -1}, AttentionShape{77, 3, 3, 32, false, -1},
        AttentionShape{100, 1, 1, 512, false, -1}, AttentionShape{64, 4, 2, 16, true, 21}}) {
    const bool cudnn = !a.causal && a.head_dim <= 256;
    auto inputs = [a](OpEnv& e) {
      return std::vector<Tensor>{
          e.input(a.s, a.heads * a.head_dim), e.input(a.s, a.kv_heads * a.head_dim),
          e.input(a.s, a.kv_heads * a.head_dim), e.output(a.s, a.heads * a.head_dim)};
    };
    auto through_backend = [a, inputs](OpEnv& e) {
      const std::vector<Tensor> t = inputs(e);
      return e.call(t[3], [&be = e.backend(), t, a] {
        return be.attention(t[0], t[1], t[2], params_of(a), t[3]);
      });
    };
    add({"attention", vars_of(a), through_backend, cudnn ? "cudnn_attention" : ""});
    OpCase plain{"attention_plain_kernel", vars_of(a), through_backend};
    plain.run_gpu = [a, inputs](OpEnv& e) {
      const std::vector<Tensor> t = inputs(e);
      return e.call(t[3], [&be = e.backend(), t, a] {
        return cuda::attention_fallback(mat(t[0]), mat(t[1]), mat(t[2]), params_of(a), mat(t[3]),
                                        cuda_stream_of(be));
      });
    };
    add(std::move(plain));
  }

  // klein-KV's cached steps: the text and image rows attend to their own keys and the cached
  // reference keys (more keys than queries); cuDNN's path must serve it.
  add({"attention", "Sq=300,Sk=556,H=4,Dh=128",
       [](OpEnv& e) {
         Tensor q = e.input(300, 512), k = e.input(556, 512), v = e.input(556, 512);
         Tensor out = e.output(300, 512);
         return e.call(out, [&be = e.backend(), q, k, v, out] {
           return be.attention(q, k, v, AttentionParams{4, 4, 128, 1.0f / std::sqrt(128.0f)}, out);
         });
       },
       "cudnn_attention"});

  // More keys than queries at quality=high (klein-KV's extract step: the text and image rows over
  // every key, one sequence): our FP8 kernel against the CPU's emulation of it.
  OpCase more_keys{"attention", "Sq=300,Sk=1000,H=2,Dh=128,high",
                   [](OpEnv& e) {
                     Tensor q = e.input(300, 256, 2.0f), k = e.input(1000, 256, 2.0f);
                     Tensor v = e.input(1000, 256), out = e.output(300, 256);
                     return e.call(out, [&be = e.backend(), q, k, v, out] {
                       const RequestScope high(be, at_high(be));
                       return be.attention(q, k, v, {2, 2, 128, 1.0f / std::sqrt(128.0f)}, out);
                     });
                   },
                   "flash_attention_fp8"};
  more_keys.bound = fp8_against_emulation(cuda::flash_fp8_padded_keys(1000));
  more_keys.bound_why = kFp8AgainstEmulationWhy;
  add(std::move(more_keys));
  add_cached_keys_cases(cases);

  // FLUX.2's QK-norm + RoPE + attention as one op (at lossless: the ops in turn) on the double
  // block's joint rows: 40 text rows with the text weights, then image rows.
  add({"normed_attention", "S=296,split=40,H=2,Dh=128",
       [](OpEnv& e) {
         const int64_t s = 296, w = 256;
         Tensor qkv = e.in_place(s, 3 * w, 3.0f), out = e.output(s, w);
         std::vector<Tensor> norms;
         for (int i = 0; i < 4; ++i) norms.push_back(e.input(1, 128).reshape({128}));
         Tensor cos = e.input_values(s, 128, table(s, false), true);
         Tensor sin = e.input_values(s, 128, table(s, true), true);
         return e.call(out, [&be = e.backend(), qkv, out, norms, cos, sin] {
           const QkNormRope norm{{norms[0], norms[1]},   {norms[2], norms[3]}, 40, 1e-6f, cos, sin,
                                 RopeStyle::kInterleaved};
           const AttentionParams p{2, 2, 128, static_cast<float>(1 / std::sqrt(128.0))};
           return be.normed_attention(qkv.col_slice(0, w), qkv.col_slice(w, w),
                                      qkv.col_slice(2 * w, w), norm, p, out);
         });
       },
       "qk_norm_rope"});

  add({"rms_norm", "S=33,D=256", [](OpEnv& e) {
         Tensor x = e.input(33, 256, 3.0f), w = e.input(1, 256), out = e.output(33, 256);
         return e.call(out, [&be = e.backend(), x, w, out] {
           return be.rms_norm(x, w.reshape({256}), 1e-6f, out);
         });
       }});
  add({"swiglu", "S=33,D=256,contiguous",
       [](OpEnv& e) {
         Tensor g = e.input(33, 256, 3.0f), u = e.input(33, 256), out = e.output(33, 256);
         return e.call(out, [&be = e.backend(), g, u, out] { return be.swiglu(g, u, out); });
       },
       "swiglu"});

  // GroupNorm at the VAE decoder's channel counts (C = 128 and 512; 300 pixels leave most of the
  // statistics blocks one pixel or none; C = 24 leaves threads idle; C = 36 takes the scalar path).
  struct GroupNormShape {
    int64_t pixels, channels, groups;
    bool silu;
  };
  for (const GroupNormShape g : {GroupNormShape{4099, 128, 32, true},
                                 {2053, 512, 32, false},
                                 {300, 128, 32, true},
                                 {1031, 24, 8, true},
                                 {300, 36, 4, false}}) {
    add({"group_norm",
         absl::StrCat("P=", g.pixels, ",C=", g.channels, ",G=", g.groups, g.silu ? ",silu" : ""),
         [g](OpEnv& e) {
           // A ramp over the pixels plus per-channel offsets: statistics that differ by group.
           std::vector<float> host(static_cast<size_t>(g.pixels * g.channels));
           for (int64_t p = 0; p < g.pixels; ++p) {
             for (int64_t ch = 0; ch < g.channels; ++ch) {
               host[p * g.channels + ch] = round_to_bf16(3.0f * p / g.pixels + 0.25f * (ch % 7) +
                                                         0.5f * std::sin(0.37f * (p + 5 * ch)));
             }
           }
           Tensor x = e.input_values(g.pixels, g.channels, host);
           Tensor gamma = e.input(1, g.channels), beta = e.input(1, g.channels);
           Tensor out = e.output(g.pixels, g.channels);
           return e.call(out, [&be = e.backend(), x, gamma, beta, out, g] {
             return be.group_norm(x, g.groups, gamma.reshape({g.channels}),
                                  beta.reshape({g.channels}), 1e-6f, g.silu, out);
           });
         }});
  }

  add({"conv2d", "H=12,W=20,Cin=32,Cout=64,k3", [](OpEnv& e) {
         Tensor x = e.input(12 * 20, 32), w = e.input(64, 9 * 32, 0.1f), b = e.input(1, 64);
         Tensor out = e.output(12 * 20, 64);
         return e.call(out, [&be = e.backend(), x, w, b, out] {
           return be.conv2d(x.reshape({12, 20, 32}), w.reshape({64, 3, 3, 32}), b.reshape({64}),
                            out.reshape({12, 20, 64}));
         });
       }});
  // The resnet's conv2 and shortcut add: at lossless the bias and the shortcut in one pass
  // (conv_bias_residual), bit for bit the three eager roundings. 128 channels (16-byte rows) and
  // 12 (the scalar kernel).
  for (const int64_t c : {int64_t{128}, int64_t{12}}) {
    add({"conv2d_add", absl::StrCat("H=12,W=20,Cin=Cout=", c, ",k3"),
         [c](OpEnv& e) {
           Tensor x = e.input(12 * 20, c), w = e.input(c, 9 * c, 0.1f), b = e.input(1, c);
           Tensor residual = e.input(12 * 20, c, 2.0f), out = e.output(12 * 20, c);
           return e.call(out, [&be = e.backend(), x, w, b, residual, out, c] {
             return be.conv2d_add(x.reshape({12, 20, c}), w.reshape({c, 3, 3, c}), b.reshape({c}),
                                  residual.reshape({12, 20, c}), out.reshape({12, 20, c}));
           });
         },
         "conv_bias_residual"});
  }
  // The VAE encoder's Downsample2D: zero padding at the bottom/right, 3x3, stride 2.
  add({"conv2d_downsample", "H=12,W=20,Cin=32,Cout=32", [](OpEnv& e) {
         Tensor x = e.input(12 * 20, 32), w = e.input(32, 9 * 32, 0.1f), b = e.input(1, 32);
         Tensor out = e.output(6 * 10, 32);
         return e.call(out, [&be = e.backend(), x, w, b, out] {
           return be.conv2d_downsample(x.reshape({12, 20, 32}), w.reshape({32, 3, 3, 32}),
                                       b.reshape({32}), out.reshape({6, 10, 32}));
         });
       }});
  add({"upsample_nearest_2x", "H=12,W=20,C=64", [](OpEnv& e) {
         Tensor x = e.input(12 * 20, 64), out = e.output(24 * 40, 64);
         return e.call(out, [&be = e.backend(), x, out] {
           return be.upsample_nearest_2x(x.reshape({12, 20, 64}), out.reshape({24, 40, 64}));
         });
       }});
  add({"latent_unpack", "h=6,w=10,C=32", [](OpEnv& e) {
         Tensor tokens = e.input(60, 128), mean = e.input(1, 128);
         std::vector<float> var(128);  // positive variances, bf16-exact
         for (size_t i = 0; i < var.size(); ++i) var[i] = 0.25f + 0.0078125f * i;
         Tensor variance = e.input_values(1, 128, var);
         Tensor out = e.output(12 * 20, 32);
         return e.call(out, [&be = e.backend(), tokens, mean, variance, out] {
           return be.latent_unpack(tokens, mean.reshape({128}), variance.reshape({128}), 1e-4f,
                                   out.reshape({12, 20, 32}));
         });
       }});
  // Reference latents: the mean (first 32 of 64 channels) patchified and normalised.
  add({"latent_pack", "h=6,w=10,C=32,of64", [](OpEnv& e) {
         Tensor x = e.input(12 * 20, 64), mean = e.input(1, 128);
         std::vector<float> var(128);  // positive variances, bf16-exact
         for (size_t i = 0; i < var.size(); ++i) var[i] = 0.25f + 0.0078125f * i;
         Tensor variance = e.input_values(1, 128, var);
         Tensor tokens = e.output(60, 128);
         return e.call(tokens, [&be = e.backend(), x, mean, variance, tokens] {
           return be.latent_pack(x.reshape({12, 20, 64}), mean.reshape({128}),
                                 variance.reshape({128}), 1e-4f, tokens);
         });
       }});
  // LoRA's B product at the widest fused output (the single block's [q|k|v|gate|up], klein-4B),
  // higher ranks, and ragged shapes: r not a multiple of 16, columns not a multiple of 8, an
  // unaligned column offset (the scalar path), a single row.
  struct LoraUp {
    int64_t s, n, r, offset, width;
  };
  for (const LoraUp l :
       {LoraUp{4608, 27648, 32, 0, 27648}, LoraUp{4608, 3072, 128, 3072, 9216},
        LoraUp{300, 100, 12, 3, 107}, LoraUp{1, 9, 1, 0, 9}, LoraUp{131, 6144, 48, 0, 6144}}) {
    add({"lora_up_add",
         absl::StrCat("S=", l.s, ",N=", l.n, ",r=", l.r, ",offset=", l.offset, ",width=", l.width),
         [l](OpEnv& e) {
           Tensor y = e.in_place(l.s, l.width, 4.0f).col_slice(l.offset, l.n);
           Tensor t = e.input(l.s, l.r), b = e.input(l.n, l.r);
           e.set_bytes(2 * l.s * l.n * 2 + l.s * l.r * 2 + l.n * l.r * 2);  // y twice, t, b
           return e.call(y, [&be = e.backend(), y, t, b] {
             const LoraUpTerm term{t, b, 0.8f, 0};
             return be.lora_up_add(y, {term});
           });
         }});
  }
  add_lora_consumer_cases(cases);
  add_lora_down_cases(cases);
  return cases;
}

std::string test_name(const OpCase& c) {
  std::string vars = absl::StrReplaceAll(c.vars, {{"=", ""}, {",", "_"}, {"-", "m"}});
  return c.op + "__" + vars;
}

class OpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTest, Case) {
  check_op_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           return test_name(info.param);
                         });

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

}  // namespace flux2::testing

// gpu_op_test [--perf] [--op NAME] [gtest flags]: --op keeps the cases of one op, --perf times
// them instead of checking them.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool perf = false;
  std::string op;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--perf") perf = true;
    if (arg == "--op" && i + 1 < argc) op = argv[++i];
    if (arg.rfind("--op=", 0) == 0) op = arg.substr(5);
  }
  if (perf) {
    for (const flux2::testing::OpCase& c : flux2::testing::op_cases()) {
      if (op.empty() || c.op == op) flux2::testing::time_op_case(c);
    }
    return 0;
  }
  if (!op.empty()) ::testing::GTEST_FLAG(filter) = "Ops/OpTest.Case/" + op + "__*";
  return RUN_ALL_TESTS();
}
