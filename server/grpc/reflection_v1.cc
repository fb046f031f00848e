// grpc.reflection.v1 over the generated descriptor pool; see reflection_v1.h.
// Tested by tests/server/server_test.cc (ReflectionV1*) and tests/server/e2e_test.cc.
#include "server/grpc/reflection_v1.h"

#include <set>
#include <utility>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace flux2::server {
namespace {

namespace rv1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

void set_error(rv1::ServerReflectionResponse* response, grpc::StatusCode code,
               const std::string& message) {
  rv1::ErrorResponse* error = response->mutable_error_response();
  error->set_error_code(static_cast<int>(code));
  error->set_error_message(message);
}

// `file` (always: the client asked for it), then its transitive dependencies not yet sent on this
// stream (`sent` remembers them; clients cache what they received, as the protocol expects).
void add_file(const FileDescriptor* file, std::set<std::string>* sent,
              rv1::FileDescriptorResponse* out, bool requested = true) {
  if (!sent->insert(file->name()).second && !requested) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i)
    add_file(file->dependency(i), sent, out, /*requested=*/false);
}

}  // namespace

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* /*context*/,
    grpc::ServerReaderWriter<rv1::ServerReflectionResponse, rv1::ServerReflectionRequest>* stream) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<std::string> sent;  // files already sent on this stream
  rv1::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    rv1::ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case rv1::ServerReflectionRequest::kListServices:
        for (const std::string& name : services_)
          response.mutable_list_services_response()->add_service()->set_name(name);
        break;
      case rv1::ServerReflectionRequest::kFileByFilename: {
        const FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
        if (file == nullptr) {
          set_error(&response, grpc::StatusCode::NOT_FOUND, "file not found");
        } else {
          add_file(file, &sent, response.mutable_file_descriptor_response());
        }
        break;
      }
      case rv1::ServerReflectionRequest::kFileContainingSymbol: {
        const FileDescriptor* file =
            pool->FindFileContainingSymbol(request.file_containing_symbol());
        if (file == nullptr) {
          set_error(&response, grpc::StatusCode::NOT_FOUND, "symbol not found");
        } else {
          add_file(file, &sent, response.mutable_file_descriptor_response());
        }
        break;
      }
      case rv1::ServerReflectionRequest::kFileContainingExtension: {
        const rv1::ExtensionRequest& ext = request.file_containing_extension();
        const google::protobuf::Descriptor* type =
            pool->FindMessageTypeByName(ext.containing_type());
        const google::protobuf::FieldDescriptor* field =
            type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
        if (field == nullptr) {
          set_error(&response, grpc::StatusCode::NOT_FOUND, "extension not found");
        } else {
          add_file(field->file(), &sent, response.mutable_file_descriptor_response());
        }
        break;
      }
      case rv1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const google::protobuf::Descriptor* type =
            pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          set_error(&response, grpc::StatusCode::NOT_FOUND, "type not found");
        } else {
          std::vector<const google::protobuf::FieldDescriptor*> extensions;
          pool->FindAllExtensions(type, &extensions);
          rv1::ExtensionNumberResponse* out = response.mutable_all_extension_numbers_response();
          out->set_base_type_name(type->full_name());
          for (const auto* field : extensions) out->add_extension_number(field->number());
        }
        break;
      }
      case rv1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        set_error(&response, grpc::StatusCode::UNIMPLEMENTED, "empty or unknown request");
        break;
    }
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

}  // namespace flux2::server
