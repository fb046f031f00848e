// libFuzzer target: a request from raw bytes as the server meets it: a GenerateImageRequest parsed
// from protobuf bytes (the invalid-UTF-8 field finder when parsing fails), converted and validated
// against the default limits (reference images decoded); and the same bytes as the HTTP API's
// /v1/images/generations JSON body. Run by tests/fuzz/run_fuzzers.sh (seeds: corpus/request).
#include "flux2/v1/image_generation.pb.h"
#include "server/grpc/raw_messages.h"
#include "server/grpc/request_conversion.h"
#include "server/http/openai_images.h"
#include "server/serving/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flux2::v1::GenerateImageRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) {
    flux2::server::Limits limits;
    limits.quality_high_enabled = true;
    absl::StatusOr<flux2::server::GenerateRequest> converted =
        flux2::server::request_from_proto(request);
    if (converted.ok()) (void)flux2::server::validate(*converted, limits, /*random_seed=*/7);
  } else {
    (void)flux2::server::invalid_utf8_field(*flux2::v1::GenerateImageRequest::descriptor(),
                                            std::string(reinterpret_cast<const char*>(data), size));
  }
  (void)flux2::server::parse_generations_body(
      absl::string_view(reinterpret_cast<const char*>(data), size), "tiny-klein");
  return 0;
}
