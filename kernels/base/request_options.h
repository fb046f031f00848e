// What steers the ops of one request (kernels/README.md, "What steers an op"): its quality
// (lossless, the default, allows only fast paths bit-identical to their eager chains; high also
// allows paths that change the numerics, such as FP8 GEMMs) and the fast-path switch. A Backend
// holds the current value only inside a RequestScope (backend.h), so an op reads what its request
// asked for and no request sees another's. Tested by tests/host/small_units_test.cc
// (RequestScopeTest) and the GPU tests that run both qualities.
#pragma once

#include <cstdint>

namespace flux2 {

// What a request trades for speed.
enum class Quality : uint8_t {
  kLossless,  // reference numerics; only fast paths proven bit-identical to their eager chain
  kHigh,      // also numerically different fast paths (FP8 GEMMs), each with a measured bound
};

struct RequestOptions {
  Quality quality = Quality::kLossless;
  // false: every fused kernel (FastPathKind::kFused) runs its eager chain instead; same results
  // by contract. Implementations such as cuDNN attention and the FP8 GEMMs are kept.
  bool fast_paths = true;

  // The same options at lossless numerics (the text encoder's, whatever the request asked).
  RequestOptions at_lossless() const { return {Quality::kLossless, fast_paths}; }
};

}  // namespace flux2
