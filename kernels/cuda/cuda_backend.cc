// CudaBackend construction, memory and host transfers (compute ops: cuda_backend_impl.h lists
// the files).
// Memory comes from the device's stream-ordered pool (release threshold at max, so freed blocks
// are reused, not returned); transfers go through two pinned staging buffers, converting dtypes
// on the host while the previous chunk is in flight. Tested by tests/cuda/op_cases.cc
// (gpu_op_test).
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/op_checks.h"
#include "kernels/base/parallel.h"
#include "kernels/base/read_file.h"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fault_injection.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/gemm_algorithm_table.h"

namespace flux2 {
namespace {

constexpr size_t kStagingBytes = size_t{32} << 20;
constexpr int64_t kAllocationAlignment = 256;  // cuBLASLt's default alignment assumption

// Makes `device` current on the calling thread for its lifetime, then restores the thread's own
// (page-locked host memory is made and freed on request threads, which must not be left on
// another device, nor a rank's thread moved off its GPU).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (status_ == cudaSuccess && previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Converts `count` host values of `from` into `to` at dst (host memory).
absl::Status convert_host(const void* src, DType from, void* dst, DType to, int64_t count) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count * dtype_size(from)));
    return absl::OkStatus();
  }
  if (to == DType::kBF16 && from == DType::kF32) {
    // LoRA adapters and float32 checkpoints: a tight loop on the host's threads (a 300 MB
    // adapter's 156 M values took ~0.9 s through the element-wise path below).
    auto* out = static_cast<uint16_t*>(dst);
    const char* in = static_cast<const char*>(src);
    parallel_for(count, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float v;  // memcpy loads: checkpoint data may sit at any address
        std::memcpy(&v, in + i * 4, sizeof(v));
        out[i] = f32_to_bf16_bits(v);
      }
    });
    return absl::OkStatus();
  }
  if (to == DType::kBF16 && from == DType::kF16) {
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < count; ++i) {
      float v;  // memcpy loads: checkpoint data may sit at any address
      widen_to_f32(from, static_cast<const char*>(src) + i * dtype_size(from), 1, &v);
      out[i] = f32_to_bf16_bits(v);
    }
    return absl::OkStatus();
  }
  if (to == DType::kF32 && (from == DType::kBF16 || from == DType::kF16 || from == DType::kI64 ||
                            from == DType::kI32 || from == DType::kU8)) {
    widen_to_f32(from, src, count, static_cast<float*>(dst));
    return absl::OkStatus();
  }
  if (to == DType::kI32 && from == DType::kI64) {
    for (int64_t i = 0; i < count; ++i) {
      int64_t v;
      std::memcpy(&v, static_cast<const char*>(src) + i * 8, sizeof(v));
      static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cuda: cannot convert ", dtype_name(from), " to ", dtype_name(to)));
}

// --gemm-algorithms: the table's section for this GPU and cuBLASLt (empty for "heuristic", or
// when the table has none), and a phrase for the start-up log.
absl::StatusOr<cuda::GemmAlgorithmTable> gemm_algorithms(const std::string& source,
                                                         const std::string& device,
                                                         std::string* described) {
  FLUX_ASSIGN_OR_RETURN(const cuda::CublasLtApi* api, cuda::cublaslt_api());
  const size_t version = api->get_version();
  if (source == "heuristic") {
    *described = "GEMM algorithms from cuBLASLt's heuristic";
    return cuda::GemmAlgorithmTable{device, version, {}};
  }
  std::string text;
  if (source == "builtin") {
    text = std::string(cuda::builtin_gemm_algorithms());
  } else {
    FLUX_ASSIGN_OR_RETURN(text, read_file(source, "--gemm-algorithms"));
  }
  absl::StatusOr<cuda::GemmAlgorithmTable> table =
      cuda::parse_gemm_algorithms(text, device, version);
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gemm-algorithms ", source, ": ", table.status().message()));
  }
  *described = table->entries.empty()
                   ? absl::StrCat("GEMM algorithms from cuBLASLt's heuristic (the ", source,
                                  " table has none for ", device, " with cuBLASLt ", version, ")")
                   : absl::StrCat("GEMM algorithms of ", table->entries.size(), " shapes from the ",
                                  source, " table, the heuristic's for the rest");
  return table;
}

}  // namespace

CudaStream::~CudaStream() {
  if (stream != nullptr) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::create(const BackendOptions& options) {
  FLUX_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info());
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  backend->total_bytes_ = info.total_bytes;
  backend->multiprocessors_ = info.multiprocessors;
  backend->stream_ = std::make_shared<CudaStream>();
  FLUX_RETURN_IF_ERROR(cuda_status(
      cudaStreamCreateWithFlags(&backend->stream_->stream, cudaStreamNonBlocking), "stream"));
  backend->copy_stream_ = std::make_shared<CudaStream>();
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaStreamCreateWithFlags(&backend->copy_stream_->stream, cudaStreamNonBlocking),
                  "copy stream"));
  int device = 0;
  FLUX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "device"));
  backend->device_ = device;
  cudaMemPool_t pool;
  FLUX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetDefaultMemPool(&pool, device), "memory pool"));
  uint64_t threshold = std::numeric_limits<uint64_t>::max();
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                  "pool threshold"));
  for (int i = 0; i < 2; ++i) {
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaMallocHost(&backend->staging_[i], kStagingBytes), "pinned staging"));
    FLUX_RETURN_IF_ERROR(cuda_status(
        cudaEventCreateWithFlags(&backend->staging_done_[i], cudaEventDisableTiming), "event"));
  }
  cuda::GemmOptions gemm_options;
  gemm_options.autotune = options.gemm_autotune;
  backend->device_name_ = info.name;
  std::string gemm_source;
  FLUX_ASSIGN_OR_RETURN(gemm_options.algorithms,
                        gemm_algorithms(options.gemm_algorithms, info.name, &gemm_source));
  FLUX_ASSIGN_OR_RETURN(backend->gemm_, cuda::Gemm::create(backend->stream(), gemm_options));
  FLUX_ASSIGN_OR_RETURN(backend->sdpa_, cuda::CudnnSdpa::create(backend->stream()));
  FLUX_ASSIGN_OR_RETURN(backend->conv_, cuda::CudnnConv::create(backend->stream()));
  backend->fp8_rowwise_ = backend->gemm_->supports_rowwise_fp8();
  backend->nvfp4_ = info.major >= 10 && backend->gemm_->supports_nvfp4();
  cuda::fast_path(cuda::CudaPath::kGateResidual);  // registers the whole table (GetModelInfo)
  std::string settings;
  for (const auto& [flag, value] : options.describe())
    absl::StrAppend(&settings, " --", flag, "=", value);
  std::fprintf(
      stderr, "flux2: CUDA backend on %s (sm_%d%d, %.1f GB);%s; %s; quality=high: %s, %s\n",
      info.name.c_str(), info.major, info.minor, info.total_bytes / 1e9, settings.c_str(),
      gemm_source.c_str(),
      backend->nvfp4_         ? "NVFP4 GEMMs"
      : backend->fp8_rowwise_ ? "FP8 GEMMs, per-token x per-channel scales"
                              : "FP8 GEMMs, per-tensor scales",
      options.fp8_attention && cuda::flash_attention_fp8_available() ? "FP8 flash attention"
                                                                     : "bf16 attention");
  return backend;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream());
  gemm_.reset();
  sdpa_.reset();
  conv_.reset();
  for (int i = 0; i < 2; ++i) {
    if (staging_[i] != nullptr) cudaFreeHost(staging_[i]);
    if (staging_done_[i] != nullptr) cudaEventDestroy(staging_done_[i]);
  }
}

absl::StatusOr<Tensor> CudaBackend::empty(DType dtype, Shape shape) {
  const int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  const int64_t rounded =
      std::max<int64_t>(kAllocationAlignment, (bytes + kAllocationAlignment - 1) /
                                                  kAllocationAlignment * kAllocationAlignment);
  void* memory = nullptr;
  // inject_fault(kDeviceOutOfMemory): this allocation asks the driver for more than the device
  // has, so the real failure path below runs.
  const int64_t asked = std::exchange(fail_next_allocation_, false) ? 2 * total_bytes_ : rounded;
  const cudaError_t error = cudaMallocAsync(&memory, static_cast<size_t>(asked), stream());
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    return absl::ResourceExhaustedError(absl::StrCat("out of device memory: cannot allocate ",
                                                     asked, " bytes for ", shape_string(shape),
                                                     " (", cudaGetErrorString(error), ")"));
  }
  std::shared_ptr<CudaStream> keep = stream_;
  std::shared_ptr<void> storage(memory, [keep](void* p) { cudaFreeAsync(p, keep->stream); });
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return Tensor(std::move(storage), memory, dtype, Device::kCuda, std::move(shape), cols);
}

absl::Status CudaBackend::upload(const void* host, DType host_dtype, const Tensor& dst) {
  if (dst.device() == Device::kCpu) {  // an empty_host() tensor: convert straight into it
    if (!dst.contiguous()) return op_error("upload", "host destination is not contiguous");
    return convert_host(host, host_dtype, dst.data(), dst.dtype(), dst.numel());
  }
  if (dst.device() != Device::kCuda) return op_error("upload", "destination is not on the GPU");
  const int64_t cols = dst.cols(), rows = dst.rows();
  const int64_t dst_elem = dtype_size(dst.dtype()), host_elem = dtype_size(host_dtype);
  const int64_t row_bytes = cols * dst_elem;
  FLUX_CHECK(row_bytes <= static_cast<int64_t>(kStagingBytes));
  const int64_t chunk_rows =
      std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes) / std::max<int64_t>(row_bytes, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int buffer = staging_next_;
    staging_next_ ^= 1;
    const int64_t n = std::min(chunk_rows, rows - r0);
    FLUX_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(staging_done_[buffer]), "staging wait"));
    FLUX_RETURN_IF_ERROR(convert_host(static_cast<const char*>(host) + r0 * cols * host_elem,
                                      host_dtype, staging_[buffer], dst.dtype(), n * cols));
    char* target = static_cast<char*>(dst.data()) + r0 * dst.row_stride() * dst_elem;
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy2DAsync(target, dst.row_stride() * dst_elem, staging_[buffer],
                                      row_bytes, row_bytes, n, cudaMemcpyHostToDevice, stream()),
                    "upload"));
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaEventRecord(staging_done_[buffer], stream()), "staging record"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::download(const Tensor& src, float* host) {
  if (src.device() != Device::kCuda) return op_error("download", "source is not on the GPU");
  const int64_t cols = src.cols(), rows = src.rows(), elem = dtype_size(src.dtype());
  const int64_t row_bytes = cols * elem;
  FLUX_CHECK(row_bytes <= static_cast<int64_t>(kStagingBytes));
  const int64_t chunk_rows =
      std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes) / std::max<int64_t>(row_bytes, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const char* source = static_cast<const char*>(src.data()) + r0 * src.row_stride() * elem;
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy2DAsync(staging_[0], row_bytes, source, src.row_stride() * elem,
                                      row_bytes, n, cudaMemcpyDeviceToHost, stream()),
                    "download"));
    FLUX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream()), "download sync"));
    FLUX_RETURN_IF_ERROR(
        convert_host(staging_[0], src.dtype(), host + r0 * cols, DType::kF32, n * cols));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  OpProfileScope profile(*this, "elementwise");
  if (src.device() != Device::kCuda || dst.device() != Device::kCuda)
    return op_error("copy", "tensors must be on the GPU");
  FLUX_RETURN_IF_ERROR(check_matrix("copy", "dst", dst, src.rows(), src.cols()));
  return cuda::convert_copy(mat(src), src.dtype(), mat(dst), dst.dtype(), stream());
}

absl::Status CudaBackend::fill_uniform(const Tensor& t, uint64_t seed, float scale) {
  if (t.device() == Device::kCpu && t.dtype() == DType::kBF16 && t.contiguous()) {
    // A host tensor (empty_host): the same values, drawn on the device and copied back.
    FLUX_ASSIGN_OR_RETURN(Tensor staged, empty(t.dtype(), t.shape()));
    FLUX_RETURN_IF_ERROR(cuda::fill_uniform_bf16(staged.data(), t.numel(), seed, scale, stream()));
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpyAsync(t.data(), staged.data(), static_cast<size_t>(t.bytes()),
                                    cudaMemcpyDeviceToHost, stream()),
                    "fill_uniform copy"));
    return synchronize();
  }
  if (t.device() != Device::kCuda || t.dtype() != DType::kBF16 || !t.contiguous()) {
    return op_error("fill_uniform",
                    absl::StrCat("expected a contiguous bf16 GPU tensor, got ", t.describe()));
  }
  return cuda::fill_uniform_bf16(t.data(), t.numel(), seed, scale, stream());
}

absl::Status CudaBackend::synchronize() {
  return cuda_status(cudaStreamSynchronize(stream()), "synchronize");
}

absl::StatusOr<std::vector<double>> CudaBackend::time_each_ms(
    int64_t count, const std::function<absl::Status(int64_t)>& work) {
  std::vector<cudaEvent_t> events(static_cast<size_t>(count + 1), nullptr);
  absl::Status status;
  for (cudaEvent_t& event : events) {
    if (status.ok()) status = cuda_status(cudaEventCreate(&event), "event");
  }
  if (status.ok()) status = cuda_status(cudaEventRecord(events[0], stream()), "event record");
  for (int64_t i = 0; i < count && status.ok(); ++i) {
    status = work(i);
    if (status.ok()) status = cuda_status(cudaEventRecord(events[i + 1], stream()), "event record");
  }
  if (status.ok()) status = cuda_status(cudaEventSynchronize(events.back()), "event sync");
  std::vector<double> times;
  for (int64_t i = 0; i < count && status.ok(); ++i) {
    float ms = 0.0f;
    status = cuda_status(cudaEventElapsedTime(&ms, events[i], events[i + 1]), "elapsed");
    times.push_back(static_cast<double>(ms));
  }
  for (cudaEvent_t event : events) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (!status.ok()) return status;
  return times;
}

absl::StatusOr<Tensor> CudaBackend::empty_host(DType dtype, Shape shape) {
  const int64_t bytes = std::max<int64_t>(shape_numel(shape) * dtype_size(dtype), 1);
  // Any thread may call this (the LoRA registry does, on request threads): the allocation goes
  // to this backend's device, never to whichever a fresh thread would default to.
  const ScopedDevice on_device(device_);
  FLUX_RETURN_IF_ERROR(cuda_status(on_device.status(), "device"));
  void* memory = nullptr;
  // Portable: every device's copies read it at full speed (the ranks of --gpus N share images).
  const cudaError_t error =
      cudaHostAlloc(&memory, static_cast<size_t>(bytes), cudaHostAllocPortable);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: cannot allocate ", bytes, " bytes of page-locked host memory for ",
                     shape_string(shape), ": ", cudaGetErrorString(error)));
  }
  // The last holder may be any thread (a request's, the registry's): free it on this device too.
  std::shared_ptr<void> storage(memory, [device = device_](void* p) {
    const ScopedDevice on_device(device);
    cudaFreeHost(p);
  });
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return Tensor(std::move(storage), memory, dtype, Device::kCpu, std::move(shape), cols);
}

absl::StatusOr<CopyTicket> CudaBackend::start_copies(const std::vector<CopyPair>& copies) {
  cudaStream_t copy_stream = copy_stream_->stream;
  cudaEvent_t after = nullptr, done = nullptr;
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), "copy event"));
  if (absl::Status status =
          cuda_status(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "copy event");
      !status.ok()) {
    cudaEventDestroy(after);
    return status;
  }
  CopyTicket ticket;
  ticket.done = std::shared_ptr<void>(done, [after](void* e) {
    cudaEventDestroy(after);
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  });
  // The copies start once the compute stream has reached this point (their targets are free).
  FLUX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(after, stream()), "copy event record"));
  FLUX_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(copy_stream, after, 0), "copy wait"));
  for (const CopyPair& pair : copies) {
    if (pair.src.shape() != pair.dst.shape() || pair.src.dtype() != pair.dst.dtype() ||
        !pair.src.contiguous() || !pair.dst.contiguous()) {
      return op_error("start_copies", absl::StrCat(pair.src.describe(), " cannot be copied into ",
                                                   pair.dst.describe()));
    }
    FLUX_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(pair.dst.data(), pair.src.data(), static_cast<size_t>(pair.src.bytes()),
                        cudaMemcpyDefault, copy_stream),
        "start_copies"));
  }
  FLUX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(done, copy_stream), "copy event record"));
  return ticket;
}

absl::Status CudaBackend::await_copies(const CopyTicket& ticket) {
  if (ticket.done == nullptr) return absl::OkStatus();
  return cuda_status(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(ticket.done.get()), 0),
                     "copy await");
}

int64_t CudaBackend::free_device_bytes() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(free);
}

std::string CudaBackend::device_pci_bus_id() const {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device_) != cudaSuccess) return "";
  return id;
}

absl::Status CudaBackend::device_status() {
  const cudaError_t error = cudaStreamSynchronize(stream());
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the CUDA context is broken (", cudaGetErrorName(error),
                                          ": ", cudaGetErrorString(error),
                                          "); only a new process can use the GPU again"));
}

absl::Status CudaBackend::inject_fault(InjectedFault fault, double hang_seconds) {
  switch (fault) {
    case InjectedFault::kDeviceOutOfMemory:
      fail_next_allocation_ = true;
      return absl::OkStatus();
    case InjectedFault::kIllegalAddress:
      cuda::launch_illegal_address_write(stream());
      break;
    case InjectedFault::kHang:
      cuda::launch_spin(stream(), hang_seconds);
      break;
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("inject_fault");
  return absl::OkStatus();
}

BackendMemoryStats CudaBackend::memory_stats() const {
  BackendMemoryStats stats;
  stats.total_bytes = total_bytes_;
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) != cudaSuccess) return stats;
  uint64_t used = 0, peak = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak);
  stats.used_bytes = static_cast<int64_t>(used);
  stats.peak_bytes = static_cast<int64_t>(peak);
  return stats;
}

void CudaBackend::reset_peak_memory() {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) != cudaSuccess) return;
  uint64_t zero = 0;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
}

absl::StatusOr<Tensor> CudaBackend::scratch(Shape shape, DType dtype) {
  return empty(dtype, std::move(shape));
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream(), &status);
  return status != cudaStreamCaptureStatusNone;
}

absl::StatusOr<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options) {
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

cudaStream_t cuda_stream_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda == nullptr ? nullptr : cuda->stream();
}

}  // namespace flux2
