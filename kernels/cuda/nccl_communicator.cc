// NCCL loaded with dlopen and the Communicator over it, each collective timed by CUDA events on
// the rank's stream; see nccl_communicator.h. Tested by tests/cuda/nccl_communicator_test.cc.
#include "kernels/cuda/nccl_communicator.h"

#include <dlfcn.h>
#include <nccl.h>

#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

// The NCCL entry points the communicator uses, resolved once per process.
struct NcclApi {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclCommInitAll) comm_init_all;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclBroadcast) broadcast;
};

absl::StatusOr<NcclApi> load_nccl() {
  void* library = nullptr;
  for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
  }
  if (library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load NCCL: ", dlerror()));
  }
  NcclApi api{};
  absl::Status status;
  auto resolve = [&](auto& slot, const char* symbol) {
    void* address = dlsym(library, symbol);
    if (address == nullptr && status.ok()) {
      status = absl::FailedPreconditionError(absl::StrCat("NCCL has no symbol ", symbol));
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(address);
  };
  resolve(api.get_version, "ncclGetVersion");
  resolve(api.get_error_string, "ncclGetErrorString");
  resolve(api.comm_init_all, "ncclCommInitAll");
  resolve(api.comm_destroy, "ncclCommDestroy");
  resolve(api.comm_abort, "ncclCommAbort");
  resolve(api.group_start, "ncclGroupStart");
  resolve(api.group_end, "ncclGroupEnd");
  resolve(api.send, "ncclSend");
  resolve(api.recv, "ncclRecv");
  resolve(api.broadcast, "ncclBroadcast");
  if (!status.ok()) return status;
  return api;
}

absl::StatusOr<const NcclApi*> nccl_api() {
  static std::once_flag once;
  static absl::StatusOr<NcclApi> api = absl::UnknownError("not loaded");
  std::call_once(once, [] { api = load_nccl(); });
  if (!api.ok()) return api.status();
  return &*api;
}

absl::Status nccl_status(const NcclApi& api, ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", api.get_error_string(result)));
}

absl::Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// The device time of a rank's collectives: a pair of CUDA events recorded on the stream around
// each one, read (cudaEventElapsedTime) only at take(), once the caller synchronized; nothing here
// waits for the device. Events are made on first use, on the rank's thread (its device current),
// and reused after every take().
class CollectiveTimer {
 public:
  CollectiveTimer() = default;
  CollectiveTimer(const CollectiveTimer&) = delete;
  CollectiveTimer& operator=(const CollectiveTimer&) = delete;
  ~CollectiveTimer() {
    for (const Timed& t : events_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
  }

  // Records the start of the next collective on `stream`.
  absl::Status start(cudaStream_t stream) {
    if (used_ == events_.size()) {
      Timed t;
      FLUX_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&t.start), "cudaEventCreate"));
      const absl::Status end = cuda_status(cudaEventCreate(&t.end), "cudaEventCreate");
      if (!end.ok()) {
        cudaEventDestroy(t.start);
        return end;
      }
      events_.push_back(t);
    }
    return cuda_status(cudaEventRecord(events_[used_].start, stream), "cudaEventRecord");
  }
  // Records the end of the collective start() began, counted as `kind`.
  absl::Status stop(cudaStream_t stream, double CollectiveSeconds::*kind) {
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaEventRecord(events_[used_].end, stream), "cudaEventRecord"));
    events_[used_++].kind = kind;
    return absl::OkStatus();
  }
  // The collectives' device time since the last take(); starts counting anew.
  absl::StatusOr<CollectiveSeconds> take() {
    const size_t used = std::exchange(used_, 0);
    CollectiveSeconds seconds;
    for (size_t i = 0; i < used; ++i) {
      const cudaError_t done = cudaEventQuery(events_[i].end);
      if (done == cudaErrorNotReady) {
        return absl::FailedPreconditionError(
            "take_collective_seconds: a collective has not run on the device yet (synchronize "
            "first)");
      }
      FLUX_RETURN_IF_ERROR(cuda_status(done, "cudaEventQuery"));
      float ms = 0.0f;
      FLUX_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms, events_[i].start, events_[i].end),
                                       "cudaEventElapsedTime"));
      seconds.*events_[i].kind += ms / 1000.0;
    }
    return seconds;
  }

 private:
  struct Timed {
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    double CollectiveSeconds::*kind = &CollectiveSeconds::all_to_all;
  };
  std::vector<Timed> events_;  // events_[0, used_): recorded since the last take()
  size_t used_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi& api, ncclComm_t comm, int rank, int size, cudaStream_t stream)
      : api_(api), comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override {
    if (!aborted_) api_.comm_destroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status all_to_all(const std::vector<Tensor>& send,
                          const std::vector<Tensor>& recv) override {
    FLUX_RETURN_IF_ERROR(check("all_to_all", send, recv));
    FLUX_RETURN_IF_ERROR(timer_.start(stream_));
    FLUX_RETURN_IF_ERROR(exchange(send, recv));
    return timer_.stop(stream_, &CollectiveSeconds::all_to_all);
  }

  absl::Status all_gather(const Tensor& send, const std::vector<Tensor>& recv) override {
    FLUX_RETURN_IF_ERROR(check("all_gather", {send}, recv, /*send_count=*/1));
    FLUX_RETURN_IF_ERROR(timer_.start(stream_));
    FLUX_RETURN_IF_ERROR(gather(send, recv));
    return timer_.stop(stream_, &CollectiveSeconds::all_gather);
  }

  void abort(const absl::Status& why) override {
    if (aborted_) return;
    aborted_ = true;
    api_.comm_abort(comm_);
  }

  absl::StatusOr<CollectiveSeconds> take_collective_seconds() override { return timer_.take(); }

 private:
  // all_to_all's copy and NCCL calls, enqueued on the stream.
  absl::Status exchange(const std::vector<Tensor>& send, const std::vector<Tensor>& recv) {
    FLUX_RETURN_IF_ERROR(copy_local(send[rank_], recv[rank_]));
    if (size_ == 1) return absl::OkStatus();
    FLUX_RETURN_IF_ERROR(nccl_status(api_, api_.group_start(), "ncclGroupStart"));
    absl::Status status;
    for (int j = 0; j < size_ && status.ok(); ++j) {
      if (j == rank_) continue;
      if (send[j].bytes() > 0) {
        status = nccl_status(api_,
                             api_.send(send[j].data(), static_cast<size_t>(send[j].bytes()),
                                       ncclUint8, j, comm_, stream_),
                             "ncclSend");
      }
      if (status.ok() && recv[j].bytes() > 0) {
        status = nccl_status(api_,
                             api_.recv(recv[j].data(), static_cast<size_t>(recv[j].bytes()),
                                       ncclUint8, j, comm_, stream_),
                             "ncclRecv");
      }
    }
    const absl::Status ended = nccl_status(api_, api_.group_end(), "ncclGroupEnd");
    return status.ok() ? ended : status;
  }

  // all_gather's copy and NCCL calls, enqueued on the stream.
  absl::Status gather(const Tensor& send, const std::vector<Tensor>& recv) {
    FLUX_RETURN_IF_ERROR(copy_local(send, recv[rank_]));
    if (size_ == 1) return absl::OkStatus();
    // Uneven parts: one broadcast per root, the root's own part sent from `send`.
    FLUX_RETURN_IF_ERROR(nccl_status(api_, api_.group_start(), "ncclGroupStart"));
    absl::Status status;
    for (int j = 0; j < size_ && status.ok(); ++j) {
      if (recv[j].bytes() == 0) continue;
      status = nccl_status(
          api_,
          api_.broadcast(j == rank_ ? send.data() : nullptr, recv[j].data(),
                         static_cast<size_t>(recv[j].bytes()), ncclUint8, j, comm_, stream_),
          "ncclBroadcast");
    }
    const absl::Status ended = nccl_status(api_, api_.group_end(), "ncclGroupEnd");
    return status.ok() ? ended : status;
  }

  absl::Status check(const char* collective, const std::vector<Tensor>& send,
                     const std::vector<Tensor>& recv, int send_count = -1) const {
    if (aborted_) {
      return absl::AbortedError(absl::StrCat(collective, ": this rank's communicator was aborted"));
    }
    const DType dtype = send.empty() ? DType::kBF16 : send[0].dtype();
    FLUX_RETURN_IF_ERROR(check_collective_tensors(
        collective, "send", send, send_count < 0 ? size_ : send_count, dtype, Device::kCuda));
    return check_collective_tensors(collective, "recv", recv, size_, dtype, Device::kCuda);
  }

  // recv = send on this rank (nothing to do in place), on the stream.
  absl::Status copy_local(const Tensor& send, const Tensor& recv) const {
    if (send.shape() != recv.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("this rank sends itself ", send.describe(),
                                                     " where ", recv.describe(), " is expected"));
    }
    if (send.bytes() == 0 || send.data() == recv.data()) return absl::OkStatus();
    return cuda_status(cudaMemcpyAsync(recv.data(), send.data(), static_cast<size_t>(send.bytes()),
                                       cudaMemcpyDeviceToDevice, stream_),
                       "cudaMemcpyAsync");
  }

  const NcclApi& api_;
  ncclComm_t comm_;
  const int rank_, size_;
  cudaStream_t stream_;
  bool aborted_ = false;
  CollectiveTimer timer_;
};

}  // namespace

absl::StatusOr<int> nccl_version() {
  FLUX_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  int version = 0;
  FLUX_RETURN_IF_ERROR(nccl_status(*api, api->get_version(&version), "ncclGetVersion"));
  return version;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> create_nccl_group(
    const std::vector<int>& devices, const std::vector<cudaStream_t>& streams) {
  if (devices.empty() || devices.size() != streams.size()) {
    return absl::InvalidArgumentError(absl::StrCat("create_nccl_group: ", devices.size(),
                                                   " devices and ", streams.size(), " streams"));
  }
  FLUX_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  const int size = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  FLUX_RETURN_IF_ERROR(
      nccl_status(*api, api->comm_init_all(comms.data(), size, devices.data()), "ncclCommInitAll"));
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.push_back(
        std::make_unique<NcclCommunicator>(*api, comms[rank], rank, size, streams[rank]));
  }
  return ranks;
}

}  // namespace flux2
