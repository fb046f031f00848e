// gRPC messages read from and written to raw bytes, so a request that does not parse gets a clear
// INVALID_ARGUMENT (naming the string field that is not valid UTF-8, or saying the bytes are not
// the message) that is logged and counted like every other request, instead of gRPC's own empty
// UNIMPLEMENTED. Tested by tests/server/malformed_request_test.cc.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace flux2::server {

// Parses `buffer` into `message`. On failure: InvalidArgument with a google.rpc.BadRequest field
// violation for the first string field (depth first, repeated fields indexed: "prompt",
// "reference_images[1].mime_type") whose bytes are not valid UTF-8, else a message saying the bytes
// are not a <full message name> (truncated or not protobuf).
absl::Status parse_message(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The first string field of `bytes` (a serialized `descriptor` message) that is not valid UTF-8,
// as parse_message names it; "" when there is none or the bytes are not protobuf at all.
std::string invalid_utf8_field(const google::protobuf::Descriptor& descriptor,
                               const std::string& bytes);

// Serializes `message` into `buffer` (replacing its contents).
absl::Status serialize_message(const google::protobuf::Message& message, grpc::ByteBuffer* buffer);

}  // namespace flux2::server
