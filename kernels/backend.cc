// Default implementations of the Backend interface's optional methods; see backend.h.
#include "kernels/backend.h"

#include <chrono>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

absl::StatusOr<std::vector<double>> Backend::time_each_ms(
    int64_t count, const std::function<absl::Status(int64_t)>& work) {
  std::vector<double> times;
  FLUX_RETURN_IF_ERROR(synchronize());
  for (int64_t i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    FLUX_RETURN_IF_ERROR(work(i));
    FLUX_RETURN_IF_ERROR(synchronize());
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return times;
}

absl::StatusOr<CopyTicket> Backend::start_copies(const std::vector<CopyPair>& copies) {
  for (const CopyPair& pair : copies) {
    if (pair.src.shape() != pair.dst.shape() || pair.src.dtype() != pair.dst.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "start_copies: ", pair.src.describe(), " cannot be copied into ", pair.dst.describe()));
    }
    FLUX_RETURN_IF_ERROR(copy(pair.src, pair.dst));
  }
  return CopyTicket{};
}

absl::StatusOr<Tensor> Backend::weight_values(const Weight& w) {
  if (!w.stored_fp8()) return w.tensor;
  const Tensor& values = w.tensor;
  if (values.rank() != 2 || !values.contiguous() || w.row_scales.dtype() != DType::kF32 ||
      w.row_scales.numel() != values.rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_values: a stored FP8 weight needs contiguous E4M3 values [N, K] and ",
        "f32 row scales [N]; got ", values.describe(), " and ", w.row_scales.describe()));
  }
  FLUX_ASSIGN_OR_RETURN(Tensor out, empty(weight_dtype(), {values.rows(), values.cols()}));
  FLUX_RETURN_IF_ERROR(dequantize_e4m3_rows(values, w.row_scales, out));
  return out;
}

absl::StatusOr<double> Backend::time_ms(const std::function<absl::Status()>& work) {
  FLUX_RETURN_IF_ERROR(synchronize());
  FLUX_ASSIGN_OR_RETURN(std::vector<double> times,
                        time_each_ms(1, [&](int64_t) { return work(); }));
  return times.front();
}

absl::Status Backend::swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x,
                                    const Weight& w, const Tensor& y,
                                    const GatedResidual* residual) {
  if (x.rank() != 2 || gate.rank() != 2 || x.rows() != gate.rows() || x.cols() < gate.cols()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "swiglu_linear: x ", x.describe(), " must have gate's rows and end with its columns (gate ",
        gate.describe(), ")"));
  }
  FLUX_RETURN_IF_ERROR(swiglu(gate, up, x.col_slice(x.cols() - gate.cols(), gate.cols())));
  FLUX_RETURN_IF_ERROR(linear(x, w, {}, y));
  return residual != nullptr ? gate_residual(residual->stream, residual->gate, y)
                             : absl::OkStatus();
}

absl::Status Backend::lora_down(const Tensor& x, const std::vector<Tensor>& stacks,
                                const Tensor& t) {
  int64_t column = 0;
  for (const Tensor& a : stacks) column += a.rows();
  if (t.rank() != 2 || t.rows() != x.rows() || t.cols() != column) {
    return absl::InvalidArgumentError(absl::StrCat("lora_down: t ", t.describe(), " is not [",
                                                   x.rows(), ", ", column, "] for these stacks"));
  }
  column = 0;
  for (const Tensor& a : stacks) {
    FLUX_RETURN_IF_ERROR(linear(x, a, {}, t.col_slice(column, a.rows())));
    column += a.rows();
  }
  return absl::OkStatus();
}

absl::Status Backend::lora_up_swiglu(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                     const Tensor& out) {
  if (y.rank() != 2 || out.rank() != 2 || y.cols() != 2 * out.cols()) {
    return absl::InvalidArgumentError(absl::StrCat("lora_up_swiglu: y ", y.describe(),
                                                   " must be [gate | up] of out ", out.describe()));
  }
  const int64_t f = out.cols();
  FLUX_RETURN_IF_ERROR(lora_up_add(y, terms));
  return swiglu(y.col_slice(0, f), y.col_slice(f, f), out);
}

absl::Status Backend::lora_up_gate_residual(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                            const Tensor& x, const Tensor& gate) {
  FLUX_RETURN_IF_ERROR(lora_up_add(y, terms));
  return gate_residual(x, gate, y);
}

absl::Status Backend::layer_norm_modulate_linear(const Tensor& x, const Tensor& shift,
                                                 const Tensor& scale, float eps,
                                                 const Tensor& normed, const Weight& w,
                                                 const Tensor& y) {
  FLUX_RETURN_IF_ERROR(layer_norm_modulate(x, shift, scale, eps, normed));
  return linear(normed, w, {}, y);
}

absl::Status Backend::layer_norm_modulate_linear_keeping_normed(const Tensor& x,
                                                                const Tensor& shift,
                                                                const Tensor& scale, float eps,
                                                                const Tensor& normed,
                                                                const Weight& w, const Tensor& y) {
  FLUX_RETURN_IF_ERROR(layer_norm_modulate(x, shift, scale, eps, normed));
  return linear(normed, w, {}, y);
}

absl::Status Backend::lora_up_qk_norm_rope(const Tensor& x, const std::vector<LoraUpTerm>& terms,
                                           int64_t head_dim, const Tensor& norm_weight, float eps,
                                           const Tensor& cos, const Tensor& sin, RopeStyle style) {
  FLUX_RETURN_IF_ERROR(lora_up_add(x, terms));
  return qk_norm_rope(x, head_dim, norm_weight, eps, cos, sin, style);
}

absl::Status Backend::normed_qk(const Tensor& q, const Tensor& k, const QkNormRope& norm,
                                int64_t head_dim, const QkLoraTerms* lora) {
  const int64_t rows = q.rows();
  if (norm.split < 0 || norm.split > rows || k.rows() != rows || norm.cos.rows() != rows) {
    return absl::InvalidArgumentError(absl::StrCat("normed_qk: split ", norm.split, " outside [0, ",
                                                   rows,
                                                   "] or q, k and the RoPE tables differ in rows"));
  }
  // One head matrix's part: its LoRA terms added with the norm when it has any.
  auto norm_part = [&](const Tensor& x, const std::vector<LoraUpTerm>* terms, const Tensor& weight,
                       const Tensor& cos, const Tensor& sin) {
    if (terms == nullptr || terms->empty()) {
      return qk_norm_rope(x, head_dim, weight, norm.eps, cos, sin, norm.style);
    }
    return lora_up_qk_norm_rope(x, *terms, head_dim, weight, norm.eps, cos, sin, norm.style);
  };
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : norm.split,
                  count = part == 0 ? norm.split : rows - norm.split;
    if (count == 0) continue;
    const Tensor cos = norm.cos.row_slice(first, count), sin = norm.sin.row_slice(first, count);
    FLUX_RETURN_IF_ERROR(norm_part(q.row_slice(first, count), lora ? &lora->q[part] : nullptr,
                                   norm.q_weight[part], cos, sin));
    FLUX_RETURN_IF_ERROR(norm_part(k.row_slice(first, count), lora ? &lora->k[part] : nullptr,
                                   norm.k_weight[part], cos, sin));
  }
  return absl::OkStatus();
}

absl::Status Backend::normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const QkNormRope& norm, const AttentionParams& params,
                                       const Tensor& out) {
  FLUX_RETURN_IF_ERROR(normed_qk(q, k, norm, params.head_dim));
  return attention(q, k, v, params, out);
}

absl::Status check_cached_keys_layout(const Tensor& k, const Tensor& v, const CachedKeys& cached,
                                      const Tensor& k_room, const Tensor& v_room) {
  const int64_t s = k.rows(), r = cached.rows();
  for (const auto& [mine, room, name] : {std::tuple{&k, &k_room, "k"}, {&v, &v_room, "v"}}) {
    if (mine->rank() != 2 || room->rank() != 2 || mine->data() != room->data() ||
        mine->row_stride() != room->row_stride() || mine->cols() != room->cols() ||
        mine->rows() != s || room->rows() != s + r) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention_with_cached_keys: ", name, " ", mine->describe(),
                       " must be the first rows of its room ", room->describe(), ", which holds ",
                       r, " more rows for the cached keys"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CachedKeys>> Backend::cache_keys(
    const Tensor& k, const Tensor& v, const AttentionParams& params) {
  if (k.rank() != 2 || v.rank() != 2 || k.rows() != v.rows() || k.rows() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cache_keys: k ", k.describe(), " and v ",
                                                   v.describe(),
                                                   " need the same rows, at least 1"));
  }
  auto cache = std::make_shared<PlainCachedKeys>();
  FLUX_ASSIGN_OR_RETURN(cache->k, empty(activation_dtype(), {k.rows(), k.cols()}));
  FLUX_ASSIGN_OR_RETURN(cache->v, empty(activation_dtype(), {v.rows(), v.cols()}));
  FLUX_RETURN_IF_ERROR(copy(k, cache->k));  // [R, Hkv·Dh]
  FLUX_RETURN_IF_ERROR(copy(v, cache->v));  // [R, Hkv·Dh]
  return cache;
}

absl::Status Backend::attention_with_cached_keys(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const CachedKeys& cached, const Tensor& k_room,
                                                 const Tensor& v_room,
                                                 const AttentionParams& params, const Tensor& out) {
  FLUX_RETURN_IF_ERROR(check_cached_keys_layout(k, v, cached, k_room, v_room));
  const auto* plain = dynamic_cast<const PlainCachedKeys*>(&cached);
  if (plain == nullptr) {
    return absl::InvalidArgumentError(
        "attention_with_cached_keys: the cache was not made by this backend's cache_keys");
  }
  const int64_t s = k.rows(), r = cached.rows();
  FLUX_RETURN_IF_ERROR(copy(plain->k, k_room.row_slice(s, r)));  // [R, Hkv·Dh]
  FLUX_RETURN_IF_ERROR(copy(plain->v, v_room.row_slice(s, r)));  // [R, Hkv·Dh]
  return attention(q, k_room, v_room, params, out);              // [S_q, H·Dh]
}

}  // namespace flux2
