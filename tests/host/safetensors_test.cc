// Safetensors reader on valid and corrupt files: every rejection names the file and the tensor.
#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) { return dir_.path() + "/" + name; }
  absl::Status open_error(const std::string& file) {
    auto opened = SafetensorsFile::open(file);
    return opened.ok() ? absl::OkStatus() : opened.status();
  }
  TempDir dir_;
};

TEST_F(SafetensorsTest, ReadsValidFile) {
  const std::string file = path("ok.safetensors");
  testing::write_safetensors(file, {{"a", testing::f32_tensor({2, 2}, {1, 2, 3, 4})},
                                    {"b", testing::f32_tensor({3}, {5, 6, 7})}});
  auto opened = SafetensorsFile::open(file);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ((*opened)->entries().size(), 2u);
  const SafetensorsEntry* b = (*opened)->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (Shape{3}));
  auto values = read_f32(**opened, "b");
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{5, 6, 7}));
  EXPECT_EQ((*opened)->find("missing"), nullptr);
}

TEST_F(SafetensorsTest, ReadsMetadata) {
  const std::string file = path("meta.safetensors");
  testing::write_raw_safetensors(
      file,
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      std::vector<uint8_t>(4, 0));
  auto opened = SafetensorsFile::open(file);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, ReadsBytesHeldInMemory) {
  const std::string file = path("memory.safetensors");
  testing::write_safetensors(file, {{"a", testing::f32_tensor({2}, {1.5f, -2})}});
  std::FILE* f = std::fopen(file.c_str(), "rb");
  std::vector<uint8_t> bytes(4096);
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  auto parsed = SafetensorsFile::from_bytes(bytes, "adapter");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto values = read_f32(**parsed, "a");
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{1.5f, -2}));
  // Errors start with the label, or with the problem itself when the label is empty.
  bytes[0] = 0xff;
  EXPECT_THAT(std::string(SafetensorsFile::from_bytes(bytes, "adapter").status().message()),
              ::testing::StartsWith("adapter: header length "));
  EXPECT_THAT(std::string(SafetensorsFile::from_bytes(bytes, "").status().message()),
              ::testing::StartsWith("header length "));
}

TEST_F(SafetensorsTest, RejectsTooShortFile) {
  const std::string file = path("short.safetensors");
  std::FILE* f = std::fopen(file.c_str(), "wb");
  std::fputs("abc", f);
  std::fclose(f);
  EXPECT_THAT(open_error(file).message(), HasSubstr("too short"));
  EXPECT_THAT(open_error(file).message(), HasSubstr(file));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEnd) {
  const std::string file = path("bad_length.safetensors");
  testing::write_raw_safetensors(file, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                 std::vector<uint8_t>(4, 0), /*declared_header_length=*/1 << 20);
  const absl::Status status = open_error(file);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("header length"));
  EXPECT_THAT(status.message(), HasSubstr(file));
}

TEST_F(SafetensorsTest, RejectsHugeHeaderLength) {
  const std::string file = path("huge_length.safetensors");
  testing::write_raw_safetensors(file, "{}", {}, /*declared_header_length=*/int64_t{1} << 62);
  EXPECT_THAT(open_error(file).message(), HasSubstr("header length"));
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  const std::string file = path("bad_json.safetensors");
  testing::write_raw_safetensors(file, R"({"x": {"dtype": )", {});
  EXPECT_THAT(open_error(file).message(), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsTest, RejectsOffsetsPastEnd) {
  const std::string file = path("past_end.safetensors");
  testing::write_raw_safetensors(file, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                 std::vector<uint8_t>(8, 0));
  const absl::Status status = open_error(file);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"w\""));
  EXPECT_THAT(status.message(), HasSubstr("outside the data section"));
}

TEST_F(SafetensorsTest, RejectsReversedOffsets) {
  const std::string file = path("reversed.safetensors");
  testing::write_raw_safetensors(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                                 std::vector<uint8_t>(8, 0));
  EXPECT_THAT(open_error(file).message(), HasSubstr("tensor \"w\""));
}

TEST_F(SafetensorsTest, RejectsOverlappingSpans) {
  const std::string file = path("overlap.safetensors");
  testing::write_raw_safetensors(file,
                                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 std::vector<uint8_t>(12, 0));
  const absl::Status status = open_error(file);
  EXPECT_THAT(status.message(), HasSubstr("overlap"));
  EXPECT_THAT(status.message(), HasSubstr("\"b\""));
  EXPECT_THAT(status.message(), HasSubstr("\"a\""));
}

TEST_F(SafetensorsTest, RejectsOverlapHiddenBehindEmptyTensor) {
  const std::string file = path("overlap_empty.safetensors");
  testing::write_raw_safetensors(file,
                                 R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                                 R"("c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                                 std::vector<uint8_t>(16, 0));
  EXPECT_THAT(open_error(file).message(), HasSubstr("overlap"));
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  const std::string file = path("dtype.safetensors");
  testing::write_raw_safetensors(file, R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})",
                                 std::vector<uint8_t>(1, 0));
  const absl::Status status = open_error(file);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"w\""));
  EXPECT_THAT(status.message(), HasSubstr("Q4_K"));
}

TEST_F(SafetensorsTest, AcceptsEveryKnownDtype) {
  const std::string file = path("dtypes.safetensors");
  testing::write_raw_safetensors(file,
                                 R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]},)"
                                 R"("c":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[8,12]},)"
                                 R"("d":{"dtype":"I64","shape":[1],"data_offsets":[12,20]},)"
                                 R"("e":{"dtype":"U8","shape":[4],"data_offsets":[20,24]}})",
                                 std::vector<uint8_t>(24, 0));
  auto opened = SafetensorsFile::open(file);
  EXPECT_TRUE(opened.ok()) << opened.status();
}

TEST_F(SafetensorsTest, RejectsShapeByteMismatch) {
  const std::string file = path("mismatch.safetensors");
  testing::write_raw_safetensors(file,
                                 R"({"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}})",
                                 std::vector<uint8_t>(16, 0));
  const absl::Status status = open_error(file);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"w\""));
  EXPECT_THAT(status.message(), HasSubstr("needs 18 bytes"));
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  const std::string file = path("dup.safetensors");
  testing::write_raw_safetensors(file,
                                 R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                 std::vector<uint8_t>(8, 0));
  const absl::Status status = open_error(file);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"w\""));
  EXPECT_THAT(status.message(), HasSubstr("more than once"));
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  const std::string file = path("negative.safetensors");
  testing::write_raw_safetensors(file, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                 std::vector<uint8_t>(4, 0));
  EXPECT_THAT(open_error(file).message(), HasSubstr("bad shape"));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(open_error(path("nope.safetensors")).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace flux2
