// Raw gRPC message bytes; see raw_messages.h. Tested by tests/server/malformed_request_test.cc.
#include "server/grpc/raw_messages.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "model/tokenizer_utf8.h"
#include "server/serving/field_violations.h"

namespace flux2::server {

namespace pb = google::protobuf;

std::string invalid_utf8_field(const pb::Descriptor& descriptor, const std::string& bytes) {
  pb::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return "";
  std::map<int, int> seen;  // occurrences per field number: the index of a repeated field
  for (int i = 0; i < fields.field_count(); ++i) {
    const pb::UnknownField& field = fields.field(i);
    const int index = seen[field.number()]++;
    if (field.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const pb::FieldDescriptor* known = descriptor.FindFieldByNumber(field.number());
    if (known == nullptr) continue;
    const std::string name =
        known->is_repeated() ? absl::StrCat(known->name(), "[", index, "]") : known->name();
    if (known->type() == pb::FieldDescriptor::TYPE_STRING) {
      if (utf8_replace_invalid(field.length_delimited()) != field.length_delimited()) return name;
    } else if (known->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      const std::string inner =
          invalid_utf8_field(*known->message_type(), field.length_delimited());
      if (!inner.empty()) return absl::StrCat(name, ".", inner);
    }
  }
  return "";
}

absl::Status parse_message(const grpc::ByteBuffer& buffer, pb::Message* message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Valid() && !buffer.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("the request could not be read");
  }
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (message->ParseFromString(bytes)) return absl::OkStatus();
  const std::string field = invalid_utf8_field(*message->GetDescriptor(), bytes);
  if (!field.empty()) {
    return invalid_argument_status(
        {{field, "is not valid UTF-8 (the request could not be parsed)"}});
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request could not be parsed: its ", bytes.size(), " bytes are not a ",
                   message->GetDescriptor()->full_name(), " (truncated or not protobuf)"));
}

absl::Status serialize_message(const pb::Message& message, grpc::ByteBuffer* buffer) {
  bool own_buffer = false;  // gRPC's own serializer: zero-copy slices for large messages
  buffer->Clear();          // which writes into an empty buffer only
  const grpc::Status status =
      grpc::SerializationTraits<pb::Message>::Serialize(message, buffer, &own_buffer);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot serialize the ",
                                            message.GetDescriptor()->full_name(), ": ",
                                            status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace flux2::server
