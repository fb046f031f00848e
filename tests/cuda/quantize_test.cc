// The FP8 / NVFP4 quantizer kernels (kernels/cuda/quantize.h) equal the CPU references of
// kernels/base/fp8_nvfp4.h bit for bit, with kAuto (cvt instructions where compiled) and kSoftware
// conversions, at the klein-4B shapes and awkward ones; the fused token-concat quantizers equal
// quantize(materialized concat) byte for byte; amax is deterministic; bad arguments are rejected
// before any launch; the hardware conversions equal the software ones over all 2^32 f32 inputs.
// Run: build/bin/gpu_quantize_test (skips without a GPU).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/uniform_hash.h"
#include "kernels/cuda/quantize.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using cuda::Fp8QuantizeArgs;
using cuda::Nvfp4QuantizeArgs;
using cuda::QuantizeConversion;

constexpr size_t kGuard = 256;       // sentinel bytes either side of every device buffer
constexpr uint8_t kSentinel = 0xa5;  // also the fill of outputs before a kernel writes them

// A device buffer with sentinel guard bands; data() is 256-byte aligned.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + 2 * kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemset(base_, kSentinel, bytes + 2 * kGuard), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(base_) + kGuard; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes) const {
    ASSERT_LE(bytes, bytes_);
    ASSERT_EQ(cudaMemcpy(data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void fill(uint8_t value) const { ASSERT_EQ(cudaMemset(data(), value, bytes_), cudaSuccess); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), data(), bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  float download_float() const {
    float v = 0.0f;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&v, data(), sizeof(v), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  // True when both guard bands still hold the sentinel.
  bool guards_intact() const {
    std::vector<uint8_t> head(kGuard), tail(kGuard);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(head.data(), base_, kGuard, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(tail.data(), data() + bytes_, kGuard, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < kGuard; ++i) {
      if (head[i] != kSentinel || tail[i] != kSentinel) return false;
    }
    return true;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// Random bf16 bits with per-16-block magnitudes 2^-16 .. 2^7 (so some NVFP4 blocks get a zero
// scale), exact zeros and negative zeros. The same generator as
// tests/host/quantize_reference_test.cc.
uint16_t test_bits(uint64_t seed, int64_t r, int64_t c) {
  const float u =
      uniform_hash(seed, static_cast<uint64_t>(r) * 1000003u + static_cast<uint64_t>(c));
  const float e = uniform_hash(seed ^ 0x5555u,
                               static_cast<uint64_t>(r) * 65537u + static_cast<uint64_t>(c / 16));
  if (u < 0.01f) return u < 0.005f ? 0x0000 : 0x8000;
  const float v = std::ldexp(2.0f * u - 1.0f, static_cast<int>(e * 24.0f) - 16);
  return static_cast<uint16_t>(f32_bits(v) >> 16);
}

// A bf16 matrix on the host (row stride cols + pad, pad filled with NaN) and its device copy.
struct Matrix {
  std::vector<uint16_t> bits;
  int64_t rows = 0, cols = 0, stride = 0;
  std::unique_ptr<DeviceBuffer> device;

  Bf16HostView view() const { return {bits.data(), rows, cols, stride}; }
  cuda::Mat mat() const { return {device ? device->data() : nullptr, rows, cols, stride}; }
};

Matrix upload(std::vector<uint16_t> bits, int64_t rows, int64_t cols, int64_t stride) {
  Matrix m{std::move(bits), rows, cols, stride, nullptr};
  m.device = std::make_unique<DeviceBuffer>(std::max<size_t>(m.bits.size() * 2, 16));
  m.device->upload(m.bits.data(), m.bits.size() * 2);
  return m;
}

Matrix random_matrix(uint64_t seed, int64_t rows, int64_t cols, int64_t pad) {
  std::vector<uint16_t> bits(static_cast<size_t>(rows * (cols + pad)), 0x7fc0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) bits[r * (cols + pad) + c] = test_bits(seed, r, c);
  }
  return upload(std::move(bits), rows, cols, cols + pad);
}

Matrix materialized_concat(const Matrix& a, const Matrix& b) {
  std::vector<uint16_t> bits;
  bits.reserve(static_cast<size_t>(a.rows * (a.cols + b.cols)));
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < a.cols; ++c) bits.push_back(a.bits[r * a.stride + c]);
    for (int64_t c = 0; c < b.cols; ++c) bits.push_back(b.bits[r * b.stride + c]);
  }
  return upload(std::move(bits), a.rows, a.cols + b.cols, a.cols + b.cols);
}

// Counts differing bytes and reports the first few with their index.
void expect_bytes_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t differing = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && ++differing <= 5) {
      ADD_FAILURE() << what << ": byte " << i << " is 0x" << std::hex << int{got[i]}
                    << ", expected 0x" << int{want[i]};
    }
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << got.size() << " bytes differ";
}

uint32_t bits_of(float v) {
  return f32_bits(v);
}

struct QuantShape {
  int64_t rows, d, f, pad;  // [rows, d] | [rows, f]; input rows padded by `pad` elements
};

std::string shape_name(const ::testing::TestParamInfo<QuantShape>& info) {
  return absl::StrCat("M", info.param.rows, "_D", info.param.d, "_F", info.param.f, "_pad",
                      info.param.pad);
}

constexpr QuantizeConversion kConversions[] = {QuantizeConversion::kAuto,
                                               QuantizeConversion::kSoftware};
const char* conversion_name(QuantizeConversion c) {
  return c == QuantizeConversion::kAuto ? "auto" : "software";
}

class QuantizeGpuTest : public ::testing::TestWithParam<QuantShape> {
 protected:
  // [first | second] inputs (second absent when f == 0) and the materialized concatenation.
  void make_inputs() {
    const auto [rows, d, f, pad] = GetParam();
    a_ = random_matrix(101, rows, d, pad);
    b_ = random_matrix(102, rows, f, f > 0 ? pad + 8 : 0);
    cat_ = materialized_concat(a_, b_);
  }
  cuda::QuantizeInput fused_input() const { return {a_.mat(), b_.mat()}; }
  cuda::QuantizeInput cat_input() const { return {cat_.mat(), cuda::Mat{}}; }
  int64_t rows() const { return GetParam().rows; }
  int64_t cols() const { return GetParam().d + GetParam().f; }

  Matrix a_, b_, cat_;
};

TEST_P(QuantizeGpuTest, Fp8DynamicFusedEqualsReferenceAndConcat) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  make_inputs();
  const int64_t m = rows(), k = cols();
  const float ref_amax = reference_amax(a_.view(), b_.view());
  ASSERT_GT(ref_amax, 0.0f);
  const float ref_scale = fp8_dequant_scale(ref_amax);
  std::vector<uint8_t> ref(static_cast<size_t>(m * k));
  reference_fp8_quantize(a_.view(), b_.view(), ref_scale, ref.data());

  DeviceBuffer out(ref.size()), scale(4), amax(4), workspace(cuda::kQuantizeWorkspaceBytes);
  for (QuantizeConversion conversion : kConversions) {
    for (bool fused : {true, false}) {
      const std::string what = absl::StrCat("fp8 dynamic ", fused ? "fused" : "concat", " ",
                                            conversion_name(conversion));
      out.fill(kSentinel);
      Fp8QuantizeArgs args;
      args.in = fused ? fused_input() : cat_input();
      args.out = out.data();
      args.out_bytes = static_cast<int64_t>(out.bytes());
      args.scale = reinterpret_cast<float*>(scale.data());
      args.amax = reinterpret_cast<float*>(amax.data());
      args.workspace = workspace.data();
      args.workspace_bytes = cuda::kQuantizeWorkspaceBytes;
      args.conversion = conversion;
      ASSERT_TRUE(cuda::fp8_quantize_dynamic(args, nullptr).ok()) << what;
      EXPECT_EQ(bits_of(amax.download_float()), bits_of(ref_amax)) << what;
      EXPECT_EQ(bits_of(scale.download_float()), bits_of(ref_scale)) << what;
      expect_bytes_equal(out.download(), ref, what);
      EXPECT_TRUE(out.guards_intact() && scale.guards_intact() && amax.guards_intact()) << what;
    }
  }
}

TEST_P(QuantizeGpuTest, Fp8StaticEqualsReference) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  make_inputs();
  // A calibrated scale below the tensor's amax / 448, so the largest values saturate at ±448.
  // Codes e4m3(x / scale) (a checkpoint's input_scale), the scale repeated into row_scales.
  const float static_scale = 0.75f * fp8_dequant_scale(reference_amax(a_.view(), b_.view()));
  std::vector<uint8_t> ref(static_cast<size_t>(rows() * cols()));
  reference_fp8_quantize_static(a_.view(), b_.view(), static_scale, ref.data());
  DeviceBuffer out(ref.size()), scale(4), row_scales(static_cast<size_t>(rows()) * 4);
  scale.upload(&static_scale, 4);
  for (QuantizeConversion conversion : kConversions) {
    out.fill(kSentinel);
    row_scales.fill(kSentinel);
    Fp8QuantizeArgs args;
    args.in = fused_input();
    args.out = out.data();
    args.out_bytes = static_cast<int64_t>(out.bytes());
    args.scale = reinterpret_cast<float*>(scale.data());
    args.row_scales = reinterpret_cast<float*>(row_scales.data());
    args.conversion = conversion;
    ASSERT_TRUE(cuda::fp8_quantize_static(args, nullptr).ok());
    expect_bytes_equal(out.download(), ref,
                       absl::StrCat("fp8 static ", conversion_name(conversion)));
    const std::vector<uint8_t> written = row_scales.download();
    for (int64_t r = 0; r < rows(); ++r) {
      float value;
      std::memcpy(&value, written.data() + 4 * r, 4);
      ASSERT_EQ(bits_of(value), bits_of(static_scale)) << "row " << r;
    }
    EXPECT_TRUE(out.guards_intact() && row_scales.guards_intact());
  }
}

TEST_P(QuantizeGpuTest, Fp8PerRowEqualsReference) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  make_inputs();
  const int64_t m = rows(), k = cols();
  std::vector<float> ref_scales(static_cast<size_t>(m));
  std::vector<uint8_t> ref(static_cast<size_t>(m * k));
  reference_fp8_quantize_rows(cat_.view(), ref_scales.data(), ref.data());
  std::vector<uint8_t> ref_scale_bytes(ref_scales.size() * 4);
  std::memcpy(ref_scale_bytes.data(), ref_scales.data(), ref_scale_bytes.size());
  DeviceBuffer out(ref.size()), scales(ref_scale_bytes.size());
  for (QuantizeConversion conversion : kConversions) {
    out.fill(kSentinel);
    Fp8QuantizeArgs args;
    args.in = fused_input();  // strided and concatenated: the reference quantizes the concat
    args.out = out.data();
    args.out_bytes = static_cast<int64_t>(out.bytes());
    args.scale = reinterpret_cast<float*>(scales.data());
    args.conversion = conversion;
    ASSERT_TRUE(cuda::fp8_quantize_rows(args, nullptr).ok());
    expect_bytes_equal(scales.download(), ref_scale_bytes,
                       absl::StrCat("fp8 row scales ", conversion_name(conversion)));
    expect_bytes_equal(out.download(), ref, absl::StrCat("fp8 rows ", conversion_name(conversion)));
    EXPECT_TRUE(out.guards_intact() && scales.guards_intact());
  }
}

TEST_P(QuantizeGpuTest, Nvfp4FusedEqualsReferenceAndConcat) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  make_inputs();
  const int64_t m = rows(), k = cols();
  const float ref_amax = reference_amax(a_.view(), b_.view());
  const float ref_gs = nvfp4_global_scale(ref_amax);
  std::vector<uint8_t> ref_packed(static_cast<size_t>(m * k / 2)),
      ref_scales(static_cast<size_t>(nvfp4_scale_bytes(m, k)));
  reference_nvfp4_quantize(a_.view(), b_.view(), ref_gs, ref_packed.data(), ref_scales.data());

  DeviceBuffer out(ref_packed.size()), scales(ref_scales.size()), gs(4), amax(4),
      workspace(cuda::kQuantizeWorkspaceBytes);
  for (QuantizeConversion conversion : kConversions) {
    for (bool fused : {true, false}) {
      for (bool dynamic : {true, false}) {
        const std::string what =
            absl::StrCat("nvfp4 ", dynamic ? "dynamic " : "static ", fused ? "fused " : "concat ",
                         conversion_name(conversion));
        out.fill(kSentinel);
        scales.fill(kSentinel);  // the kernel must write the padding as 0
        Nvfp4QuantizeArgs args;
        args.in = fused ? fused_input() : cat_input();
        args.out = out.data();
        args.out_bytes = static_cast<int64_t>(out.bytes());
        args.scales = scales.data();
        args.scales_bytes = static_cast<int64_t>(scales.bytes());
        args.global_scale = reinterpret_cast<float*>(gs.data());
        args.conversion = conversion;
        if (dynamic) {
          gs.fill(0);
          args.amax = reinterpret_cast<float*>(amax.data());
          args.workspace = workspace.data();
          args.workspace_bytes = cuda::kQuantizeWorkspaceBytes;
          ASSERT_TRUE(cuda::nvfp4_quantize_dynamic(args, nullptr).ok()) << what;
          EXPECT_EQ(bits_of(amax.download_float()), bits_of(ref_amax)) << what;
        } else {
          gs.upload(&ref_gs, 4);
          ASSERT_TRUE(cuda::nvfp4_quantize_static(args, nullptr).ok()) << what;
        }
        EXPECT_EQ(bits_of(gs.download_float()), bits_of(ref_gs)) << what;
        expect_bytes_equal(out.download(), ref_packed, what + " values");
        expect_bytes_equal(scales.download(), ref_scales, what + " scales");
        EXPECT_TRUE(out.guards_intact() && scales.guards_intact() && gs.guards_intact()) << what;
      }
    }
  }
}

// The amax (and so the scale and every byte) is the same on every run.
TEST_P(QuantizeGpuTest, DynamicAmaxIsDeterministic) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  make_inputs();
  DeviceBuffer out(static_cast<size_t>(rows() * cols())), scale(4), amax(4),
      workspace(cuda::kQuantizeWorkspaceBytes);
  Fp8QuantizeArgs args;
  args.in = fused_input();
  args.out = out.data();
  args.out_bytes = static_cast<int64_t>(out.bytes());
  args.scale = reinterpret_cast<float*>(scale.data());
  args.amax = reinterpret_cast<float*>(amax.data());
  args.workspace = workspace.data();
  args.workspace_bytes = cuda::kQuantizeWorkspaceBytes;
  ASSERT_TRUE(cuda::fp8_quantize_dynamic(args, nullptr).ok());
  const uint32_t first_amax = bits_of(amax.download_float());
  const std::vector<uint8_t> first_out = out.download();
  for (int run = 0; run < 5; ++run) {
    workspace.fill(static_cast<uint8_t>(0x11 * run));  // stale partials must not matter
    ASSERT_TRUE(cuda::fp8_quantize_dynamic(args, nullptr).ok());
    EXPECT_EQ(bits_of(amax.download_float()), first_amax) << "run " << run;
    EXPECT_TRUE(out.download() == first_out) << "run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Quantize, QuantizeGpuTest,
    ::testing::Values(
        QuantShape{4608, 3072, 0, 0},     // klein-4B hidden: QKV / fused-in projection input
        QuantShape{4608, 3072, 9216, 0},  // klein-4B single block to_out input, D + F = 12288
        QuantShape{4611, 3072, 9216, 8},  // odd tokens: padded scale rows, strided inputs
        QuantShape{17, 48, 48, 0},        // K = 16 * 6: a partial 4-block of scales
        QuantShape{130, 40, 56, 24},      // concat split at D % 16 != 0 (vector loads)
        QuantShape{33, 20, 76, 3},        // D % 8 != 0 and odd strides: scalar loads
        QuantShape{1, 16, 0, 0}),         // one row, one block
    shape_name);

// ---- argument checks: InvalidArgument and nothing written ----

TEST(QuantizeGpuArgsTest, BadInputsAreRejectedBeforeAnyLaunch) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  const int64_t m = 4, k = 64;
  Matrix x = random_matrix(7, m, k, 0);
  Matrix y = random_matrix(8, m + 1, 32, 0);
  DeviceBuffer out(static_cast<size_t>(m * k) + 16),
      scales(static_cast<size_t>(nvfp4_scale_bytes(m, k)) + 16);
  DeviceBuffer scale(16), workspace(cuda::kQuantizeWorkspaceBytes);
  const float one = 1.0f;
  scale.upload(&one, 4);

  auto fp8 = [&] {
    Fp8QuantizeArgs args;
    args.in = {x.mat(), cuda::Mat{}};
    args.out = out.data();
    args.out_bytes = m * k;
    args.scale = reinterpret_cast<float*>(scale.data());
    args.workspace = workspace.data();
    args.workspace_bytes = cuda::kQuantizeWorkspaceBytes;
    return args;
  };
  auto nvfp4 = [&] {
    Nvfp4QuantizeArgs args;
    args.in = {x.mat(), cuda::Mat{}};
    args.out = out.data();
    args.out_bytes = m * k / 2;
    args.scales = scales.data();
    args.scales_bytes = nvfp4_scale_bytes(m, k);
    args.global_scale = reinterpret_cast<float*>(scale.data());
    args.workspace = workspace.data();
    args.workspace_bytes = cuda::kQuantizeWorkspaceBytes;
    return args;
  };
  ASSERT_TRUE(cuda::fp8_quantize_static(fp8(), nullptr).ok());  // the baseline is valid
  ASSERT_TRUE(cuda::nvfp4_quantize_static(nvfp4(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<std::pair<std::string, Fp8QuantizeArgs>> bad_fp8;
  std::vector<std::pair<std::string, Nvfp4QuantizeArgs>> bad_nvfp4;
  {
    Fp8QuantizeArgs a = fp8();
    a.in.first.cols = 40;  // K not a multiple of 16
    bad_fp8.emplace_back("K = 40", a);
    a = fp8();
    a.out = out.data() + 8;  // 8-byte aligned only
    bad_fp8.emplace_back("misaligned out", a);
    a = fp8();
    a.in.first.data = x.device->data() + 1;  // odd address
    bad_fp8.emplace_back("misaligned input", a);
    a = fp8();
    a.out_bytes = m * k - 1;
    bad_fp8.emplace_back("out too small", a);
    a = fp8();
    a.scale = nullptr;
    bad_fp8.emplace_back("null scale", a);
    a = fp8();
    a.scale = reinterpret_cast<float*>(scale.data() + 2);
    bad_fp8.emplace_back("misaligned scale", a);
    a = fp8();
    a.workspace_bytes = cuda::kQuantizeWorkspaceBytes - 4;
    bad_fp8.emplace_back("workspace too small", a);
    a = fp8();
    a.in.second = y.mat();  // 5 rows vs 4
    bad_fp8.emplace_back("concat rows differ", a);
    a = fp8();
    a.in.first.stride = k - 1;
    bad_fp8.emplace_back("stride < cols", a);
  }
  {
    Nvfp4QuantizeArgs a = nvfp4();
    a.in.first.cols = 56;
    bad_nvfp4.emplace_back("K = 56", a);
    a = nvfp4();
    a.scales = scales.data() + 4;
    bad_nvfp4.emplace_back("misaligned scales", a);
    a = nvfp4();
    a.scales_bytes = nvfp4_scale_bytes(m, k) - 1;
    bad_nvfp4.emplace_back("scales too small", a);
    a = nvfp4();
    a.out_bytes = m * k / 2 - 16;
    bad_nvfp4.emplace_back("out too small", a);
    a = nvfp4();
    a.global_scale = nullptr;
    bad_nvfp4.emplace_back("null global scale", a);
    a = nvfp4();
    a.workspace = nullptr;
    bad_nvfp4.emplace_back("null workspace", a);
  }
  for (auto& [what, args] : bad_fp8) {
    out.fill(kSentinel);
    const absl::Status dynamic = cuda::fp8_quantize_dynamic(args, nullptr);
    EXPECT_EQ(dynamic.code(), absl::StatusCode::kInvalidArgument) << what << ": " << dynamic;
    if (what != "workspace too small") {
      const absl::Status fixed = cuda::fp8_quantize_static(args, nullptr);
      EXPECT_EQ(fixed.code(), absl::StatusCode::kInvalidArgument) << what << ": " << fixed;
      const absl::Status rows = cuda::fp8_quantize_rows(args, nullptr);
      EXPECT_EQ(rows.code(), absl::StatusCode::kInvalidArgument) << what << ": " << rows;
    }
    const std::vector<uint8_t> after = out.download();
    EXPECT_EQ(std::count(after.begin(), after.end(), kSentinel), static_cast<int64_t>(after.size()))
        << what << ": written";
  }
  for (auto& [what, args] : bad_nvfp4) {
    out.fill(kSentinel);
    scales.fill(kSentinel);
    const absl::Status dynamic = cuda::nvfp4_quantize_dynamic(args, nullptr);
    EXPECT_EQ(dynamic.code(), absl::StatusCode::kInvalidArgument) << what << ": " << dynamic;
    if (what != "null workspace") {
      const absl::Status fixed = cuda::nvfp4_quantize_static(args, nullptr);
      EXPECT_EQ(fixed.code(), absl::StatusCode::kInvalidArgument) << what << ": " << fixed;
    }
    const std::vector<uint8_t> after = out.download(), after_scales = scales.download();
    EXPECT_EQ(std::count(after.begin(), after.end(), kSentinel), static_cast<int64_t>(after.size()))
        << what;
    EXPECT_EQ(std::count(after_scales.begin(), after_scales.end(), kSentinel),
              static_cast<int64_t>(after_scales.size()))
        << what;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---- the cvt instructions against the software conversions, every f32 input ----

TEST(QuantizeGpuConversionTest, HardwareEqualsSoftwareOverAllF32) {
  FLUX2_REQUIRE_GPU(be);
  (void)be;
  const absl::StatusOr<cuda::QuantizeHardware> hw = cuda::quantize_hardware_conversions();
  ASSERT_TRUE(hw.ok()) << hw.status();
  std::cout << "[ info ] kAuto uses e4m3 cvt: " << hw->e4m3_cvt << ", e2m1 cvt: " << hw->e2m1_cvt
            << " (software elsewhere)\n";
  DeviceBuffer counts(6 * sizeof(unsigned long long));
  ASSERT_TRUE(
      cuda::quantize_conversion_mismatches(
          0, uint64_t{1} << 32, reinterpret_cast<unsigned long long*>(counts.data()), nullptr)
          .ok());
  const std::vector<uint8_t> raw = counts.download();
  unsigned long long c[6];
  std::memcpy(c, raw.data(), sizeof(c));
  EXPECT_EQ(c[4], hw->e4m3_cvt ? uint64_t{1} << 32 : 0u);
  EXPECT_EQ(c[5], hw->e2m1_cvt ? uint64_t{1} << 32 : 0u);
  EXPECT_EQ(c[0], 0u) << "e4m3: first mismatching f32 pattern 0x" << std::hex << c[2];
  EXPECT_EQ(c[1], 0u) << "e2m1: first mismatching f32 pattern 0x" << std::hex << c[3];
  if (!hw->e4m3_cvt && !hw->e2m1_cvt) GTEST_SKIP() << "no cvt instruction compiled for this device";
}

}  // namespace
}  // namespace flux2
