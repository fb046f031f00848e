// A floor under explicitly sized thread stacks, so prometheus-cpp's HTTP server (civetweb) survives
// the process's static TLS. civetweb creates its threads with a fixed 100 KiB stack (0x19000 in
// Debian's libcivetweb 1.15), and glibc carves every thread's static TLS out of that stack:
// OpenBLAS alone takes 60 KiB (plus cudart, gRPC, libc), leaving ~35 KiB, and the first /metrics
// scrape overflows it inside vsnprintf (SIGSEGV). The same family of failure as cuBLASLt's ~94 KB
// of static TLS (kernels/cuda/cublaslt_api.h). This definition interposes pthread_attr_setstacksize
// for the executables that link it (exported with --export-dynamic-symbol) and raises requests
// below 1 MiB to 1 MiB; requests above pass through unchanged, and threads that never set a size
// are unaffected. Tested by the metrics scrapes in tests/server/server_test.cc and
// tests/server/e2e_test.cc.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {

// Enough for civetweb's request handling plus a few hundred KiB of static TLS.
constexpr size_t kMinThreadStackBytes = size_t{1} << 20;

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn real_set_stack_size() {
  static const SetStackSizeFn real =
      reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  const SetStackSizeFn real = real_set_stack_size();
  if (real == nullptr) return 0;  // keep the default size (8 MiB), which is always large enough
  return real(attr, stack_size < kMinThreadStackBytes ? kMinThreadStackBytes : stack_size);
}
