// Request bodies that do not parse, sent as raw bytes (grpc::GenericStub) to every RPC of the whole
// Server in process (fake engine): garbage, a truncated message and a string field that is not
// valid UTF-8 each get INVALID_ARGUMENT saying the request could not be parsed (the UTF-8 one
// naming the field in google.rpc.BadRequest), are logged and counted like every other request,
// and the server keeps serving. Also the field naming itself, nested and repeated.
// Run: build/bin/server_unit_tests --gtest_filter='MalformedRequestTest*'
#include <future>
#include <string>

#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/grpc/raw_messages.h"
#include "tests/server/server_fixture.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;
using testing::bad_request_fields;
using testing::metric_value;
using testing::small_request;
using testing::UnaryCall;

// A length-delimited field (wire type 2) of `number` holding `bytes`, as protobuf encodes it.
std::string length_delimited(int number, const std::string& bytes) {
  std::string out;
  auto varint = [&out](uint64_t value) {
    while (value >= 0x80) {
      out += static_cast<char>((value & 0x7f) | 0x80);
      value >>= 7;
    }
    out += static_cast<char>(value);
  };
  varint((static_cast<uint64_t>(number) << 3) | 2);
  varint(bytes.size());
  return out + bytes;
}

int field_number(const google::protobuf::Descriptor& message, const char* name) {
  return message.FindFieldByName(name)->number();
}

class MalformedRequestTest : public testing::FakeServerTest {
 protected:
  void SetUp() override {
    FakeServerTest::SetUp();
    start();
  }

  // Sends `bytes` as the request of `method` and returns the call's status.
  grpc::Status call_raw(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/flux2.v1.ImageGeneration/" + method, grpc::StubOptions(), &request,
                   &response, [&done](grpc::Status status) { done.set_value(status); });
    return done.get_future().get();
  }

  double requests(const std::string& method, const std::string& code) {
    return metric_value(server_->metrics().render(), "flux2_requests_total",
                        {{"method", method}, {"code", code}})
        .value_or(0.0);
  }
};

TEST_F(MalformedRequestTest, EveryRpcRefusesUnparsableBytesClearlyAndKeepsServing) {
  const google::protobuf::Descriptor& request = *v1::GenerateImageRequest::descriptor();
  std::string valid;
  ASSERT_TRUE(small_request(1).SerializeToString(&valid));
  const std::string garbage = "\xff\xff\xff\xff\x0f not a protobuf";
  // Cut inside the prompt's bytes: its length says 9, 3 follow.
  const std::string truncated =
      length_delimited(field_number(request, "prompt"), "a red fox").substr(0, 5);
  const std::string bad_prompt =
      length_delimited(field_number(request, "prompt"), "a \xc3\x28 fox");  // invalid UTF-8
  ::testing::internal::CaptureStderr();
  for (const char* method : {"GenerateImage", "GenerateImageStream"}) {
    for (const std::string& bytes : {garbage, truncated}) {
      const grpc::Status status = call_raw(method, bytes);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      EXPECT_NE(status.error_message().find("the request could not be parsed"), std::string::npos)
          << method << ": " << status.error_message();
      EXPECT_NE(status.error_message().find("flux2.v1.GenerateImageRequest"), std::string::npos)
          << status.error_message();
    }
    const grpc::Status status = call_raw(method, bad_prompt);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(bad_request_fields(status), std::vector<std::string>{"prompt"})
        << status.error_message();
    EXPECT_NE(status.error_message().find("UTF-8"), std::string::npos) << status.error_message();
    EXPECT_EQ(requests(method, "INVALID_ARGUMENT"), 3.0) << method;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("GenerateImage request_id=- code=INVALID_ARGUMENT"), std::string::npos) << log;
  EXPECT_NE(log.find("GenerateImageStream request_id=- code=INVALID_ARGUMENT"), std::string::npos)
      << log;
  const grpc::Status info = call_raw("GetModelInfo", garbage);
  EXPECT_EQ(info.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << info.error_message();
  EXPECT_EQ(requests("GetModelInfo", "INVALID_ARGUMENT"), 1.0);
  // A well-formed request still works, raw and through the generated stub.
  EXPECT_TRUE(call_raw("GenerateImage", valid).ok());
  EXPECT_TRUE(call_raw("GetModelInfo", "").ok());
  std::unique_ptr<v1::ImageGeneration::Stub> stub = v1::ImageGeneration::NewStub(channel_);
  UnaryCall typed(stub.get(), small_request(2));
  EXPECT_TRUE(typed.finish().ok());
  EXPECT_EQ(requests("GenerateImage", "OK"), 2.0);
}

// The field named is the first string that is not valid UTF-8, depth first, with the index of a
// repeated field; valid strings and bytes fields (any bytes) are not named.
TEST(RawMessagesTest, NamesTheFirstInvalidUtf8StringNestedAndRepeated) {
  const google::protobuf::Descriptor& response = *v1::GenerateImageResponse::descriptor();
  const google::protobuf::Descriptor& image = *v1::Image::descriptor();
  const int images = field_number(response, "images");
  const int data = field_number(image, "data"), mime = field_number(image, "mime_type");
  const std::string good = length_delimited(data, "\xff\xfe") + length_delimited(mime, "image/png");
  const std::string bad = length_delimited(mime, "image/\xe2\x82");
  const std::string message = length_delimited(images, good) + length_delimited(images, bad);
  EXPECT_EQ(invalid_utf8_field(response, message), "images[1].mime_type");
  EXPECT_EQ(invalid_utf8_field(response, length_delimited(images, good)), "");
  EXPECT_EQ(invalid_utf8_field(response, "\xff\xff\xff"), "");  // not protobuf at all
}

}  // namespace
}  // namespace flux2::server
